"""A five-hop handoff: anthropic → openai (Responses) → gemini → bedrock → deepseek.

Issue 4's "Done when": one scripted conversation switches model at every step, each model
reasoning and calling a tool, the canonical history growing as the engine persists it
(assistant messages with tool_calls, reasoning and extras; tool results). Every request is
checked twice: by the fake, which answers what the real API refuses with its 400
(unanswered calls, bad ids, signatures that are foreign, edited or missing, DeepSeek's
missing `reasoning_content`), and by the SDK / botocore validator on the recorded body.
Each provider's sidecar goes back only to itself, and no model's reasoning reaches
another provider. The same-model continuations replay signatures, encrypted reasoning and
DeepSeek's `reasoning_content` intact.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from providers import ProviderRouter
from providers.outbound import OutboundPolicy
from providers.types import AssistantTurn, ModelCapabilities
from providers.wire.openai_completions import REASONING_CONTENT_PLACEHOLDER
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
TOOLS = [
    {
        "name": "weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


@dataclass(frozen=True)
class Hop:
    provider: str
    model: str  # the bare model
    caps: ModelCapabilities
    city: str

    @property
    def full(self) -> str:
        return f"{self.provider}:{self.model}"

    @property
    def thought(self) -> str:
        return f"{self.provider} reasons that {self.city} comes next."


def _caps(thinking: str | None) -> ModelCapabilities:
    return ModelCapabilities(tools=True, reasoning=True, thinking=thinking, curated=True)


HOPS = [
    Hop("anthropic", "claude-sonnet-4-5", _caps("budget"), "Bern"),
    Hop("openai", "gpt-5", _caps("effort"), "Zürich"),
    Hop("gemini", "gemini-3-pro-preview", _caps("effort"), "Genève"),
    # Adaptive thinking: a budget would be refused in a tool loop another model started
    # (Anthropic's "must start with a thinking block"), which the Bedrock client does not
    # guard against yet (the Anthropic client does).
    Hop("bedrock", "anthropic.claude-opus-4-6-v1", _caps("adaptive"), "Basel"),
    Hop("deepseek", "deepseek-reasoner", _caps(None), "Lugano"),
]
BY_PROVIDER = {hop.provider: hop for hop in HOPS}


@dataclass
class World:
    servers: dict[str, FakeServer]
    router: ProviderRouter


@pytest.fixture
def world() -> Iterator[World]:
    servers: dict[str, FakeServer] = {
        "anthropic": AnthropicMessagesFake(api_key=KEY),
        "openai": OpenAIResponsesFake(api_key=KEY),
        "gemini": GeminiFake(api_key=KEY),
        "bedrock": BedrockFake(api_key=None),
        "deepseek": OpenAIChatFake(
            api_key=KEY, reasoning_field="reasoning_content", require_reasoning_content=True
        ),
    }
    for server in servers.values():
        server.start()
    secrets = {
        "provider:anthropic": {"api_key": KEY, "base_url": servers["anthropic"].root_url},
        "provider:openai": {"api_key": KEY, "base_url": servers["openai"].base_url},
        "provider:gemini": {"api_key": KEY, "base_url": servers["gemini"].base_url},
        "provider:bedrock": {
            "base_url": servers["bedrock"].base_url,
            "region": DEFAULT_REGION,
            "access_key_id": DEFAULT_ACCESS_KEY_ID,
            "secret_access_key": DEFAULT_SECRET_ACCESS_KEY,
        },
        "provider:deepseek": {"api_key": KEY, "base_url": servers["deepseek"].base_url},
    }
    router = ProviderRouter(
        secrets,
        matrix={hop.full: hop.caps for hop in HOPS},
        outbound=OutboundPolicy(allow_loopback=True),
    )
    try:
        yield World(servers, router)
    finally:
        router.close()
        for server in servers.values():
            server.stop()


# --- helpers --------------------------------------------------------------------------


def _stream(world: World, hop: Hop, history: list[dict]) -> tuple[AssistantTurn, dict]:
    """One streamed call to `hop`'s model: the turn and the body its server received."""
    chunks = list(
        world.router.stream(
            model=hop.full, messages=history, tools=TOOLS, reasoning_effort="medium"
        )
    )
    turn = chunks[-1].turn
    assert turn is not None
    return turn, world.servers[hop.provider].last_request.body


def _message(turn: AssistantTurn) -> dict[str, Any]:
    """The canonical assistant message the engine persists for a turn."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.text}
    if turn.reasoning:
        message["reasoning"] = turn.reasoning
    if turn.extras:
        message["extras"] = json.loads(json.dumps(turn.extras))  # as stored: JSON
    if turn.tool_calls:
        message["tool_calls"] = [call.to_dict() for call in turn.tool_calls]
    if turn.usage is not None:
        message["usage"] = turn.usage.to_dict()
    return message


def _results(turn: AssistantTurn, content: str) -> list[dict]:
    return [{"role": "tool", "tool_call_id": c.id, "content": content} for c in turn.tool_calls]


def assert_valid(provider: str, body: dict[str, Any], server: FakeServer) -> None:
    """The recorded body against the official SDK types (botocore for Bedrock)."""
    if provider == "anthropic":
        validate_anthropic_request(body)
    elif provider == "openai":
        validate_openai_responses_request(body)
    elif provider == "gemini":
        validate_gemini_request(body)
    elif provider == "bedrock":
        model_id = BY_PROVIDER["bedrock"].model
        stream = server.last_request.path.endswith("converse-stream")
        assert validate_converse_request(body, model_id, stream=stream) is None
    else:
        # DeepSeek's `reasoning_content` on assistant messages is its extension of the
        # Chat Completions shape; everything else must be what the `openai` SDK types.
        plain = json.loads(json.dumps(body))
        for message in plain["messages"]:
            if message["role"] == "assistant":
                assert isinstance(message.pop("reasoning_content"), str)
        validate_openai_chat_request(plain)


# Sidecar keys whose values label rather than carry (block types, part kinds, models).
SIDECAR_LABELS = frozenset({"model", "type", "kind"})


def _secrets_of(extras: dict[str, Any]) -> set[str]:
    """The distinctive strings of a sidecar (signatures, encrypted content, replayed
    reasoning, item ids): every string leaf but labels and short bookkeeping values."""
    found: set[str] = set()

    def walk(value: Any, key: str = "") -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, k)
        elif isinstance(value, list):
            for item in value:
                walk(item, key)
        elif isinstance(value, str) and key not in SIDECAR_LABELS and len(value) >= 8:
            found.add(value)

    walk(extras)
    return found


def _wire(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False)


# --- the five hops ----------------------------------------------------------------------


def test_a_conversation_hops_across_five_providers_with_valid_requests(world: World):
    history: list[dict] = [
        {"role": "system", "content": "You plan trips. Be brief."},
        {"role": "user", "content": "Weather in Bern, Zürich, Genève, Basel and Lugano?"},
    ]
    bodies: list[tuple[str, dict]] = []
    sidecars: dict[str, set[str]] = {}
    for hop in HOPS:
        world.servers[hop.provider].push(
            fake.Reply(
                fake.reasoning(hop.thought),
                fake.text(f"Checking {hop.city}."),
                fake.tool_call("weather", {"city": hop.city}),
            )
        )
        turn, body = _stream(world, hop, history)

        assert_valid(hop.provider, body, world.servers[hop.provider])
        bodies.append((hop.provider, body))
        assert turn.reasoning == hop.thought
        assert [(c.name, c.arguments) for c in turn.tool_calls] == [("weather", {"city": hop.city})]
        sidecars[hop.provider] = _secrets_of(turn.extras)
        history += [_message(turn), *_results(turn, f"{hop.city}: sunny")]

    # Every provider but Gemini keeps something to replay (Gemini 3 signs its call).
    assert all(sidecars.values()), sidecars
    # Each provider saw every earlier call answered (the fakes refuse anything else), and
    # no provider received another's sidecar or reasoning.
    for position, (provider, body) in enumerate(bodies):
        wire = _wire(body)
        for other in HOPS[:position]:
            assert other.thought not in wire, f"{other.provider}'s reasoning reached {provider}"
            leaked = [s for s in sidecars[other.provider] if s in wire]
            assert not leaked, f"{other.provider}'s sidecar reached {provider}: {leaked}"
        assert all(f"{hop.city}: sunny" in wire for hop in HOPS[:position])

    # The last hop: DeepSeek answers its own tool call, and gets its own reasoning back on
    # its own message and a placeholder (no reasoning) on every other model's.
    deepseek = BY_PROVIDER["deepseek"]
    world.servers["deepseek"].push(fake.Reply(fake.reasoning("All five known."), fake.text("Go.")))
    final, body = _stream(world, deepseek, history)

    assert final.text == "Go."
    assert_valid("deepseek", body, world.servers["deepseek"])
    replayed = [m["reasoning_content"] for m in body["messages"] if m["role"] == "assistant"]
    assert replayed == [REASONING_CONTENT_PLACEHOLDER] * 4 + [deepseek.thought]
    wire = _wire(body)
    for other in HOPS[:-1]:
        assert other.thought not in wire
        assert not [s for s in sidecars[other.provider] if s in wire]


def test_the_persisted_history_is_never_rewritten_by_a_hop(world: World):
    history: list[dict] = [{"role": "user", "content": "Weather in Bern?"}]
    anthropic, deepseek = BY_PROVIDER["anthropic"], BY_PROVIDER["deepseek"]
    world.servers["anthropic"].push(
        fake.Reply(fake.reasoning(anthropic.thought), fake.tool_call("weather", id="toolu_x"))
    )
    turn, _ = _stream(world, anthropic, history)
    history += [_message(turn), *_results(turn, "sunny")]
    before = json.loads(json.dumps(history))
    world.servers["deepseek"].push(fake.Reply(fake.text("Sunny.")))

    _stream(world, deepseek, history)

    assert history == before  # ids, extras and reasoning untouched for the next model


# --- same-model continuations -------------------------------------------------------------


def _replayed(provider: str, body: dict[str, Any]) -> Any:
    """What the second request carried back from the first turn, per API."""
    if provider == "anthropic":
        assistant = next(m for m in body["messages"] if m["role"] == "assistant")
        return [b for b in assistant["content"] if b["type"] in ("thinking", "redacted_thinking")]
    if provider == "openai":
        return [item for item in body["input"] if item.get("type") == "reasoning"]
    if provider == "gemini":
        model = next(c for c in body["contents"] if c["role"] == "model")
        return [p["thoughtSignature"] for p in model["parts"] if "thoughtSignature" in p]
    if provider == "bedrock":
        assistant = next(m for m in body["messages"] if m["role"] == "assistant")
        return [b for b in assistant["content"] if "reasoningContent" in b]
    assistant = next(m for m in body["messages"] if m["role"] == "assistant")
    return assistant["reasoning_content"]


def _kept(provider: str, extras: dict[str, Any]) -> Any:
    """The same, as the first turn kept it in its sidecar."""
    if provider == "anthropic":
        return extras["_anthropic"]["thinking"]
    if provider == "openai":
        return extras["_openai"]["items"]
    if provider == "gemini":
        return [s["signature"] for s in extras["_gemini"]["signatures"]]
    if provider == "bedrock":
        return extras["_bedrock"]["blocks"]
    return extras["_deepseek"]["reasoning_content"]


@pytest.mark.parametrize("hop", HOPS, ids=lambda hop: hop.provider)
def test_a_same_model_continuation_replays_its_reasoning_intact(world: World, hop: Hop):
    server = world.servers[hop.provider]
    server.push(
        fake.Reply(fake.reasoning(hop.thought), fake.tool_call("weather", {"city": hop.city})),
        fake.Reply(fake.reasoning("Now answer."), fake.text(f"{hop.city} is sunny.")),
    )
    history: list[dict] = [{"role": "user", "content": f"Weather in {hop.city}?"}]
    first, _ = _stream(world, hop, history)
    history += [_message(first), *_results(first, "sunny")]

    second, body = _stream(world, hop, history)

    assert second.text == f"{hop.city} is sunny."
    assert_valid(hop.provider, body, server)
    kept = _kept(hop.provider, history[1]["extras"])
    assert kept and _replayed(hop.provider, body) == kept


# --- DeepSeek's rule, both ways -----------------------------------------------------------


def test_the_deepseek_fake_refuses_a_tool_loop_without_reasoning_content():
    body = {
        "model": "deepseek-reasoner",
        "messages": [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
    }
    strict = OpenAIChatFake(require_reasoning_content=True)

    problem = strict.check_request(body)

    assert problem is not None and "message index 1" in problem["error"]["message"]
    body["messages"][1]["reasoning_content"] = REASONING_CONTENT_PLACEHOLDER
    assert strict.check_request(body) is None


def test_a_deepseek_model_not_known_to_reason_gets_no_reasoning_content(world: World):
    history: list[dict] = [{"role": "user", "content": "Weather in Bern?"}]
    anthropic = BY_PROVIDER["anthropic"]
    world.servers["anthropic"].push(
        fake.Reply(fake.reasoning(anthropic.thought), fake.tool_call("weather", {"city": "Bern"}))
    )
    turn, _ = _stream(world, anthropic, history)
    history += [_message(turn), *_results(turn, "sunny")]
    world.servers["deepseek"].require_reasoning_content = False
    world.servers["deepseek"].push(fake.Reply(fake.text("Sunny.")))

    # `deepseek-chat` is the non-thinking mode (the heuristics say it does not reason).
    list(world.router.stream(model="deepseek:deepseek-chat", messages=history, tools=TOOLS))
    body = world.servers["deepseek"].last_request.body

    assert all("reasoning_content" not in m for m in body["messages"])
    validate_openai_chat_request(body)
