from __future__ import annotations

import copy

from providers.context import build_context, content_parts, content_text, parse_data_url


def _history() -> list[dict]:
    return [
        {"role": "system", "content": "You are OpenWorker."},
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"x": 1}}]},
        {
            "role": "assistant",
            "content": "Looking.",
            "reasoning": "the user greets me",
            "usage": {"input": 5, "output": 2},
            "extras": {"_anthropic": {"model": "claude-x", "thinking": [{"type": "thinking"}]}},
            "tool_calls": [{"id": "c1", "name": "search", "arguments": {"q": "x"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
    ]


def test_system_messages_are_lifted_into_the_system_prompt():
    ctx = build_context(_history(), None)

    assert ctx.system_prompt == "You are OpenWorker."
    assert [m["role"] for m in ctx.messages] == ["user", "assistant", "tool"]


def test_several_system_messages_are_joined_in_order():
    messages = [
        {"role": "system", "content": "one"},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "two"}]},
    ]

    assert build_context(messages, None).system_prompt == "one\n\ntwo"


def test_no_system_message_gives_no_system_prompt():
    assert build_context([{"role": "user", "content": "hi"}], None).system_prompt is None


def test_reasoning_and_usage_never_reach_the_context():
    assistant = build_context(_history(), None).messages[1]

    assert "reasoning" not in assistant
    assert "usage" not in assistant


def test_extras_and_tool_calls_stay_for_the_owning_translation():
    assistant = build_context(_history(), None).messages[1]

    assert assistant["extras"]["_anthropic"]["model"] == "claude-x"
    assert assistant["tool_calls"][0]["arguments"] == {"q": "x"}


def test_the_callers_history_is_never_mutated():
    history = _history()
    tools = [{"name": "search", "description": "d", "parameters": {"type": "object"}}]
    before = copy.deepcopy((history, tools))

    ctx = build_context(history, tools)
    ctx.messages[0]["content"][0].pop("cache_control")
    ctx.messages[1]["tool_calls"][0]["arguments"]["q"] = "changed"
    ctx.messages[1]["extras"]["_anthropic"]["thinking"].clear()
    ctx.tools[0]["parameters"]["properties"] = {}

    assert (history, tools) == before


def test_tools_default_to_an_empty_list():
    assert build_context([], None).tools == []


def test_content_helpers_read_strings_and_parts():
    parts = [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]

    assert content_parts("x") == [{"type": "text", "text": "x"}]
    assert content_parts("") == []
    assert content_parts(None) == []
    assert content_text(parts) == "ab"


def test_data_urls_are_split_into_media_type_and_payload():
    assert parse_data_url("data:image/png;base64,AAAA") == ("image/png", "AAAA")
    assert parse_data_url("data:application/pdf;name=a.pdf;base64,JVBER") == (
        "application/pdf",
        "JVBER",
    )
    assert parse_data_url("https://example.com/cat.png") is None
