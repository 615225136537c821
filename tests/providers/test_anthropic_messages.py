from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from providers import errors
from providers.cancel import CancelToken
from providers.context import build_context
from providers.outbound import OutboundPolicy
from providers.registry import get_descriptor
from providers.transport import Transport
from providers.types import ModelCapabilities
from providers.usage import usage_from_anthropic
from providers.wire.anthropic_messages import (
    DEFAULT_MAX_TOKENS,
    AnthropicMessagesClient,
    MessagesStreamParser,
    build_request,
    parse_message,
)
from tests.fakes import script as fake
from tests.fakes.anthropic_messages import AnthropicMessagesFake
from tests.fakes.validate import validate_anthropic_request

ANTHROPIC = get_descriptor("anthropic")
MODEL = "claude-sonnet-4-5"
PDF_DATA = "JVBERi0xLjQK"
PNG_DATA = "iVBORw0KGgo="
SIGNED = {"type": "thinking", "thinking": "Let me think.", "signature": "sig-abc"}
REDACTED = {"type": "redacted_thinking", "data": "opaque-bytes"}


def ev(payload: dict) -> SimpleNamespace:
    return SimpleNamespace(event=payload["type"], data=json.dumps(payload), id=None, retry=None)


def message_start(usage: dict | None = None) -> SimpleNamespace:
    usage = usage if usage is not None else {"input_tokens": 25, "output_tokens": 1}
    return ev(
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": MODEL,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage,
            },
        }
    )


def block_start(index: int, block: dict) -> SimpleNamespace:
    return ev({"type": "content_block_start", "index": index, "content_block": block})


def delta(index: int, body: dict) -> SimpleNamespace:
    return ev({"type": "content_block_delta", "index": index, "delta": body})


def block_stop(index: int) -> SimpleNamespace:
    return ev({"type": "content_block_stop", "index": index})


def message_delta(stop_reason: str = "end_turn", usage: dict | None = None) -> SimpleNamespace:
    return ev(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": usage if usage is not None else {"output_tokens": 15},
        }
    )


MESSAGE_STOP = ev({"type": "message_stop"})
PING = ev({"type": "ping"})


def run(events: list, model: str = MODEL) -> tuple[list, Any]:
    parser = MessagesStreamParser(model=model)
    out = []
    for event in events:
        out.extend(parser.feed(event))
    return out, parser.finish()


def _assistant(model: str = MODEL) -> dict:
    return {
        "role": "assistant",
        "content": "Checking both.",
        "reasoning": "Let me think.",
        "usage": {"input": 1, "output": 2},
        "extras": {
            "_anthropic": {"model": model, "thinking": [SIGNED, REDACTED]},
            "_gemini": {"sig": "x"},
        },
        "tool_calls": [
            {"id": "toolu_1", "name": "lookup", "arguments": {"q": "a"}},
            {"id": "toolu_2", "name": "lookup", "arguments": {"q": "b"}},
        ],
    }


def _conversation(model: str = MODEL) -> list[dict]:
    return [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look", "cache_control": {"type": "ephemeral"}},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_DATA}"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                {
                    "type": "file",
                    "file": {
                        "filename": "r.pdf",
                        "file_data": f"data:application/pdf;base64,{PDF_DATA}",
                    },
                },
            ],
        },
        _assistant(model),
        {"role": "tool", "tool_call_id": "toolu_1", "content": "A"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "B failed", "is_error": True},
        {"role": "user", "content": "And now?"},
    ]


TOOLS = [
    {
        "name": "lookup",
        "description": "Look up",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        "cache_control": {"type": "ephemeral"},
    }
]


def _build(messages=None, *, model=MODEL, stream=True, settings=None, caps=None, tools=TOOLS):
    return build_request(
        build_context(messages or _conversation(), tools),
        model=model,
        descriptor=ANTHROPIC,
        stream=stream,
        settings=settings or {},
        capabilities=caps,
    )


# --- usage --------------------------------------------------------------------------------


def test_usage_maps_the_documented_cache_read_example():
    # Anthropic's docs: a 200K-token cached document and a 50-token question.
    usage = usage_from_anthropic(
        {
            "input_tokens": 50,
            "cache_read_input_tokens": 200_000,
            "cache_creation_input_tokens": 0,
            "output_tokens": 503,
        }
    )

    assert usage.to_dict() == {"input": 50, "output": 503, "cache_read": 200_000, "cache_write": 0}
    assert usage.context_tokens == 200_050


def test_usage_maps_cache_writes_apart_from_fresh_input():
    usage = usage_from_anthropic(
        {"input_tokens": 50, "cache_creation_input_tokens": 200_000, "output_tokens": 10}
    )

    assert (usage.input, usage.cache_write, usage.cache_read) == (50, 200_000, 0)


def test_streamed_usage_takes_the_cumulative_counts_from_message_delta():
    _, turn = run(
        [
            message_start(
                {
                    "input_tokens": 50,
                    "cache_read_input_tokens": 100,
                    "cache_creation_input_tokens": 7,
                    "output_tokens": 1,
                }
            ),
            block_start(0, {"type": "text", "text": ""}),
            delta(0, {"type": "text_delta", "text": "Hi"}),
            block_stop(0),
            message_delta(usage={"output_tokens": 15}),
            message_delta(
                usage={"output_tokens": 20, "input_tokens": 60, "cache_read_input_tokens": None}
            ),
            MESSAGE_STOP,
        ]
    )

    assert turn.usage.to_dict() == {"input": 60, "output": 20, "cache_read": 100, "cache_write": 7}


def test_no_usage_reported_is_none():
    _, turn = run([message_start({}), message_delta(usage={}), MESSAGE_STOP])

    assert turn.usage is None


# --- request ------------------------------------------------------------------------------


def test_system_is_separate_and_headers_carry_the_key_and_version():
    from providers.wire.anthropic_messages import request_headers

    body = _build()

    assert body["system"] == "Be brief."
    assert all(m["role"] != "system" for m in body["messages"])
    # content-type is the transport's (it sets it on every JSON request), never twice.
    assert request_headers(ANTHROPIC, "sk-ant-x") == {
        "anthropic-version": "2023-06-01",
        "x-api-key": "sk-ant-x",
    }


def test_user_parts_become_text_image_and_document_blocks():
    user = _build()["messages"][0]

    assert user == {
        "role": "user",
        "content": [
            {"type": "text", "text": "Look", "cache_control": {"type": "ephemeral"}},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": PNG_DATA},
            },
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
            {
                "type": "document",
                "title": "r.pdf",
                "source": {"type": "base64", "media_type": "application/pdf", "data": PDF_DATA},
            },
        ],
    }


def test_thinking_is_replayed_first_to_the_model_that_produced_it():
    assistant = _build()["messages"][1]

    assert assistant["content"] == [
        SIGNED,
        REDACTED,
        {"type": "text", "text": "Checking both."},
        {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "a"}},
        {"type": "tool_use", "id": "toolu_2", "name": "lookup", "input": {"q": "b"}},
    ]


def test_thinking_signatures_are_not_sent_to_another_model():
    body = _build(_conversation(model="claude-opus-4-1"), model=MODEL)
    raw = json.dumps(body)

    assert "sig-abc" not in raw
    assert "opaque-bytes" not in raw
    assert body["messages"][1]["content"][0] == {"type": "text", "text": "Checking both."}


def test_reasoning_and_other_providers_sidecars_never_reach_the_wire():
    raw = json.dumps(_build(_conversation(model="other")))

    assert "Let me think." not in raw
    assert "_gemini" not in raw
    assert "_anthropic" not in raw


def test_tool_results_and_the_next_user_message_merge_into_one_user_turn():
    messages = _build()["messages"]

    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "A"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "B failed", "is_error": True},
        {"type": "text", "text": "And now?"},
    ]


def test_tools_carry_input_schema_and_pass_cache_control_through():
    assert _build()["tools"] == [
        {
            "name": "lookup",
            "description": "Look up",
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
            "cache_control": {"type": "ephemeral"},
        }
    ]


def test_max_tokens_comes_from_settings_then_capabilities_then_the_default():
    caps = ModelCapabilities(max_output_tokens=64_000)

    assert _build(settings={"max_tokens": 100}, caps=caps)["max_tokens"] == 100
    assert _build(caps=caps)["max_tokens"] == 64_000
    assert _build()["max_tokens"] == DEFAULT_MAX_TOKENS


def test_temperature_is_never_sent_and_thinking_is_not_requested_yet():
    body = _build(
        settings={"temperature": 0.5, "reasoning_effort": "high"},
        caps=ModelCapabilities(reasoning=True),
    )

    assert "temperature" not in body
    assert "thinking" not in body


@pytest.mark.parametrize("stream", [True, False])
def test_request_bodies_validate_against_the_sdk_types(stream):
    validate_anthropic_request(_build(stream=stream, settings={"temperature": 0.1}))


def test_the_request_validator_catches_a_misspelled_block():
    body = _build()
    body["messages"][2]["content"][0]["tool_use_id"] = None

    with pytest.raises(Exception, match="validation error"):
        validate_anthropic_request(body)


# --- stream parsing -----------------------------------------------------------------------


def _thinking_tool_stream() -> list:
    return [
        message_start(),
        block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, {"type": "thinking_delta", "thinking": "Let me "}),
        PING,
        delta(0, {"type": "thinking_delta", "thinking": "think."}),
        delta(0, {"type": "signature_delta", "signature": "sig-abc"}),
        block_stop(0),
        block_start(1, REDACTED),
        block_stop(1),
        block_start(2, {"type": "text", "text": ""}),
        delta(2, {"type": "text_delta", "text": "Checking "}),
        delta(2, {"type": "text_delta", "text": "both."}),
        block_stop(2),
        block_start(3, {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}),
        delta(3, {"type": "input_json_delta", "partial_json": ""}),
        delta(3, {"type": "input_json_delta", "partial_json": '{"q": "'}),
        delta(3, {"type": "input_json_delta", "partial_json": 'a"}'}),
        block_stop(3),
        message_delta("tool_use"),
        MESSAGE_STOP,
    ]


def test_a_thinking_and_tool_stream_assembles_into_the_turn():
    chunks, turn = run(_thinking_tool_stream())

    assert [c.reasoning for c in chunks if c.reasoning] == ["Let me ", "think."]
    assert [c.text for c in chunks if c.text] == ["Checking ", "both."]
    assert turn.text == "Checking both."
    assert turn.reasoning == "Let me think."
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("toolu_1", "lookup", {"q": "a"})
    ]
    assert turn.finish_reason == "tool_use"


def test_thinking_blocks_are_kept_in_order_exactly_as_received():
    _, turn = run(_thinking_tool_stream())

    assert turn.extras == {"_anthropic": {"model": MODEL, "thinking": [SIGNED, REDACTED]}}


def test_a_streamed_turn_replays_its_thinking_on_the_next_request():
    _, turn = run(_thinking_tool_stream())
    history = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": turn.text,
            "reasoning": turn.reasoning,
            "extras": turn.extras,
            "tool_calls": [c.to_dict() for c in turn.tool_calls],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "A"},
    ]

    assistant = _build(history)["messages"][1]

    assert assistant["content"][:2] == [SIGNED, REDACTED]


def test_tool_call_deltas_carry_the_call_ordinal_and_first_fragment_identity():
    chunks, _ = run(_thinking_tool_stream())
    deltas = [c.tool_call_delta for c in chunks if c.tool_call_delta]

    assert deltas[0] == {"index": 0, "id": "toolu_1", "name": "lookup", "arguments": ""}
    assert "".join(d["arguments"] for d in deltas) == '{"q": "a"}'
    assert all(d["index"] == 0 for d in deltas)


def test_invalid_tool_json_is_reported_on_the_turn():
    _, turn = run(
        [
            message_start(),
            block_start(0, {"type": "tool_use", "id": "t", "name": "f", "input": {}}),
            delta(0, {"type": "input_json_delta", "partial_json": '{"a": tru'}),
            block_stop(0),
            message_delta("tool_use"),
            MESSAGE_STOP,
        ]
    )

    call = turn.tool_calls[0]
    assert (call.arguments, call.raw_arguments) == ({}, '{"a": tru')
    assert call.error


def test_a_stream_without_message_stop_raises_with_the_partial_turn():
    parser = MessagesStreamParser(model=MODEL)
    for event in [
        message_start(),
        block_start(0, {"type": "text", "text": ""}),
        delta(0, {"type": "text_delta", "text": "half"}),
    ]:
        parser.feed(event)

    with pytest.raises(errors.StreamError) as info:
        parser.finish()
    assert info.value.partial.text == "half"


def test_an_error_event_after_200_raises_the_matching_error_with_the_partial_turn():
    parser = MessagesStreamParser(model=MODEL)
    for event in [
        message_start(),
        block_start(0, {"type": "text", "text": ""}),
        delta(0, {"type": "text_delta", "text": "so far"}),
    ]:
        parser.feed(event)

    with pytest.raises(errors.OverloadedError) as info:
        parser.feed(
            ev({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
        )
    assert info.value.partial.text == "so far"


# --- non-streamed -------------------------------------------------------------------------


def test_a_message_object_parses_into_a_turn():
    turn = parse_message(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [
                SIGNED,
                {"type": "text", "text": "Hi"},
                {"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}},
            ],
            "stop_reason": "tool_use",
            "usage": {
                "input_tokens": 3,
                "output_tokens": 4,
                "cache_read_input_tokens": 5,
                "cache_creation_input_tokens": 6,
            },
        },
        model=MODEL,
    )

    assert turn.text == "Hi"
    assert turn.tool_calls[0].arguments == {"a": 1}
    assert turn.extras["_anthropic"]["thinking"] == [SIGNED]
    assert turn.usage.to_dict() == {"input": 3, "output": 4, "cache_read": 5, "cache_write": 6}


# --- client -------------------------------------------------------------------------------


class RecordingTransport:
    """The transport boundary: records calls, replays scripted events or a payload."""

    def __init__(self, events: list | None = None, payload: dict | None = None) -> None:
        self.events = events or []
        self.payload = payload
        self.calls: list[dict] = []

    async def astream_sse(self, url, *, headers, body, model, cancel=None):
        self.calls.append({"url": url, "headers": dict(headers), "body": body, "cancel": cancel})
        for event in self.events:
            yield event

    def post_json(self, url, *, headers, body, model, cancel=None):
        self.calls.append({"url": url, "headers": dict(headers), "body": body, "cancel": cancel})
        return self.payload

    def close(self):
        pass


def _client(api_key="sk-ant-test", transport=None, caps=None):
    return AnthropicMessagesClient(
        ANTHROPIC,
        api_key=api_key,
        base_url=None,
        transport=transport or RecordingTransport(),
        capabilities=lambda model: caps or ModelCapabilities(),
    )


def test_a_missing_key_fails_before_any_request():
    transport = RecordingTransport()

    with pytest.raises(errors.AuthenticationError, match="no API key configured for Anthropic"):
        _client(api_key=None, transport=transport).complete(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
    assert transport.calls == []


def test_stream_posts_to_v1_messages_with_the_cancel_token():
    transport = RecordingTransport(_thinking_tool_stream())
    token = CancelToken()

    chunks = list(
        _client(transport=transport).stream(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], cancel=token
        )
    )

    call = transport.calls[0]
    assert call["url"] == "https://api.anthropic.com/v1/messages"
    assert call["headers"]["x-api-key"] == "sk-ant-test"
    assert call["cancel"] is token
    assert call["body"]["stream"] is True
    assert chunks[-1].turn.tool_calls[0].arguments == {"q": "a"}


# --- end to end: our client, the real transport, a fake server speaking the wire ---------


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


def _live_client(server, transport, caps=None):
    return AnthropicMessagesClient(
        ANTHROPIC,
        api_key="test-key",
        base_url=server.base_url,
        transport=transport,
        capabilities=lambda model: caps or ModelCapabilities(reasoning=True),
    )


USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]


def _history_after(turn, result: str) -> list[dict]:
    return [
        *USER,
        {
            "role": "assistant",
            "content": turn.text,
            "reasoning": turn.reasoning,
            "extras": turn.extras,
            "tool_calls": [c.to_dict() for c in turn.tool_calls],
        },
        {"role": "tool", "tool_call_id": turn.tool_calls[0].id, "content": result},
    ]


def test_end_to_end_thinking_tool_round_trip_replays_valid_signatures(transport):
    settings = {"max_tokens": 4096}
    with AnthropicMessagesFake(strict_roles=True) as server:
        server.push(
            fake.Reply(
                fake.reasoning("I should call the tool."),
                fake.redacted_thinking(),
                fake.text("Checking."),
                fake.tool_call("weather", {"city": "Bern"}, id="toolu_1"),
                fake.usage(input=50, output=30, cache_read=200_000),
            ),
            fake.Reply(fake.text("Sunny.")),
        )
        client = _live_client(server, transport)
        first = list(client.stream(model="claude-fake", messages=USER, tools=TOOLS, **settings))[
            -1
        ].turn
        second = list(
            client.stream(
                model="claude-fake",
                messages=_history_after(first, "sunny"),
                tools=TOOLS,
                **settings,
            )
        )[-1].turn

        sent = server.last_request.body
    validate_anthropic_request(sent)
    assert first.reasoning == "I should call the tool."
    assert first.tool_calls[0].arguments == {"city": "Bern"}
    assert first.usage.context_tokens == 200_050
    assert [b["type"] for b in first.extras["_anthropic"]["thinking"]] == [
        "thinking",
        "redacted_thinking",
    ]
    assert [b["type"] for b in sent["messages"][1]["content"]] == [
        "thinking",
        "redacted_thinking",
        "text",
        "tool_use",
    ]
    assert second.text == "Sunny."


def test_end_to_end_a_tampered_signature_is_refused_by_the_server(transport):
    with AnthropicMessagesFake() as server:
        server.push(fake.Reply(fake.reasoning("Hmm."), fake.tool_call("weather", {}, id="t1")))
        client = _live_client(server, transport)
        first = client.complete(model="claude-fake", messages=USER, tools=TOOLS)
        history = _history_after(first, "ok")
        history[2]["extras"]["_anthropic"]["thinking"][0]["signature"] = "forged"

        with pytest.raises(errors.BadRequestError, match="signature"):
            client.complete(model="claude-fake", messages=history, tools=TOOLS)


def test_end_to_end_non_streamed_message_parses(transport):
    with AnthropicMessagesFake() as server:
        server.push(fake.Reply(fake.text("Hello"), fake.usage(input=3, output=2)))
        turn = _live_client(server, transport).complete(model="claude-fake", messages=USER)

    assert turn.text == "Hello"
    assert turn.finish_reason == "end_turn"
    assert turn.usage.to_dict() == {"input": 3, "output": 2, "cache_read": 0, "cache_write": 0}


def test_end_to_end_truncated_stream_raises_with_partial_text(transport):
    with AnthropicMessagesFake() as server:
        server.push(fake.Reply(fake.text("Half an answer"), fake.truncate()))
        with pytest.raises(errors.StreamError) as info:
            list(_live_client(server, transport).stream(model="claude-fake", messages=USER))

    assert info.value.partial.text == "Half an answer"


def test_end_to_end_overloaded_event_after_200_is_translated(transport):
    with AnthropicMessagesFake() as server:
        server.push(fake.Reply(fake.text("So far"), fake.error_event("overloaded")))
        with pytest.raises(errors.OverloadedError) as info:
            list(_live_client(server, transport).stream(model="claude-fake", messages=USER))

    assert info.value.partial.text == "So far"


def test_end_to_end_unknown_model_404_is_no_access(transport):
    with AnthropicMessagesFake() as server:
        server.push(fake.Reply(fake.model_not_found()))
        with pytest.raises(errors.NoAccessError):
            _live_client(server, transport).complete(model="claude-fake", messages=USER)
