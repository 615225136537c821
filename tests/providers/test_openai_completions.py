from __future__ import annotations

import json
import threading
from dataclasses import replace
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
from providers.usage import usage_from_openai
from providers.wire.openai_completions import (
    CompletionsStreamParser,
    OpenAICompletionsClient,
    build_request,
    parse_completion,
)
from tests.fakes import script as fake
from tests.fakes.openai_chat import OpenAIChatFake
from tests.fakes.validate import validate_openai_chat_request

OPENAI = get_descriptor("openai")
OLLAMA = get_descriptor("ollama")
DEEPSEEK = get_descriptor("deepseek")
MISTRAL = get_descriptor("mistral")
PDF = "data:application/pdf;base64,JVBERi0xLjQK"
PNG = "data:image/png;base64,iVBORw0KGgo="


def ev(payload: Any) -> SimpleNamespace:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return SimpleNamespace(event=None, data=data, id=None, retry=None)


def chunk(delta: dict | None = None, finish: str | None = None, **extra: Any) -> SimpleNamespace:
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return ev(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [choice],
            **extra,
        }
    )


def run(parser: CompletionsStreamParser, events: list) -> tuple[list, Any]:
    out = []
    for event in events:
        out.extend(parser.feed(event))
    return out, parser.finish()


def _conversation() -> list[dict]:
    return [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Read these", "cache_control": {"type": "ephemeral"}},
                {"type": "image_url", "image_url": {"url": PNG}},
                {"type": "file", "file": {"filename": "a.pdf", "file_data": PDF}},
            ],
        },
        {
            "role": "assistant",
            "content": "",
            "reasoning": "secret thoughts",
            "extras": {"_anthropic": {"model": "claude", "thinking": []}},
            "tool_calls": [{"id": "call_1", "name": "lookup", "arguments": {"q": "é"}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ]


TOOLS = [
    {
        "name": "lookup",
        "description": "Look a thing up",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        "cache_control": {"type": "ephemeral"},
    }
]


def _build(descriptor=OPENAI, stream=True, settings=None, messages=None, tools=TOOLS) -> dict:
    ctx = build_context(messages or _conversation(), tools)
    return build_request(
        ctx, model="gpt-x", descriptor=descriptor, stream=stream, settings=settings or {}
    )


# --- usage --------------------------------------------------------------------------------


def test_usage_splits_cached_tokens_out_of_prompt_tokens_as_documented():
    # OpenAI's prompt-caching guide example.
    usage = usage_from_openai(
        {
            "prompt_tokens": 2006,
            "completion_tokens": 300,
            "total_tokens": 2306,
            "prompt_tokens_details": {"cached_tokens": 1920},
            "completion_tokens_details": {"reasoning_tokens": 0},
        }
    )

    assert usage.to_dict() == {"input": 86, "output": 300, "cache_read": 1920, "cache_write": 0}
    assert usage.context_tokens == 2006


def test_cache_writes_are_split_out_of_prompt_tokens_too():
    usage = usage_from_openai(
        {
            "prompt_tokens": 2006,
            "completion_tokens": 300,
            "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 1920},
        }
    )

    assert (usage.input, usage.cache_read, usage.cache_write) == (86, 0, 1920)
    assert usage.context_tokens == 2006


def test_reasoning_tokens_are_counted_once_inside_completion_tokens():
    usage = usage_from_openai(
        {
            "prompt_tokens": 10,
            "completion_tokens": 500,
            "completion_tokens_details": {"reasoning_tokens": 448},
        }
    )

    assert usage.output == 500


def test_deepseek_cache_hits_fill_cache_read():
    usage = usage_from_openai(
        {
            "prompt_tokens": 120,
            "completion_tokens": 30,
            "prompt_cache_hit_tokens": 100,
            "prompt_cache_miss_tokens": 20,
        }
    )

    assert (usage.input, usage.cache_read) == (20, 100)


def test_missing_usage_is_none_not_zero():
    assert usage_from_openai(None) is None


# --- request ------------------------------------------------------------------------------


def test_openai_system_prompt_goes_first_as_a_developer_message():
    body = _build(OPENAI)

    assert body["messages"][0] == {"role": "developer", "content": "Be brief."}


def test_compatible_vendors_get_a_system_message():
    assert _build(OLLAMA)["messages"][0] == {"role": "system", "content": "Be brief."}


def test_user_parts_map_to_text_image_and_file_parts_without_cache_marks():
    user = _build()["messages"][1]

    assert user["content"] == [
        {"type": "text", "text": "Read these"},
        {"type": "image_url", "image_url": {"url": PNG}},
        {"type": "file", "file": {"filename": "a.pdf", "file_data": PDF}},
    ]


def test_assistant_tool_calls_carry_json_string_arguments_and_null_content():
    assistant = _build()["messages"][2]

    assert assistant == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"q":"é"}'},
            }
        ],
    }


def test_reasoning_and_extras_never_reach_the_wire():
    raw = json.dumps(_build())

    assert "secret thoughts" not in raw
    assert "_anthropic" not in raw
    assert "cache_control" not in raw


def test_tool_results_are_tool_messages_named_only_where_the_vendor_needs_it():
    assert _build(OPENAI)["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "42",
    }
    assert _build(MISTRAL)["messages"][3]["name"] == "lookup"


def test_tools_are_function_tools_and_strict_is_never_switched_on():
    tool = _build()["tools"][0]

    assert tool == {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a thing up",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }


def test_a_tools_own_strict_flag_passes_only_where_the_vendor_accepts_it():
    tools = [{**TOOLS[0], "strict": True}]

    assert _build(OPENAI, tools=tools)["tools"][0]["function"]["strict"] is True
    assert "strict" not in _build(OLLAMA, tools=tools)["tools"][0]["function"]


def test_streaming_asks_for_usage_when_the_vendor_supports_it():
    body = _build(OPENAI)
    no_usage = replace(OLLAMA, compat=replace(OLLAMA.compat, usage_in_stream=False))

    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert "stream_options" not in _build(no_usage)
    assert "stream" not in _build(stream=False)


def test_max_tokens_uses_the_vendors_field_name_and_temperature_passes():
    settings = {"max_tokens": 100, "temperature": 0.2}

    assert _build(OPENAI, settings=settings)["max_completion_tokens"] == 100
    assert _build(OLLAMA, settings=settings)["max_tokens"] == 100
    assert _build(OLLAMA, settings=settings)["temperature"] == 0.2


# Mistral's tool-result `name` is its own extension, outside OpenAI's types.
@pytest.mark.parametrize("descriptor", [OPENAI, OLLAMA, DEEPSEEK])
@pytest.mark.parametrize("stream", [True, False])
def test_request_bodies_validate_against_the_sdk_types(descriptor, stream):
    validate_openai_chat_request(_build(descriptor, stream=stream, settings={"max_tokens": 5}))


def test_the_same_history_gives_byte_identical_bodies():
    assert json.dumps(_build()) == json.dumps(_build())


# --- stream parsing -----------------------------------------------------------------------


def test_text_deltas_stream_and_assemble_into_the_turn():
    parser = CompletionsStreamParser(model="m")
    chunks, turn = run(
        parser,
        [
            chunk({"role": "assistant", "content": "Hel"}),
            chunk({"content": "lo"}),
            chunk(finish="stop"),
            ev("[DONE]"),
        ],
    )

    assert [c.text for c in chunks] == ["Hel", "lo"]
    assert turn.text == "Hello"
    assert turn.finish_reason == "stop"
    assert turn.usage is None


def test_usage_chunk_after_finish_is_read():
    usage = {
        "prompt_tokens": 2006,
        "completion_tokens": 300,
        "prompt_tokens_details": {"cached_tokens": 1920},
    }
    _, turn = run(
        CompletionsStreamParser(model="m"),
        [
            chunk({"content": "x"}),
            chunk(finish="stop"),
            ev({"id": "c", "choices": [], "usage": usage}),
            ev("[DONE]"),
        ],
    )

    assert turn.usage.to_dict() == {
        "input": 86,
        "output": 300,
        "cache_read": 1920,
        "cache_write": 0,
    }


def test_reasoning_comes_from_the_declared_field_only():
    events = [
        chunk({"reasoning_content": "think", "reasoning": "other"}),
        chunk({"content": "ok"}, finish="stop"),
    ]

    chunks, turn = run(CompletionsStreamParser(model="m", reasoning_field="reasoning"), events)

    assert [c.reasoning for c in chunks if c.reasoning] == ["other"]
    assert turn.reasoning == "other"


def test_without_a_declared_field_either_reasoning_spelling_is_read():
    _, turn = run(
        CompletionsStreamParser(model="m"),
        [chunk({"reasoning_content": "a"}), chunk({"reasoning": "b"}, finish="stop")],
    )

    assert turn.reasoning == "ab"


def test_tool_call_fragments_assemble_per_index():
    events = [
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q":'}}]}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "other", "arguments": "{}"},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "x"}'}}]}),
        chunk(finish="tool_calls"),
        ev("[DONE]"),
    ]
    chunks, turn = run(CompletionsStreamParser(model="m"), events)

    deltas = [c.tool_call_delta for c in chunks]
    assert deltas[0] == {"index": 0, "id": "call_a", "name": "lookup", "arguments": ""}
    assert deltas[1] == {"index": 0, "id": None, "name": None, "arguments": '{"q":'}
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("call_a", "lookup", {"q": "x"}),
        ("call_b", "other", {}),
    ]
    assert turn.finish_reason == "tool_calls"


def test_calls_that_all_claim_index_zero_stay_apart_by_id():
    events = [
        chunk(
            {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}]}
        ),
        chunk(
            {"tool_calls": [{"index": 0, "id": "b", "function": {"name": "g", "arguments": "{}"}}]}
        ),
        chunk(finish="tool_calls"),
    ]
    _, turn = run(CompletionsStreamParser(model="m"), events)

    assert [c.id for c in turn.tool_calls] == ["a", "b"]


def test_invalid_argument_json_is_reported_on_the_turn_not_raised():
    events = [
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "c", "function": {"name": "f", "arguments": '{"a": '}}
                ]
            }
        ),
        chunk(finish="tool_calls"),
    ]
    _, turn = run(CompletionsStreamParser(model="m"), events)

    call = turn.tool_calls[0]
    assert call.arguments == {}
    assert call.raw_arguments == '{"a": '
    assert "not valid JSON" in call.error


def test_stop_with_calls_is_normalised_to_tool_calls():
    events = [
        chunk(
            {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": "{}"}}]}
        ),
        chunk(finish="stop"),
    ]

    assert run(CompletionsStreamParser(model="m"), events)[1].finish_reason == "tool_calls"


def test_vendor_finish_reasons_are_kept():
    _, turn = run(CompletionsStreamParser(model="m"), [chunk({"content": "x"}, finish="length")])

    assert turn.finish_reason == "length"


def test_a_stream_cut_before_finish_raises_with_the_partial_turn():
    parser = CompletionsStreamParser(model="m")
    for event in [chunk({"content": "half a "}), chunk({"content": "sentence"})]:
        parser.feed(event)

    with pytest.raises(errors.StreamError) as info:
        parser.finish()
    assert info.value.partial.text == "half a sentence"


def test_an_error_chunk_raises_the_matching_provider_error():
    parser = CompletionsStreamParser(model="m")
    parser.feed(chunk({"content": "so far"}))

    with pytest.raises(errors.ProviderError) as info:
        parser.feed(
            ev(
                {
                    "error": {
                        "message": "You exceeded your current quota",
                        "type": "insufficient_quota",
                        "code": "insufficient_quota",
                    }
                }
            )
        )
    assert isinstance(info.value, errors.QuotaError)
    assert info.value.partial.text == "so far"


def test_events_after_done_are_ignored():
    parser = CompletionsStreamParser(model="m")
    _, turn = run(parser, [chunk({"content": "a"}), ev("[DONE]"), chunk({"content": "b"})])

    assert turn.text == "a"


# --- non-streamed -------------------------------------------------------------------------


def test_a_completion_object_parses_into_a_turn():
    turn = parse_completion(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "reasoning_content": "hmm",
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": '{"a":1}'},
                            }
                        ],
                    },
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3},
        },
        model="m",
        reasoning_field="reasoning_content",
    )

    assert turn.text is None
    assert turn.reasoning == "hmm"
    assert turn.tool_calls[0].arguments == {"a": 1}
    assert turn.usage.to_dict() == {"input": 10, "output": 3, "cache_read": 0, "cache_write": 0}


# --- client -------------------------------------------------------------------------------


class RecordingTransport:
    """The transport boundary: records calls, replays scripted events or a payload."""

    def __init__(self, events: list | None = None, payload: dict | None = None) -> None:
        self.events = events or []
        self.payload = payload
        self.calls: list[dict] = []
        self.closed = False

    async def astream_sse(self, url, *, headers, body, model, cancel=None):
        self.calls.append(
            {"url": url, "headers": dict(headers), "body": body, "model": model, "cancel": cancel}
        )
        for event in self.events:
            yield event

    def post_json(self, url, *, headers, body, model, cancel=None):
        self.calls.append(
            {"url": url, "headers": dict(headers), "body": body, "model": model, "cancel": cancel}
        )
        return self.payload

    def close(self):
        self.closed = True


def _client(descriptor=OPENAI, api_key="sk-test", base_url=None, transport=None):
    return OpenAICompletionsClient(
        descriptor,
        api_key=api_key,
        base_url=base_url,
        transport=transport or RecordingTransport(),
        capabilities=lambda model: ModelCapabilities(tools=True),
    )


def test_a_missing_key_fails_before_any_request():
    transport = RecordingTransport()
    client = _client(api_key=None, transport=transport)

    with pytest.raises(errors.AuthenticationError, match="no API key configured for OpenAI"):
        list(client.stream(model="gpt-x", messages=[{"role": "user", "content": "hi"}]))
    assert transport.calls == []


def test_stream_posts_to_chat_completions_with_bearer_auth_and_the_cancel_token():
    transport = RecordingTransport([chunk({"content": "hi"}), chunk(finish="stop"), ev("[DONE]")])
    client = _client(base_url="http://127.0.0.1:9/v1/", transport=transport)
    token = CancelToken()

    chunks = list(
        client.stream(model="gpt-x", messages=[{"role": "user", "content": "hi"}], cancel=token)
    )

    call = transport.calls[0]
    assert call["url"] == "http://127.0.0.1:9/v1/chat/completions"
    assert call["headers"]["Authorization"] == "Bearer sk-test"
    assert call["cancel"] is token
    assert call["model"] == "gpt-x"
    assert chunks[-1].turn.text == "hi"
    assert [c.turn is not None for c in chunks] == [False, True]


def test_keyless_vendors_send_no_authorization_header():
    transport = RecordingTransport(
        payload={"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}
    )
    client = _client(OLLAMA, api_key=None, transport=transport)

    turn = client.complete(model="llama3.3", messages=[{"role": "user", "content": "hi"}])

    assert turn.text == "ok"
    assert "Authorization" not in transport.calls[0]["headers"]
    assert transport.calls[0]["url"] == "http://localhost:11434/v1/chat/completions"


def test_a_transport_failure_mid_stream_keeps_the_partial_text():
    async def broken(url, **kwargs):
        yield chunk({"content": "partial"})
        raise errors.StreamError("connection reset")

    transport = RecordingTransport()
    transport.astream_sse = broken
    client = _client(transport=transport)

    with pytest.raises(errors.StreamError) as info:
        list(client.stream(model="gpt-x", messages=[{"role": "user", "content": "hi"}]))
    assert info.value.partial.text == "partial"


def test_close_closes_the_transport():
    transport = RecordingTransport()
    _client(transport=transport).close()

    assert transport.closed


def test_the_request_validator_catches_a_misspelled_part_type():
    body = _build()
    body["messages"][1]["content"][0]["type"] = "txt"

    with pytest.raises(Exception, match="validation error"):
        validate_openai_chat_request(body)


def test_an_empty_usage_object_is_none_not_zero():
    assert usage_from_openai({}) is None


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


def _live_client(server, transport, descriptor=DEEPSEEK):
    return OpenAICompletionsClient(
        descriptor,
        api_key="test-key",
        base_url=server.base_url,
        transport=transport,
        capabilities=lambda model: ModelCapabilities(tools=True),
    )


USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]


def test_end_to_end_stream_with_reasoning_tool_call_and_usage(transport):
    with OpenAIChatFake(reasoning_field="reasoning_content") as server:
        server.push(
            fake.Reply(
                fake.reasoning("Need the tool."),
                fake.text("Checking."),
                fake.tool_call("weather", {"city": "Zürich"}, id="call_w"),
                fake.usage(input=86, output=300, cache_read=1920),
            )
        )
        chunks = list(
            _live_client(server, transport).stream(model="gpt-fake", messages=USER, tools=TOOLS)
        )

        body = server.last_request.body
    turn = chunks[-1].turn
    validate_openai_chat_request(body)
    assert body["stream_options"] == {"include_usage": True}
    assert turn.reasoning == "Need the tool."
    assert turn.text == "Checking."
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("call_w", "weather", {"city": "Zürich"})
    ]
    assert turn.finish_reason == "tool_calls"
    assert (turn.usage.input, turn.usage.cache_read, turn.usage.output) == (86, 1920, 300)
    assert len([c for c in chunks if c.tool_call_delta]) > 1


def test_end_to_end_tool_round_trip_is_accepted_by_the_server(transport):
    with OpenAIChatFake() as server:
        server.push(
            fake.Reply(fake.tool_call("weather", {"city": "Bern"}, id="call_1")),
            fake.Reply(fake.text("Sunny.")),
        )
        client = _live_client(server, transport)
        first = client.complete(model="gpt-fake", messages=USER, tools=TOOLS)
        history = [
            *USER,
            {
                "role": "assistant",
                "content": first.text,
                "tool_calls": [c.to_dict() for c in first.tool_calls],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
        second = client.complete(model="gpt-fake", messages=history, tools=TOOLS)

        sent = server.last_request.body
    assert second.text == "Sunny."
    assert sent["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    validate_openai_chat_request(sent)


def test_end_to_end_truncated_stream_raises_with_partial_text(transport):
    with OpenAIChatFake() as server:
        server.push(fake.Reply(fake.text("Half an answer"), fake.truncate()))
        with pytest.raises(errors.StreamError) as info:
            list(_live_client(server, transport).stream(model="gpt-fake", messages=USER))

    assert info.value.partial.text == "Half an answer"


def test_end_to_end_error_event_after_200_is_translated(transport):
    with OpenAIChatFake() as server:
        server.push(fake.Reply(fake.text("So far"), fake.error_event("quota")))
        with pytest.raises(errors.QuotaError) as info:
            list(_live_client(server, transport).stream(model="gpt-fake", messages=USER))

    assert info.value.partial.text == "So far"


def test_end_to_end_http_error_is_translated(transport):
    with OpenAIChatFake() as server:
        server.push(fake.Reply(fake.model_not_found()))
        with pytest.raises(errors.NoAccessError):
            _live_client(server, transport).complete(model="gpt-fake", messages=USER)


def test_end_to_end_cancel_closes_the_upstream_stream(transport):
    token = CancelToken()
    with OpenAIChatFake() as server:
        server.push(fake.Reply(fake.text("tick " * 200), delay=0.05))
        stream = _live_client(server, transport).stream(
            model="gpt-fake", messages=USER, cancel=token
        )
        first = next(stream)
        threading.Timer(0.1, token.cancel).start()
        with pytest.raises(errors.RequestCancelled) as info:
            list(stream)

        assert server.wait_for_disconnect(5.0)
    assert first.text
    assert info.value.partial is not None and info.value.partial.text


def test_end_to_end_stream_without_usage_reports_none(transport):
    quiet = replace(OLLAMA, compat=replace(OLLAMA.compat, usage_in_stream=False))
    with OpenAIChatFake(api_key=None, report_usage=False) as server:
        server.push(fake.Reply(fake.text("Hi")))
        chunks = list(
            _live_client(server, transport, quiet).stream(model="gpt-fake", messages=USER)
        )

    assert chunks[-1].turn.text == "Hi"
    assert chunks[-1].turn.usage is None
