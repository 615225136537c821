from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from providers.cache_policy import (
    _ttl_bucket,
    apply_cache_policy,
    cache_marker,
    cache_point,
    cache_request_fields,
    cache_request_headers,
)
from providers.cache_spec import get_cache_spec, parse_cache_spec

ANTHROPIC = get_cache_spec("anthropic")
MARK = {"type": "ephemeral"}
CALLER = {"type": "ephemeral", "ttl": "1h"}


def tool(name: str, mark: dict | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "description": name, "parameters": {"type": "object"}}
    if mark:
        out["cache_control"] = mark
    return out


def marks(plan) -> int:
    """Breakpoints the request will carry: tools, message parts, tool messages, system."""
    found = sum(1 for t in plan.tools if t.get("cache_control"))
    for message in plan.messages:
        found += 1 if message.get("cache_control") else 0
        content = message.get("content")
        if isinstance(content, list):
            found += sum(1 for p in content if isinstance(p, dict) and p.get("cache_control"))
    return found + (1 if plan.system else 0)


def conversation() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "First answer"},
        {"role": "user", "content": "Second question"},
    ]


# --- the default shape --------------------------------------------------------------------


def test_plain_conversation_gets_the_seeds_two_breakpoints_system_and_last_block():
    plan = apply_cache_policy(conversation(), None, spec=ANTHROPIC, system=True)

    assert plan.system == MARK
    assert plan.messages[-1]["content"] == [
        {"type": "text", "text": "Second question", "cache_control": MARK}
    ]
    assert plan.messages[0]["content"] == "First question"
    assert marks(plan) == 2


def test_with_tools_the_last_tool_is_marked_too():
    plan = apply_cache_policy(conversation(), [tool("a"), tool("b")], spec=ANTHROPIC, system=True)

    assert [t.get("cache_control") for t in plan.tools] == [None, MARK]
    assert marks(plan) == 3


def test_no_system_prompt_means_no_system_marker():
    plan = apply_cache_policy(conversation(), None, spec=ANTHROPIC, system=False)

    assert plan.system is None
    assert marks(plan) == 1


def test_a_tool_result_as_latest_user_side_message_is_marked_on_the_message():
    history = [
        {"role": "user", "content": "Read it"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "t1", "name": "read"}]},
        {"role": "tool", "tool_call_id": "t1", "content": "file body"},
    ]

    plan = apply_cache_policy(history, None, spec=ANTHROPIC)

    assert plan.messages[-1]["cache_control"] == MARK
    assert plan.messages[-1]["content"] == "file body"
    assert plan.messages[0]["content"] == "Read it"


def test_the_mark_lands_on_the_last_block_that_renders():
    history = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                {"type": "text", "text": "   "},
            ],
        }
    ]

    plan = apply_cache_policy(history, None, spec=ANTHROPIC)

    image, blank = plan.messages[0]["content"]
    assert image["cache_control"] == MARK
    assert "cache_control" not in blank


def test_a_trailing_assistant_prefill_leaves_the_mark_on_the_latest_user_message():
    history = [*conversation(), {"role": "assistant", "content": "Partial"}]

    plan = apply_cache_policy(history, None, spec=ANTHROPIC)

    assert plan.messages[2]["content"][0]["cache_control"] == MARK
    assert plan.messages[3]["content"] == "Partial"


# --- caller marks -------------------------------------------------------------------------


def test_a_callers_own_marks_are_never_overridden():
    history = conversation()
    history[-1]["content"] = [{"type": "text", "text": "Second question", "cache_control": CALLER}]
    tools = [tool("a"), tool("b", CALLER)]

    plan = apply_cache_policy(history, tools, spec=ANTHROPIC, system=True)

    assert plan.messages[-1]["content"][0]["cache_control"] == CALLER
    assert plan.tools[-1]["cache_control"] == CALLER
    assert "cache_control" not in plan.tools[0]
    assert marks(plan) == 3


def test_at_most_max_breakpoints_dropping_messages_first_then_system():
    tools = [tool("a", CALLER), tool("b", CALLER), tool("c", CALLER), tool("d")]

    plan = apply_cache_policy(conversation(), tools, spec=ANTHROPIC, system=True)

    assert [t.get("cache_control") for t in plan.tools] == [CALLER, CALLER, CALLER, MARK]
    assert plan.system is None
    assert all(not isinstance(m["content"], list) for m in plan.messages)
    assert marks(plan) == 4


def test_caller_message_marks_over_budget_are_stripped_oldest_first():
    history = [
        {"role": "user", "content": [{"type": "text", "text": "one", "cache_control": CALLER}]},
        {"role": "assistant", "content": [{"type": "text", "text": "a", "cache_control": CALLER}]},
        {"role": "user", "content": [{"type": "text", "text": "two", "cache_control": CALLER}]},
    ]

    plan = apply_cache_policy(history, [tool("a")], spec=ANTHROPIC, system=True)

    assert plan.dropped == 1
    assert "cache_control" not in plan.messages[0]["content"][0]
    assert plan.messages[1]["content"][0]["cache_control"] == CALLER
    assert plan.messages[2]["content"][0]["cache_control"] == CALLER
    # The caller's marks are 1h: the earlier automatic ones are raised to match, since
    # the API refuses a 1h breakpoint after a 5m one.
    assert plan.tools[0]["cache_control"] == CALLER
    assert plan.system == CALLER
    assert marks(plan) == 4


def test_a_budget_of_one_goes_to_the_tools():
    one = parse_cache_spec(
        "tiny", {"mode": "explicit", "breakpoint_format": "cache_control", "max_breakpoints": 1}
    )

    plan = apply_cache_policy(conversation(), [tool("a")], spec=one, system=True)

    assert plan.tools[0]["cache_control"] == MARK
    assert plan.system is None
    assert marks(plan) == 1


# --- purity and modes ---------------------------------------------------------------------


def test_outbound_only_the_inputs_are_never_changed():
    history = conversation()
    history.append({"role": "tool", "tool_call_id": "x", "content": "r"})
    tools = [tool("a"), tool("b", CALLER)]
    before = copy.deepcopy((history, tools))

    plan = apply_cache_policy(history, tools, spec=ANTHROPIC, system=True)

    assert (history, tools) == before
    assert plan.messages is not history
    assert plan.messages[-1] is not history[-1]


@pytest.mark.parametrize("provider", ["openai", "deepseek", "ollama", "gemini", "bedrock", "x"])
def test_providers_without_cache_control_breakpoints_get_plain_copies(provider):
    history = conversation()
    tools = [tool("a")]

    plan = apply_cache_policy(history, tools, spec=get_cache_spec(provider), system=True)

    assert (plan.messages, plan.tools, plan.system) == (history, tools, None)


# --- TTL ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "seconds, ttl", [(300, None), (3599, None), (3600, "1h"), (86_400, "1h"), (0, None)]
)
def test_ttl_bucket_is_one_hour_from_3600_seconds_else_the_default(seconds, ttl):
    assert _ttl_bucket(seconds) == ttl


def test_retention_sets_the_ttl_of_every_automatic_mark():
    plan = apply_cache_policy(
        conversation(), [tool("a")], spec=ANTHROPIC, system=True, retention="long"
    )

    long_mark = {"type": "ephemeral", "ttl": "1h"}
    assert plan.system == long_mark
    assert plan.tools[0]["cache_control"] == long_mark
    assert plan.messages[-1]["content"][0]["cache_control"] == long_mark


def test_retention_in_seconds_goes_through_the_bucket_and_the_endpoint_rule():
    assert cache_marker(ANTHROPIC, 7200) == {"type": "ephemeral", "ttl": "1h"}
    assert cache_marker(ANTHROPIC, 600) == MARK
    assert cache_marker(ANTHROPIC, 7200, base_url="https://gateway.example.com") == MARK
    assert cache_marker(ANTHROPIC, "long", base_url="https://api.anthropic.com") == {
        "type": "ephemeral",
        "ttl": "1h",
    }


# --- the other modes' one-line hooks ------------------------------------------------------


def test_bedrock_cache_point_block_with_optional_ttl():
    bedrock = get_cache_spec("bedrock")

    assert cache_point(bedrock) == {"cachePoint": {"type": "default"}}
    assert cache_point(bedrock, "long") == {"cachePoint": {"type": "default", "ttl": "1h"}}
    assert cache_point(ANTHROPIC) is None


def test_cache_key_goes_where_the_declaration_says_and_nowhere_else():
    settings = {"cache_key": "session-42"}

    assert cache_request_fields(get_cache_spec("openai"), settings) == {
        "prompt_cache_key": "session-42"
    }
    assert cache_request_fields(get_cache_spec("openai"), {}) == {}
    assert cache_request_fields(get_cache_spec("deepseek"), settings) == {}
    assert cache_request_fields(ANTHROPIC, settings) == {}
    assert cache_request_headers(get_cache_spec("xai"), settings) == {
        "x-grok-conv-id": "session-42"
    }
    assert cache_request_headers(get_cache_spec("openai"), settings) == {}


# --- property: the budget holds for any history -------------------------------------------

_part = st.fixed_dictionaries(
    {"type": st.just("text"), "text": st.sampled_from(["x", " ", "long text"])},
    optional={"cache_control": st.just(CALLER)},
)
_message = st.one_of(
    st.fixed_dictionaries(
        {"role": st.just("user"), "content": st.one_of(st.text(max_size=5), st.lists(_part))}
    ),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.lists(_part, max_size=3)}),
    st.fixed_dictionaries(
        {"role": st.just("tool"), "tool_call_id": st.just("t"), "content": st.just("r")},
        optional={"cache_control": st.just(CALLER)},
    ),
)
_tool = st.builds(tool, st.sampled_from(["a", "b"]), st.sampled_from([None, CALLER]))


@settings(max_examples=200, deadline=None)
@given(
    history=st.lists(_message, max_size=8),
    tools=st.lists(_tool, max_size=6),
    system=st.booleans(),
)
def test_never_more_breakpoints_than_declared(history, tools, system):
    before = copy.deepcopy((history, tools))

    plan = apply_cache_policy(history, tools, spec=ANTHROPIC, system=system)

    assert marks(plan) <= ANTHROPIC.max_breakpoints
    assert (history, tools) == before


# --- mixed TTLs: longer ones first, in prompt order (issue 23) ---------------------------

SHORT = {"type": "ephemeral"}
FIVE = {"type": "ephemeral", "ttl": "5m"}
HOUR = {"type": "ephemeral", "ttl": "1h"}


def _wire_body(history, tools, *, retention=None, system="Be brief.") -> dict[str, Any]:
    from providers.context import build_context
    from providers.registry import get_descriptor
    from providers.wire.anthropic_messages import build_request

    messages = ([{"role": "system", "content": system}] if system else []) + history
    return build_request(
        build_context(messages, tools),
        model="claude-fake",
        descriptor=get_descriptor("anthropic"),
        stream=False,
        settings={"cache_retention": retention} if retention else {},
        cache_spec=ANTHROPIC,
        base_url="https://api.anthropic.com",
    )


def test_the_refused_five_hour_hour_five_order_becomes_hours_first():
    from tests.fakes.anthropic_messages import ttl_order_problem

    history = [
        {"role": "user", "content": [{"type": "text", "text": "one", "cache_control": HOUR}]},
        {"role": "assistant", "content": [{"type": "text", "text": "a", "cache_control": HOUR}]},
        {"role": "user", "content": "two"},
    ]
    # Before: the last tool 5m (automatic), two caller marks 1h, the latest user turn 5m.
    body = _wire_body(history, [tool("a")], system=None)

    assert ttl_order_problem(body) is None
    assert body["tools"][0]["cache_control"] == HOUR  # raised: a 1h mark comes after it
    assert body["messages"][0]["content"][0]["cache_control"] == HOUR
    assert body["messages"][-1]["content"][-1]["cache_control"] == SHORT  # the tail stays 5m
    # Without the reordering that request is the one the API refuses.
    body["tools"][0]["cache_control"] = SHORT
    assert ttl_order_problem(body) is not None


def test_the_order_checker_refuses_what_the_api_refuses():
    from tests.fakes.anthropic_messages import ttl_order_problem

    refused = {
        "tools": [{"name": "a", "input_schema": {}, "cache_control": FIVE}],
        "system": [{"type": "text", "text": "s", "cache_control": HOUR}],
        "messages": [],
    }
    assert "must not come after" in ttl_order_problem(refused)
    refused["tools"][0]["cache_control"] = HOUR
    assert ttl_order_problem(refused) is None


_MARKS = st.sampled_from([None, SHORT, FIVE, HOUR])


@settings(max_examples=150, deadline=None)
@given(
    tool_marks=st.lists(_MARKS, min_size=0, max_size=3),
    message_marks=st.lists(_MARKS, min_size=1, max_size=6),
    retention=st.sampled_from([None, "short", "long"]),
    system=st.booleans(),
)
def test_any_mix_of_marks_and_retention_goes_out_longest_first(
    tool_marks, message_marks, retention, system
):
    from tests.fakes.anthropic_messages import ttl_order_problem

    tools = [tool(f"t{i}", mark) for i, mark in enumerate(tool_marks)]
    history: list[dict[str, Any]] = []
    for position, mark in enumerate(message_marks):
        role = "user" if position % 2 == 0 else "assistant"
        part: dict[str, Any] = {"type": "text", "text": f"m{position}"}
        if mark is not None:
            part["cache_control"] = dict(mark)
        history.append({"role": role, "content": [part]})
    before = copy.deepcopy(history)

    body = _wire_body(history, tools, retention=retention, system="S" if system else None)

    assert ttl_order_problem(body) is None
    assert history == before  # outbound copies only
