"""Local fake LLM provider servers that speak the real wire protocols.

    with OpenAIChatFake() as fake:
        fake.push(Reply(text("Hello "), tool_call("search", {"q": "x"})))
        client = openai.OpenAI(base_url=fake.base_url, api_key=fake.api_key)

Run one beside other processes with `python -m tests.fakes --provider openai --port 0`
(it prints its base URL as the first line of stdout).
"""

from __future__ import annotations

from .anthropic_messages import AnthropicMessagesFake
from .bedrock import BedrockFake
from .gemini import GeminiFake
from .mistral import MistralFake
from .openai_chat import OpenAIChatFake
from .openai_responses import OpenAIResponsesFake
from .script import (
    Reply,
    Script,
    context_too_long,
    drip,
    error_event,
    http_error,
    model_not_found,
    overloaded,
    pause,
    quota_exceeded,
    rate_limited,
    reasoning,
    redacted_thinking,
    reset,
    text,
    tool_call,
    truncate,
    usage,
    wire_block,
    wire_event,
)
from .server import Disconnect, FakeServer, RecordedRequest

FAKES: dict[str, type[FakeServer]] = {
    "openai": OpenAIChatFake,
    "anthropic": AnthropicMessagesFake,
    "bedrock": BedrockFake,
    "openai-responses": OpenAIResponsesFake,
    "gemini": GeminiFake,
    "mistral": MistralFake,
}

__all__ = [
    "FAKES",
    "AnthropicMessagesFake",
    "BedrockFake",
    "Disconnect",
    "FakeServer",
    "GeminiFake",
    "MistralFake",
    "OpenAIChatFake",
    "OpenAIResponsesFake",
    "RecordedRequest",
    "Reply",
    "Script",
    "context_too_long",
    "drip",
    "error_event",
    "http_error",
    "model_not_found",
    "overloaded",
    "pause",
    "quota_exceeded",
    "rate_limited",
    "reasoning",
    "redacted_thinking",
    "reset",
    "text",
    "tool_call",
    "truncate",
    "usage",
    "wire_block",
    "wire_event",
]
