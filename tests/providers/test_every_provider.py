"""Every registered provider, end to end through `ProviderRouter`, against its fake server.

Issue 4's "Done when": each provider in `providers.registry.provider_names()` (a new one is
covered automatically, and fails here until its wire API has a fake) streams text,
reasoning and tool-call turns, streamed and not, over real HTTP on loopback, with usage
in non-overlapping buckets, and every request body it sent is checked by the fake (which
answers an invalid one with the API's 400) and by the validator of tests/fakes/validate.py
built from the official SDK types (botocore's service model for Bedrock).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from providers import ProviderRouter
from providers.outbound import OutboundPolicy
from providers.registry import (
    ANTHROPIC_MESSAGES,
    BEDROCK_CONVERSE,
    GEMINI,
    OPENAI_COMPLETIONS,
    OPENAI_RESPONSES,
    ProviderDescriptor,
    get_descriptor,
    provider_names,
)
from providers.types import AssistantTurn, ModelCapabilities, StreamChunk, TokenUsage
from tests.fakes import script as fake
from tests.fakes.anthropic_messages import AnthropicMessagesFake
from tests.fakes.bedrock import (
    DEFAULT_ACCESS_KEY_ID,
    DEFAULT_REGION,
    DEFAULT_SECRET_ACCESS_KEY,
    BedrockFake,
    validate_converse_request,
)
from tests.fakes.gemini import GeminiFake
from tests.fakes.mistral import MistralFake
from tests.fakes.openai_chat import OpenAIChatFake
from tests.fakes.openai_responses import OpenAIResponsesFake
from tests.fakes.server import FakeServer
from tests.fakes.validate import (
    validate_anthropic_request,
    validate_gemini_request,
    validate_openai_chat_request,
    validate_openai_responses_request,
)

KEY = "test-key"
# A fake per wire API: a provider whose API is missing here fails
# `test_every_registered_provider_has_a_fake`.
FAKE_FOR_API: dict[str, type[FakeServer]] = {
    OPENAI_COMPLETIONS: OpenAIChatFake,
    OPENAI_RESPONSES: OpenAIResponsesFake,
    ANTHROPIC_MESSAGES: AnthropicMessagesFake,
    GEMINI: GeminiFake,
    BEDROCK_CONVERSE: BedrockFake,
}
# The model each API is asked for, and how its (curated) capabilities declare thinking.
MODEL_FOR_API = {
    OPENAI_COMPLETIONS: "vendor-model-1",
    OPENAI_RESPONSES: "gpt-5",
    ANTHROPIC_MESSAGES: "claude-sonnet-4-5",
    GEMINI: "gemini-2.5-flash",
    BEDROCK_CONVERSE: "anthropic.claude-sonnet-4-5-v1:0",
}
THINKING_FOR_API = {
    OPENAI_COMPLETIONS: "effort",
    OPENAI_RESPONSES: "effort",
    ANTHROPIC_MESSAGES: "budget",
    GEMINI: "budget",
    BEDROCK_CONVERSE: "budget",
}
# The finish reason each API reports for a turn that ends in tool calls (the turn keeps
# the API's vocabulary: Anthropic and Bedrock say "tool_use").
TOOL_FINISH_FOR_API = {
    OPENAI_COMPLETIONS: "tool_calls",
    OPENAI_RESPONSES: "tool_calls",
    ANTHROPIC_MESSAGES: "tool_use",
    GEMINI: "STOP",
    BEDROCK_CONVERSE: "tool_use",
}
TOOLS = [
    {
        "name": "weather",
        "description": "Weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    }
]
CALL_ARGUMENTS = {"city": "Bern", "days": 3, "note": 'ünïcode "quoted" {braces}'}
# Scripted usage: fresh input, output (reasoning included), cache read and write, and the
# reasoning part of the output, reported by each fake in its API's own arithmetic.
SCRIPTED_USAGE = fake.usage(input=100, output=40, cache_read=30, cache_write=20, reasoning=15)
EXPECTED_USAGE = TokenUsage(input=100, output=40, cache_read=30, cache_write=20)
# Gemini's implicit caching has no write bucket on the wire (`usageMetadata` has none).
EXPECTED_USAGE_FOR_API = {GEMINI: TokenUsage(input=100, output=40, cache_read=30)}

PROVIDERS = provider_names()


@dataclass
class Setup:
    """One provider wired to its fake: the router, the fake, and the model to ask for."""

    name: str
    descriptor: ProviderDescriptor
    server: FakeServer
    router: ProviderRouter
    model: str

    @property
    def api(self) -> str:
        return self.descriptor.api

    def body(self, index: int = -1) -> dict[str, Any]:
        return self.server.requests[index].body

    def headers(self, index: int = -1) -> dict[str, str]:
        return self.server.requests[index].headers


def _server(descriptor: ProviderDescriptor, **options: Any) -> FakeServer:
    fake_class = FAKE_FOR_API[descriptor.api]
    if descriptor.name == "mistral":
        fake_class = MistralFake
    api_key = KEY if descriptor.requires_key else None
    if issubclass(fake_class, OpenAIChatFake):
        options["reasoning_field"] = descriptor.compat.reasoning_field or "reasoning_content"
    return fake_class(api_key=api_key, **options)


def _profile(descriptor: ProviderDescriptor, server: FakeServer, *, sigv4: bool) -> dict:
    """The SecretStore profile pointing `descriptor`'s provider at `server`."""
    if descriptor.api == BEDROCK_CONVERSE:
        profile: dict[str, Any] = {"base_url": server.base_url, "region": DEFAULT_REGION}
        if sigv4:
            profile.update(
                access_key_id=DEFAULT_ACCESS_KEY_ID, secret_access_key=DEFAULT_SECRET_ACCESS_KEY
            )
        else:
            profile["api_key"] = KEY
        return profile
    base_url = server.root_url if descriptor.api == ANTHROPIC_MESSAGES else server.base_url
    profile = {"base_url": base_url}
    if descriptor.requires_key:
        profile["api_key"] = KEY
    return profile


@pytest.fixture(params=PROVIDERS)
def setup(request: pytest.FixtureRequest) -> Iterator[Setup]:
    yield from _setup(request.param)


@pytest.fixture
def bedrock_bearer() -> Iterator[Setup]:
    yield from _setup("bedrock", sigv4=False)


def _setup(name: str, *, sigv4: bool = True) -> Iterator[Setup]:
    descriptor = get_descriptor(name)
    assert descriptor is not None
    model = MODEL_FOR_API[descriptor.api]
    caps = ModelCapabilities(
        tools=True, reasoning=True, thinking=THINKING_FOR_API[descriptor.api], curated=True
    )
    with _server(descriptor) as server:
        router = ProviderRouter(
            {f"provider:{name}": _profile(descriptor, server, sigv4=sigv4)},
            matrix={f"{name}:{model}": caps},
            outbound=OutboundPolicy(allow_loopback=True),
        )
        try:
            yield Setup(name, descriptor, server, router, f"{name}:{model}")
        finally:
            router.close()


# --- helpers --------------------------------------------------------------------------


def _run(
    s: Setup, messages: list[dict], *, stream: bool, **settings: Any
) -> tuple[AssistantTurn, list[StreamChunk]]:
    """One call through the router: the turn, and the chunks when streamed."""
    if not stream:
        return s.router.complete(model=s.model, messages=messages, tools=TOOLS, **settings), []
    chunks = list(s.router.stream(model=s.model, messages=messages, tools=TOOLS, **settings))
    assert chunks[-1].turn is not None
    assert all(chunk.turn is None for chunk in chunks[:-1])
    return chunks[-1].turn, chunks


def assert_valid_request(s: Setup, body: dict[str, Any]) -> None:
    """The body the provider received, checked by the validator built from its SDK."""
    if s.api == OPENAI_COMPLETIONS:
        body = copy.deepcopy(body)
        compat = s.descriptor.compat
        for message in body["messages"]:
            # Vendor extensions the `openai` SDK types do not know: DeepSeek's thinking-mode
            # `reasoning_content` on assistant messages, Mistral's `name` on tool results.
            if compat.replay_reasoning_content and message["role"] == "assistant":
                message.pop("reasoning_content", None)
            if compat.tool_result_name and message["role"] == "tool":
                assert message.pop("name") == "weather"
        # OpenRouter's `reasoning` object is its own top-level extension.
        extra = ["reasoning"] if s.descriptor.compat.reasoning_effort_param == "reasoning" else []
        validate_openai_chat_request(body, extra_fields=extra)
    elif s.api == OPENAI_RESPONSES:
        validate_openai_responses_request(body)
    elif s.api == ANTHROPIC_MESSAGES:
        validate_anthropic_request(body)
    elif s.api == GEMINI:
        validate_gemini_request(body)
    elif s.api == BEDROCK_CONVERSE:
        model_id = s.model.split(":", 1)[1]
        stream = s.server.last_request.path.endswith("converse-stream")
        assert validate_converse_request(body, model_id, stream=stream) is None
    else:  # pragma: no cover - FAKE_FOR_API and this function grow together
        raise AssertionError(f"no validator for {s.api}")


def _streamed_text(chunks: list[StreamChunk]) -> str:
    return "".join(chunk.text or "" for chunk in chunks)


def _streamed_reasoning(chunks: list[StreamChunk]) -> str:
    return "".join(chunk.reasoning or "" for chunk in chunks)


def _assembled_calls(chunks: list[StreamChunk]) -> dict[int, dict[str, Any]]:
    """Tool calls put together from their streamed deltas alone, by index."""
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        delta = chunk.tool_call_delta
        if delta is None:
            continue
        call = calls.setdefault(delta["index"], {"id": None, "name": None, "arguments": ""})
        call["id"] = call["id"] or delta.get("id")
        call["name"] = call["name"] or delta.get("name")
        call["arguments"] += delta.get("arguments") or ""
    return calls


def _message(turn: AssistantTurn) -> dict[str, Any]:
    """The canonical assistant message the engine persists for a turn."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.text}
    if turn.reasoning:
        message["reasoning"] = turn.reasoning
    if turn.extras:
        message["extras"] = turn.extras
    if turn.tool_calls:
        message["tool_calls"] = [call.to_dict() for call in turn.tool_calls]
    return message


STREAMED = pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]


# --- coverage -------------------------------------------------------------------------


def test_every_registered_provider_has_a_fake():
    missing = [name for name in provider_names() if get_descriptor(name).api not in FAKE_FOR_API]
    assert not missing, f"no fake server for the wire API of: {', '.join(missing)}"


def test_the_issue_names_are_all_registered():
    named = {"openai", "anthropic", "ollama", "deepseek", "together", "groq", "openrouter"}
    named |= {"mistral", "xai", "gemini", "bedrock"}
    assert named <= set(provider_names())


# --- turns ----------------------------------------------------------------------------


@STREAMED
def test_a_text_turn(setup: Setup, stream: bool):
    setup.server.push(fake.Reply(fake.text("Hello there, how can I help?")))

    turn, chunks = _run(setup, USER, stream=stream)

    assert turn.text == "Hello there, how can I help?"
    assert turn.tool_calls == []
    if stream:
        assert _streamed_text(chunks) == turn.text
        assert len([c for c in chunks if c.text]) > 1  # real deltas, not one final blob
    assert turn.usage is not None and turn.usage.output > 0
    assert_valid_request(setup, setup.body())


@STREAMED
def test_a_reasoning_turn_with_usage_in_non_overlapping_buckets(setup: Setup, stream: bool):
    setup.server.push(
        fake.Reply(
            fake.reasoning("The user greets me; greet back."),
            fake.text("Hi!"),
            SCRIPTED_USAGE,
        )
    )

    turn, chunks = _run(setup, USER, stream=stream, reasoning_effort="high")

    assert turn.text == "Hi!"
    assert turn.reasoning == "The user greets me; greet back."
    if stream:
        assert _streamed_reasoning(chunks) == turn.reasoning
        assert _streamed_text(chunks) == "Hi!"
    expected = EXPECTED_USAGE_FOR_API.get(setup.api, EXPECTED_USAGE)
    assert turn.usage == expected
    # Reasoning is inside `output` once, never added on top; the prompt side is the sum.
    assert turn.usage.output == 40
    assert turn.usage.context_tokens == expected.input + expected.cache_read + (
        expected.cache_write
    )
    assert_valid_request(setup, setup.body())


@STREAMED
def test_a_tool_call_turn_and_its_result(setup: Setup, stream: bool):
    setup.server.push(
        fake.Reply(fake.text("Checking."), fake.tool_call("weather", CALL_ARGUMENTS)),
        fake.Reply(fake.text("Sunny in Bern.")),
    )
    history = [{"role": "user", "content": "Weather in Bern?"}]

    turn, chunks = _run(setup, history, stream=stream)

    assert [(c.name, c.arguments, c.error) for c in turn.tool_calls] == [
        ("weather", CALL_ARGUMENTS, None)
    ]
    assert turn.tool_calls[0].id
    assert turn.finish_reason == TOOL_FINISH_FOR_API[setup.api]
    if stream:
        (assembled,) = _assembled_calls(chunks).values()
        assert assembled["name"] == "weather" and assembled["id"] == turn.tool_calls[0].id
        assert json.loads(assembled["arguments"]) == CALL_ARGUMENTS
    assert_valid_request(setup, setup.body())

    history += [
        _message(turn),
        {"role": "tool", "tool_call_id": turn.tool_calls[0].id, "content": "sunny, 21°C"},
    ]
    final, _ = _run(setup, history, stream=stream)

    assert final.text == "Sunny in Bern."
    assert "sunny, 21°C" in json.dumps(setup.body(), ensure_ascii=False)
    assert_valid_request(setup, setup.body())


# --- credentials ----------------------------------------------------------------------


def test_each_provider_authenticates_the_way_its_api_does(setup: Setup):
    setup.server.push(fake.Reply(fake.text("ok")))

    _run(setup, USER, stream=True)

    headers = setup.headers()
    auth = setup.descriptor.auth
    if not setup.descriptor.requires_key:
        assert "authorization" not in headers  # Ollama: no key, no header
    elif auth == "bearer":
        assert headers["authorization"] == f"Bearer {KEY}"
    elif auth == "x-api-key":
        assert headers["x-api-key"] == KEY
    elif auth == "x-goog-api-key":
        assert headers["x-goog-api-key"] == KEY and "key=" not in setup.server.last_request.path
    elif auth == "sigv4":
        assert headers["authorization"].startswith("AWS4-HMAC-SHA256 ")
    else:  # pragma: no cover
        raise AssertionError(f"untested auth style {auth}")


@STREAMED
def test_bedrock_also_takes_an_api_key_as_a_bearer_token(bedrock_bearer: Setup, stream: bool):
    bedrock_bearer.server.push(
        fake.Reply(fake.reasoning("Quick."), fake.tool_call("weather", CALL_ARGUMENTS))
    )

    turn, _ = _run(bedrock_bearer, USER, stream=stream, reasoning_effort="low")

    assert bedrock_bearer.headers()["authorization"] == f"Bearer {KEY}"
    assert turn.reasoning == "Quick." and turn.tool_calls[0].arguments == CALL_ARGUMENTS
    assert_valid_request(bedrock_bearer, bedrock_bearer.body())
