"""Pytest fixtures for the fakes. Make them visible from a conftest with

from tests.fakes.fixtures import anthropic_fake, openai_fake  # noqa: F401
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .anthropic_messages import AnthropicMessagesFake
from .openai_chat import OpenAIChatFake

FAKE_KEY = "test-key"


@pytest.fixture
def openai_fake() -> Iterator[OpenAIChatFake]:
    """A fresh OpenAI-compatible fake expecting `Bearer test-key`."""
    with OpenAIChatFake(api_key=FAKE_KEY) as fake:
        yield fake


@pytest.fixture
def anthropic_fake() -> Iterator[AnthropicMessagesFake]:
    """A fresh Anthropic fake expecting the key `test-key`."""
    with AnthropicMessagesFake(api_key=FAKE_KEY) as fake:
        yield fake
