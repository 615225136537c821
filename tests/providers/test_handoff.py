"""Cross-provider handoff: a history written by one provider/model, sent to another.

`build_context` repairs the dialogue once for every wire API; these tests check the
repaired dialogue itself and the bodies the Anthropic and Chat Completions translations
make from it (validated against the official SDK types), and end to end against the fake
servers, which refuse unmatched tool results and altered thinking signatures.
"""

from __future__ import annotations

import copy
import json
import re

import pytest

from providers.context import (
    ORPHANED_CALL_RESULT,
    VALID_TOOL_CALL_ID,
    build_context,
    synthetic_tool_call_id,
)
from providers.outbound import OutboundPolicy
from providers.registry import get_descriptor
from providers.transport import Transport
from providers.types import AssistantTurn, ModelCapabilities
from providers.wire import anthropic_messages, openai_completions
from providers.wire.anthropic_messages import AnthropicMessagesClient
from providers.wire.openai_completions import OpenAICompletionsClient
from tests.fakes import script as fake
from tests.fakes.anthropic_messages import AnthropicMessagesFake
from tests.fakes.openai_chat import OpenAIChatFake
from tests.fakes.validate import validate_anthropic_request, validate_openai_chat_request

ANTHROPIC = get_descriptor("anthropic")
DEEPSEEK = get_descriptor("deepseek")
OPENAI = get_descriptor("openai")
CLAUDE = "claude-sonnet-4-5"
SIGNED = {"type": "thinking", "thinking": "Weather needs the tool.", "signature": "sig-1"}
ANTHROPIC_ID = "toolu_01A09q90qw90lq917835lq9"
TOOLS = [
    {
        "name": "weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
ID_SHAPE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _anthropic_history(model: str = CLAUDE) -> list[dict]:
    """What the engine persists after one Claude tool round-trip with thinking."""
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Bern?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning": "Weather needs the tool.",
            "usage": {"input": 10, "output": 20},
            "extras": {"_anthropic": {"model": model, "thinking": [SIGNED]}},
            "tool_calls": [{"id": ANTHROPIC_ID, "name": "weather", "arguments": {"city": "Bern"}}],
        },
        {"role": "tool", "tool_call_id": ANTHROPIC_ID, "content": "sunny"},
        {"role": "assistant", "content": "Sunny in Bern.", "reasoning": "Easy."},
        {"role": "user", "content": "And Zürich?"},
    ]


def _anthropic_body(messages: list[dict], *, model: str = CLAUDE, caps=None, settings=None):
    return anthropic_messages.build_request(
        build_context(messages, TOOLS),
        model=model,
        descriptor=ANTHROPIC,
        stream=True,
        settings=settings or {},
        capabilities=caps,
    )


def _chat_body(messages: list[dict], descriptor=DEEPSEEK) -> dict:
    return openai_completions.build_request(
        build_context(messages, TOOLS),
        model="deepseek-chat",
        descriptor=descriptor,
        stream=True,
        settings={},
    )


def _chat_ids(body: dict) -> tuple[list[str], list[str]]:
    calls = [c["id"] for m in body["messages"] for c in m.get("tool_calls") or []]
    results = [m["tool_call_id"] for m in body["messages"] if m["role"] == "tool"]
    return calls, results


def _anthropic_ids(body: dict) -> tuple[list[str], list[str]]:
    blocks = [b for m in body["messages"] for b in m["content"]]
    calls = [b["id"] for b in blocks if b["type"] == "tool_use"]
    results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
    return calls, results


def _wire(body: dict) -> str:
    return json.dumps(body, ensure_ascii=False)


# --- Anthropic history → an OpenAI-compatible model and back ------------------------------


def test_claude_history_reaches_a_chat_completions_model_without_thinking_or_extras():
    body = _chat_body(_anthropic_history())

    validate_openai_chat_request(body)
    wire = _wire(body)
    assert "Weather needs the tool." not in wire  # neither hidden thinking nor plain text
    assert "sig-1" not in wire and "_anthropic" not in wire and "Easy." not in wire
    assert _chat_ids(body) == ([ANTHROPIC_ID], [ANTHROPIC_ID])  # valid ids are kept


def test_claude_history_back_to_the_same_claude_replays_the_signed_thinking_intact():
    body = _anthropic_body(_anthropic_history())

    validate_anthropic_request(body)
    assistant = body["messages"][1]
    assert assistant["content"][0] == SIGNED
    assert _anthropic_ids(body) == ([ANTHROPIC_ID], [ANTHROPIC_ID])


def test_another_claude_model_gets_no_thinking_from_the_first():
    body = _anthropic_body(_anthropic_history(), model="claude-opus-4-6")

    validate_anthropic_request(body)
    types = [b["type"] for m in body["messages"] for b in m["content"]]
    assert "thinking" not in types
    assert "Weather needs the tool." not in _wire(body)


def test_foreign_sidecars_are_ignored_by_every_translation():
    history = _anthropic_history()
    history[2]["extras"].update(
        {"_gemini": {"thought_signature": "g-sig"}, "_openai": {"encrypted": "enc-blob"}}
    )

    for body in (_chat_body(history), _anthropic_body(history)):
        wire = _wire(body)
        assert "g-sig" not in wire and "enc-blob" not in wire
    validate_openai_chat_request(_chat_body(history))
    validate_anthropic_request(_anthropic_body(history))


def test_a_history_needing_no_repair_comes_back_unchanged_apart_from_display_keys():
    history = _anthropic_history()
    expected = [
        {k: v for k, v in m.items() if k not in ("reasoning", "usage")}
        for m in history
        if m["role"] != "system"
    ]

    assert build_context(history, None).messages == expected


# --- ids other APIs refuse ------------------------------------------------------------------


def _vendor_history(call_id: str | None = "call:1/abc", result_id: str | None = "call:1/abc"):
    call = {"name": "weather", "arguments": {"city": "Bern"}}
    if call_id is not None:
        call["id"] = call_id
    result = {"role": "tool", "content": "sunny"}
    if result_id is not None:
        result["tool_call_id"] = result_id
    return [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        result,
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "Thanks"},
    ]


def test_an_id_with_invalid_characters_is_rewritten_in_the_call_and_its_result():
    calls, results = _anthropic_ids(_anthropic_body(_vendor_history()))

    assert calls == results
    assert ID_SHAPE.match(calls[0]) and calls[0] != "call:1/abc"
    assert calls[0].startswith("call_1_abc_")  # still recognisable in a log


def test_the_rewrite_is_the_same_for_every_target_api_and_every_request():
    first = _anthropic_ids(_anthropic_body(_vendor_history()))
    again = _anthropic_ids(_anthropic_body(_vendor_history()))
    chat = _chat_ids(_chat_body(_vendor_history()))

    assert first == again == chat


def test_appending_to_the_history_never_changes_an_earlier_rewritten_id():
    history = _vendor_history()
    before = _chat_body(history)
    longer = [
        *history,
        {"role": "assistant", "tool_calls": [{"id": "call:2/x", "name": "weather"}]},
        {"role": "tool", "tool_call_id": "call:2/x", "content": "rain"},
    ]
    after = _chat_body(longer)

    assert after["messages"][: len(before["messages"])] == before["messages"]


def test_rewritten_bodies_validate_and_pair_up_for_both_apis():
    history = _vendor_history()
    validate_anthropic_request(_anthropic_body(history))
    validate_openai_chat_request(_chat_body(history))
    assert AnthropicMessagesFake().check_request(_anthropic_body(history)) is None
    assert OpenAIChatFake().check_request(_chat_body(history)) is None


def test_an_overlong_id_is_rewritten():
    long_id = "call_" + "x" * 80
    calls, results = _chat_ids(_chat_body(_vendor_history(long_id, long_id)))

    assert calls == results and len(calls[0]) <= 64


def test_a_missing_id_gets_a_synthetic_one_and_its_result_follows():
    calls, results = _chat_ids(_chat_body(_vendor_history(call_id=None, result_id=None)))

    assert calls == results
    assert ID_SHAPE.match(calls[0]) and calls[0].startswith("call_")


def test_an_id_reused_by_a_later_turn_is_made_unique_with_its_results():
    # Some compatible servers number each turn's calls from call_0.
    history = [
        {"role": "user", "content": "Two cities"},
        {"role": "assistant", "tool_calls": [{"id": "call_0", "name": "weather"}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
        {"role": "assistant", "tool_calls": [{"id": "call_0", "name": "weather"}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "rain"},
    ]
    body = _anthropic_body(history)
    calls, results = _anthropic_ids(body)

    assert calls[0] == "call_0" and calls[1] != "call_0"
    assert results == calls
    assert AnthropicMessagesFake().check_request(body) is None


def test_two_calls_sharing_an_id_in_one_message_are_paired_in_order():
    history = [
        {"role": "user", "content": "Two cities"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "dup", "name": "weather", "arguments": {"city": "A"}},
                {"id": "dup", "name": "weather", "arguments": {"city": "B"}},
            ],
        },
        {"role": "tool", "tool_call_id": "dup", "content": "A: sunny"},
        {"role": "tool", "tool_call_id": "dup", "content": "B: rain"},
    ]
    body = _chat_body(history)
    calls, results = _chat_ids(body)

    assert len(set(calls)) == 2 and results == calls
    assert [m["content"] for m in body["messages"] if m["role"] == "tool"] == [
        "A: sunny",
        "B: rain",
    ]


def test_synthetic_ids_are_a_pure_function_of_their_inputs():
    assert synthetic_tool_call_id("a:b", "f", 0) == synthetic_tool_call_id("a:b", "f", 0)
    assert synthetic_tool_call_id("a:b", "f", 0) != synthetic_tool_call_id("a/b", "f", 0)
    assert synthetic_tool_call_id("a:b", "f", 0) != synthetic_tool_call_id("a:b", "f", 1)
    assert VALID_TOOL_CALL_ID.fullmatch(synthetic_tool_call_id("é" * 100, "f", 0))


# --- orphans ------------------------------------------------------------------------------


def test_a_call_without_a_result_before_the_next_user_message_gets_an_error_result():
    history = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "call_a", "name": "weather", "arguments": {"city": "A"}},
                {"id": "call_b", "name": "weather", "arguments": {"city": "B"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
        {"role": "user", "content": "Never mind B."},
    ]
    messages = build_context(history, None).messages

    assert messages[3] == {
        "role": "tool",
        "tool_call_id": "call_b",
        "name": "weather",
        "content": ORPHANED_CALL_RESULT,
        "is_error": True,
    }
    anthropic = _anthropic_body(history)
    chat = _chat_body(history)
    validate_anthropic_request(anthropic)
    validate_openai_chat_request(chat)
    assert AnthropicMessagesFake().check_request(anthropic) is None
    assert OpenAIChatFake().check_request(chat) is None
    result = anthropic["messages"][2]["content"][1]
    assert result["tool_use_id"] == "call_b" and result["is_error"] is True


def test_a_call_left_open_at_the_end_of_the_history_gets_an_error_result():
    history = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [{"id": "call_a", "name": "weather"}]},
    ]
    messages = build_context(history, None).messages

    assert messages[-1]["role"] == "tool" and messages[-1]["tool_call_id"] == "call_a"
    assert OpenAIChatFake().check_request(_chat_body(history)) is None


def test_a_call_answered_only_after_the_next_assistant_message_is_still_repaired():
    history = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [{"id": "call_a", "name": "weather"}]},
        {"role": "assistant", "content": "Still waiting."},
        {"role": "tool", "tool_call_id": "call_a", "content": "late"},
    ]
    messages = build_context(history, None).messages

    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[2]["content"] == ORPHANED_CALL_RESULT  # the late result is dropped
    assert OpenAIChatFake().check_request(_chat_body(history)) is None


@pytest.mark.parametrize(
    "stray",
    [
        {"role": "tool", "tool_call_id": "nobody", "content": "who asked?"},
        {"role": "tool", "tool_call_id": "call_a", "content": "answered twice"},
        {"role": "tool", "content": "no id at all"},
    ],
)
def test_an_orphaned_result_is_dropped_not_turned_into_user_text(stray):
    history = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [{"id": "call_a", "name": "weather"}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
        stray,
        {"role": "assistant", "content": "Sunny."},
    ]
    messages = build_context(history, None).messages

    assert stray["content"] not in _wire({"m": messages})
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]


def test_a_result_before_any_call_is_dropped():
    history = [
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "x", "content": "stray"},
        {"role": "assistant", "content": "hello"},
    ]

    assert [m["role"] for m in build_context(history, None).messages] == ["user", "assistant"]


def test_an_assistant_message_that_only_reasoned_becomes_nothing():
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "", "reasoning": "thinking out loud"},
        {"role": "user", "content": "Hello?"},
    ]
    messages = build_context(history, None).messages

    assert [m["role"] for m in messages] == ["user", "user"]
    validate_openai_chat_request(_chat_body(history))
    validate_anthropic_request(_anthropic_body(history))


def test_a_failure_the_engine_recorded_in_extras_reaches_the_wire_as_is_error():
    history = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [{"id": "call_a", "name": "weather"}]},
        {
            "role": "tool",
            "tool_call_id": "call_a",
            "content": "Error: timeout",
            "extras": {"tool": "weather", "is_error": True},
        },
    ]

    body = _anthropic_body(history)

    assert body["messages"][-1]["content"][0]["is_error"] is True
    assert build_context(history, None).messages[-1]["is_error"] is True


def test_repair_never_touches_the_callers_history():
    history = _vendor_history()
    history.insert(3, {"role": "tool", "tool_call_id": "stray", "content": "x"})
    before = copy.deepcopy(history)

    build_context(history, TOOLS)

    assert history == before


# --- a budget on Claude when the tool loop came from another model ------------------------


BUDGET_CAPS = ModelCapabilities(reasoning=True, thinking="budget", max_output_tokens=64_000)


def test_a_budget_is_sent_when_the_tool_loop_is_claudes_own():
    history = _anthropic_history()[:4]  # ends with the tool result of a signed turn

    body = _anthropic_body(history, caps=BUDGET_CAPS, settings={"reasoning_effort": "low"})

    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    validate_anthropic_request(body)


def test_a_budget_is_left_out_when_the_tool_loop_came_from_another_model():
    history = _anthropic_history(model="gpt-5")[:4]  # the sidecar is not this model's

    body = _anthropic_body(history, caps=BUDGET_CAPS, settings={"reasoning_effort": "low"})

    assert "thinking" not in body
    assert body["max_tokens"] == 64_000
    validate_anthropic_request(body)


def test_a_new_user_turn_after_a_foreign_tool_loop_thinks_again():
    history = _anthropic_history(model="gpt-5")  # ends with a user message

    body = _anthropic_body(history, caps=BUDGET_CAPS, settings={"reasoning_effort": "low"})

    assert body["thinking"]["type"] == "enabled"


def test_adaptive_thinking_is_kept_in_a_foreign_tool_loop():
    caps = ModelCapabilities(reasoning=True, thinking="adaptive")
    history = _anthropic_history(model="gpt-5")[:4]

    body = _anthropic_body(history, caps=caps, settings={"reasoning_effort": "high"})

    assert body["thinking"] == {"type": "adaptive"}


# --- end to end: Claude → a Chat Completions vendor → Claude, over HTTP -------------------


@pytest.fixture
def transport():
    transport = Transport(
        policy=OutboundPolicy(allow_loopback=True),
        max_retries=0,
        read_timeout=5.0,
        sleep=lambda seconds: None,
    )
    yield transport
    transport.close()


def _message(turn: AssistantTurn) -> dict:
    """The canonical assistant message the engine persists for a turn."""
    message: dict = {"role": "assistant", "content": turn.text}
    if turn.reasoning:
        message["reasoning"] = turn.reasoning
    if turn.extras:
        message["extras"] = turn.extras
    if turn.tool_calls:
        message["tool_calls"] = [call.to_dict() for call in turn.tool_calls]
    return message


def _results(turn: AssistantTurn, content: str) -> list[dict]:
    return [{"role": "tool", "tool_call_id": c.id, "content": content} for c in turn.tool_calls]


def test_a_conversation_hops_claude_to_a_vendor_with_odd_ids_and_back(transport):
    caps = ModelCapabilities(tools=True, reasoning=True, thinking="budget")
    with AnthropicMessagesFake(api_key="k") as claude_server, OpenAIChatFake(api_key="k") as vendor:
        claude_server.push(
            fake.Reply(
                fake.reasoning("Bern first."),
                fake.tool_call("weather", {"city": "Bern"}, id=ANTHROPIC_ID),
            ),
            fake.Reply(fake.reasoning("All done."), fake.text("Bern sunny, Zürich rain.")),
        )
        vendor.push(
            fake.Reply(fake.reasoning("Zürich next."), fake.tool_call("weather", id="call:1/abc")),
        )
        claude = AnthropicMessagesClient(
            ANTHROPIC,
            api_key="k",
            base_url=claude_server.root_url,
            transport=transport,
            capabilities=lambda model: caps,
        )
        other = OpenAICompletionsClient(
            DEEPSEEK,
            api_key="k",
            base_url=vendor.base_url,
            transport=transport,
            capabilities=lambda model: ModelCapabilities(tools=True),
        )
        history: list[dict] = [{"role": "user", "content": "Weather in Bern and Zürich?"}]
        first = claude.complete(model=CLAUDE, messages=history, tools=TOOLS, reasoning_effort="low")
        history += [_message(first), *_results(first, "sunny")]
        second = other.complete(model="deepseek-chat", messages=history, tools=TOOLS)
        to_vendor = vendor.last_request.body
        history += [_message(second), *_results(second, "rain")]
        third = claude.complete(model=CLAUDE, messages=history, tools=TOOLS, reasoning_effort="low")
        to_claude = claude_server.last_request.body

    assert third.text == "Bern sunny, Zürich rain."
    validate_openai_chat_request(to_vendor)
    assert "Bern first." not in _wire(to_vendor)
    validate_anthropic_request(to_claude)
    calls, results = _anthropic_ids(to_claude)
    assert calls[0] == ANTHROPIC_ID and calls == results
    assert calls[1] != "call:1/abc" and ID_SHAPE.match(calls[1])
    # Claude's own signed thinking went back intact (the fake checks the signature); the
    # vendor's reasoning did not, and the budget waits out the vendor's tool loop.
    first_turn = to_claude["messages"][1]["content"]
    assert first_turn[0]["type"] == "thinking" and first_turn[0]["thinking"] == "Bern first."
    assert "Zürich next." not in _wire(to_claude)
    assert "thinking" not in to_claude
