from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response

from providers import errors
from providers.cancel import CancelToken
from providers.context import build_context
from providers.outbound import OutboundPolicy
from providers.registry import OPENAI_RESPONSES, get_descriptor
from providers.transport import Transport
from providers.types import ModelCapabilities
from providers.wire.openai_responses import (
    ENCRYPTED_REASONING,
    OpenAIResponsesClient,
    ResponsesStreamParser,
    build_request,
    parse_response,
    usage_from_responses,
)
from tests.fakes import script as fake
from tests.fakes.openai_responses import OpenAIResponsesFake, open_seal, seal_reasoning
from tests.fakes.validate import (
    RequestValidationError,
    validate_openai_responses_event,
    validate_openai_responses_request,
)

OPENAI = get_descriptor("openai")
MODEL = "gpt-5.5"
KEY = "test-key"
REASONS = ModelCapabilities(reasoning=True, tools=True)
PLAIN = ModelCapabilities(reasoning=False, tools=True)
PNG_URL = "data:image/png;base64,iVBORw0KGgo="
PDF_DATA = "JVBERi0xLjQK"
RS_ITEM = {
    "id": "rs_1",
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": "Plan."}],
    "encrypted_content": "gAAAAA-opaque",
}
TOOLS = [
    {
        "name": "lookup",
        "description": "Look up",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        "cache_control": {"type": "ephemeral"},
    }
]


def ev(payload: dict) -> SimpleNamespace:
    return SimpleNamespace(event=payload["type"], data=json.dumps(payload), id=None, retry=None)


def _assistant(model: str = MODEL) -> dict:
    return {
        "role": "assistant",
        "content": "Checking both.",
        "reasoning": "Plan.",
        "usage": {"input": 1, "output": 2},
        "extras": {
            "_openai": {"model": model, "items": [RS_ITEM], "message": {"id": "msg_real"}},
            "_anthropic": {"model": "claude", "thinking": []},
        },
        "tool_calls": [
            {"id": "call_1", "name": "lookup", "arguments": {"q": "a"}},
            {"id": "call_2", "name": "lookup", "arguments": {"q": "b"}},
        ],
    }


def _conversation(model: str = MODEL) -> list[dict]:
    return [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look", "cache_control": {"type": "ephemeral"}},
                {"type": "image_url", "image_url": {"url": PNG_URL, "detail": "high"}},
                {"type": "file", "file": {"filename": "r.pdf", "file_data": PDF_DATA}},
            ],
        },
        _assistant(model),
        {"role": "tool", "tool_call_id": "call_1", "content": "A"},
        {
            "role": "tool",
            "tool_call_id": "call_2",
            "content": [
                {"type": "text", "text": "B, see"},
                {"type": "image_url", "image_url": {"url": PNG_URL}},
            ],
        },
        {"role": "user", "content": "And now?"},
    ]


def _build(messages=None, *, model=MODEL, stream=True, settings=None, caps=REASONS, tools=TOOLS):
    return build_request(
        build_context(_conversation() if messages is None else messages, tools),
        model=model,
        descriptor=OPENAI,
        stream=stream,
        settings=settings or {},
        capabilities=caps,
    )


# --- usage --------------------------------------------------------------------------------


def test_usage_maps_the_reasoning_guides_documented_example():
    # platform docs, "Reasoning models": reasoning tokens are inside output_tokens.
    usage = usage_from_responses(
        {
            "input_tokens": 75,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 1186,
            "output_tokens_details": {"reasoning_tokens": 1024},
            "total_tokens": 1261,
        }
    )

    assert usage.to_dict() == {"input": 75, "output": 1186, "cache_read": 0, "cache_write": 0}


def test_usage_takes_cached_tokens_out_of_input_tokens():
    usage = usage_from_responses(
        {
            "input_tokens": 2006,
            "input_tokens_details": {"cached_tokens": 1920},
            "output_tokens": 300,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 2306,
        }
    )

    assert usage.to_dict() == {"input": 86, "output": 300, "cache_read": 1920, "cache_write": 0}
    assert usage.context_tokens == 2006


def test_usage_takes_cache_writes_out_of_input_tokens_where_reported():
    usage = usage_from_responses(
        {
            "input_tokens": 1000,
            "input_tokens_details": {"cached_tokens": 100, "cache_write_tokens": 800},
            "output_tokens": 5,
        }
    )

    assert (usage.input, usage.cache_read, usage.cache_write) == (100, 100, 800)


@pytest.mark.parametrize("value", [None, {}, {"total_tokens": 3}])
def test_no_usage_reported_is_none(value):
    assert usage_from_responses(value) is None


# --- request ------------------------------------------------------------------------------


def test_system_becomes_instructions_and_state_is_never_stored():
    body = _build()

    assert body["instructions"] == "Be brief."
    assert body["store"] is False
    assert body["stream"] is True
    assert all(item.get("role") not in ("system", "developer") for item in body["input"])


def test_user_parts_become_input_text_image_and_file():
    user = _build()["input"][0]

    assert user == {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "Look"},
            {"type": "input_image", "image_url": PNG_URL, "detail": "high"},
            {
                "type": "input_file",
                "filename": "r.pdf",
                "file_data": f"data:application/pdf;base64,{PDF_DATA}",
            },
        ],
    }


def test_reasoning_message_and_calls_are_replayed_in_order_to_the_same_model():
    items = _build()["input"]

    assert items[1:5] == [
        RS_ITEM,
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_real",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Checking both.", "annotations": []}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "lookup",
            "arguments": '{"q":"a"}',
        },
        {
            "type": "function_call",
            "call_id": "call_2",
            "name": "lookup",
            "arguments": '{"q":"b"}',
        },
    ]


def test_encrypted_reasoning_is_not_sent_to_another_model():
    body = _build(_conversation(model="gpt-5.4"))
    raw = json.dumps(body)

    assert "gAAAAA-opaque" not in raw
    assert "msg_real" not in raw
    assert body["input"][1]["type"] == "message"
    assert body["input"][1]["id"] == "msg_0"


def test_display_reasoning_and_other_providers_sidecars_never_reach_the_wire():
    raw = json.dumps(_build(_conversation(model="other")))

    assert "Plan." not in raw
    assert "_anthropic" not in raw
    assert "_openai" not in raw
    assert "cache_control" not in raw


def test_tool_results_are_function_call_outputs_with_images_as_parts():
    items = _build()["input"]

    assert items[5] == {"type": "function_call_output", "call_id": "call_1", "output": "A"}
    assert items[6] == {
        "type": "function_call_output",
        "call_id": "call_2",
        "output": [
            {"type": "input_text", "text": "B, see"},
            {"type": "input_image", "image_url": PNG_URL, "detail": "auto"},
        ],
    }
    assert items[7]["content"] == [{"type": "input_text", "text": "And now?"}]


def test_tools_are_flat_function_tools_and_strict_only_when_declared():
    strict_tool = {**TOOLS[0], "name": "exact", "strict": True}

    tools = _build(tools=[TOOLS[0], strict_tool])["tools"]

    assert tools[0] == {
        "type": "function",
        "name": "lookup",
        "description": "Look up",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        "strict": False,
    }
    assert tools[1]["strict"] is True


@pytest.mark.parametrize(
    ("effort", "reasoning"),
    [
        ("low", {"effort": "low", "summary": "auto"}),
        ("medium", {"effort": "medium", "summary": "auto"}),
        ("HIGH", {"effort": "high", "summary": "auto"}),
        (None, {"summary": "auto"}),
    ],
)
def test_reasoning_effort_goes_out_with_summaries_and_encrypted_content(effort, reasoning):
    body = _build(settings={"reasoning_effort": effort})

    assert body["reasoning"] == reasoning
    assert body["include"] == [ENCRYPTED_REASONING]


def test_reasoning_off_omits_the_effort_but_keeps_encrypted_content():
    body = _build(settings={"reasoning_effort": "off"})

    assert "reasoning" not in body
    assert body["include"] == [ENCRYPTED_REASONING]


@pytest.mark.parametrize("caps", [PLAIN, ModelCapabilities(), None])
def test_a_model_not_known_to_reason_gets_no_reasoning_fields(caps):
    body = _build(settings={"reasoning_effort": "high"}, caps=caps)

    assert "reasoning" not in body
    assert "include" not in body


def test_a_misspelt_effort_is_refused():
    with pytest.raises(ValueError, match="reasoning_effort"):
        _build(settings={"reasoning_effort": "hihg"})


def test_temperature_only_reaches_a_model_known_not_to_reason():
    assert "temperature" not in _build(settings={"temperature": 0.2})
    assert _build(settings={"temperature": 0.2}, caps=PLAIN)["temperature"] == 0.2


def test_max_tokens_becomes_max_output_tokens():
    assert _build(settings={"max_tokens": 1234})["max_output_tokens"] == 1234


def test_the_session_cache_key_is_sent_as_prompt_cache_key():
    assert _build(settings={"cache_key": "session-1"})["prompt_cache_key"] == "session-1"


@pytest.mark.parametrize("stream", [True, False])
def test_request_bodies_validate_against_the_sdk_types(stream):
    validate_openai_responses_request(
        _build(stream=stream, settings={"reasoning_effort": "high", "max_tokens": 9})
    )


def test_the_request_validator_catches_a_misspelt_item():
    body = _build()
    body["input"][3]["callid"] = body["input"][3].pop("call_id")

    with pytest.raises(RequestValidationError):
        validate_openai_responses_request(body)


# --- stream parsing -----------------------------------------------------------------------


def _stream(*, encrypted_on_added: str = "partial") -> list:
    rs = {"id": "rs_1", "type": "reasoning", "summary": []}
    msg = {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant"}
    fc = {
        "id": "fc_1",
        "type": "function_call",
        "status": "in_progress",
        "arguments": "",
        "call_id": "call_1",
        "name": "lookup",
    }
    full_rs = {
        **rs,
        "summary": [
            {"type": "summary_text", "text": "Plan a."},
            {"type": "summary_text", "text": "Plan b."},
        ],
        "encrypted_content": "gAAAAA-full",
    }
    return [
        ev({"type": "response.created", "response": {"id": "resp_1", "model": MODEL}}),
        ev({"type": "response.in_progress", "response": {"id": "resp_1"}}),
        ev(
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**rs, "encrypted_content": encrypted_on_added},
            }
        ),
        ev({"type": "response.reasoning_summary_part.added", "output_index": 0}),
        ev(
            {
                "type": "response.reasoning_summary_text.delta",
                "output_index": 0,
                "summary_index": 0,
                "delta": "Plan ",
            }
        ),
        ev(
            {
                "type": "response.reasoning_summary_text.delta",
                "output_index": 0,
                "summary_index": 0,
                "delta": "a.",
            }
        ),
        ev(
            {
                "type": "response.reasoning_summary_text.delta",
                "output_index": 0,
                "summary_index": 1,
                "delta": "Plan b.",
            }
        ),
        ev({"type": "response.output_item.done", "output_index": 0, "item": full_rs}),
        ev(
            {
                "type": "response.output_item.added",
                "output_index": 1,
                "item": {**msg, "content": []},
            }
        ),
        ev({"type": "response.output_text.delta", "output_index": 1, "delta": "Checking "}),
        ev({"type": "response.output_text.delta", "output_index": 1, "delta": "it."}),
        ev(
            {
                "type": "response.output_item.done",
                "output_index": 1,
                "item": {
                    **msg,
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "Checking it.", "annotations": []}],
                },
            }
        ),
        ev({"type": "response.output_item.added", "output_index": 2, "item": fc}),
        ev(
            {
                "type": "response.function_call_arguments.delta",
                "output_index": 2,
                "delta": '{"q": ',
            }
        ),
        ev({"type": "response.function_call_arguments.delta", "output_index": 2, "delta": '"a"}'}),
        ev(
            {
                "type": "response.function_call_arguments.done",
                "output_index": 2,
                "arguments": '{"q": "a"}',
            }
        ),
        ev(
            {
                "type": "response.output_item.done",
                "output_index": 2,
                "item": {**fc, "status": "completed", "arguments": '{"q": "a"}'},
            }
        ),
        ev(
            {
                "type": "response.completed",
                "response": {
                    "id": "resp_1",
                    "status": "completed",
                    "output": [],
                    "usage": {
                        "input_tokens": 75,
                        "input_tokens_details": {"cached_tokens": 0},
                        "output_tokens": 1186,
                        "output_tokens_details": {"reasoning_tokens": 1024},
                    },
                },
            }
        ),
    ]


def run(events: list, model: str = MODEL) -> tuple[list, Any]:
    parser = ResponsesStreamParser(model=model)
    out = []
    for event in events:
        out.extend(parser.feed(event))
    return out, parser.finish()


def test_a_reasoning_text_and_tool_stream_assembles_into_the_turn():
    chunks, turn = run(_stream())

    assert "".join(c.reasoning for c in chunks if c.reasoning) == "Plan a.\n\nPlan b."
    assert [c.text for c in chunks if c.text] == ["Checking ", "it."]
    assert turn.text == "Checking it."
    assert turn.reasoning == "Plan a.\n\nPlan b."
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("call_1", "lookup", {"q": "a"})
    ]
    assert turn.finish_reason == "tool_calls"
    assert turn.usage.to_dict() == {"input": 75, "output": 1186, "cache_read": 0, "cache_write": 0}
    assert turn.raw == {"id": "resp_1", "model": MODEL}


def test_the_encrypted_reasoning_is_taken_from_output_item_done():
    _, turn = run(_stream(encrypted_on_added="gAAAAA-trunc"))

    sidecar = turn.extras["_openai"]
    assert sidecar["model"] == MODEL
    assert [item["encrypted_content"] for item in sidecar["items"]] == ["gAAAAA-full"]
    assert sidecar["message"] == {"id": "msg_1"}


def test_tool_call_deltas_carry_the_call_ordinal_and_first_fragment_identity():
    chunks, _ = run(_stream())
    deltas = [c.tool_call_delta for c in chunks if c.tool_call_delta]

    assert deltas[0] == {"index": 0, "id": "call_1", "name": "lookup", "arguments": ""}
    assert "".join(d["arguments"] for d in deltas) == '{"q": "a"}'


def test_a_streamed_turn_replays_its_reasoning_on_the_next_request():
    _, turn = run(_stream())
    history = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": turn.text,
            "reasoning": turn.reasoning,
            "extras": turn.extras,
            "tool_calls": [c.to_dict() for c in turn.tool_calls],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "A"},
    ]

    items = _build(history)["input"]

    assert [item["type"] for item in items] == [
        "message",
        "reasoning",
        "message",
        "function_call",
        "function_call_output",
    ]
    assert items[1]["encrypted_content"] == "gAAAAA-full"
    assert items[2]["id"] == "msg_1"


def test_reasoning_items_without_encrypted_content_are_not_kept():
    events = _stream()
    events[7] = ev(
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {"id": "rs_1", "type": "reasoning", "summary": []},
        }
    )

    _, turn = run(events)

    assert turn.extras["_openai"]["items"] == []


def test_invalid_tool_json_is_reported_on_the_turn():
    events = _stream()
    events[15] = ev(
        {"type": "response.function_call_arguments.done", "output_index": 2, "arguments": "{"}
    )
    events[16] = ev(
        {
            "type": "response.output_item.done",
            "output_index": 2,
            "item": {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"},
        }
    )

    _, turn = run(events)

    call = turn.tool_calls[0]
    assert (call.arguments, call.raw_arguments) == ({}, "{")
    assert call.error


def test_a_stream_without_response_completed_raises_with_the_partial_turn():
    parser = ResponsesStreamParser(model=MODEL)
    for event in _stream()[:10]:
        parser.feed(event)

    with pytest.raises(errors.StreamError) as info:
        parser.finish()
    assert info.value.partial.text == "Checking "
    assert info.value.partial.reasoning == "Plan a.\n\nPlan b."


def test_an_error_event_after_200_raises_the_matching_error_with_the_partial_turn():
    parser = ResponsesStreamParser(model=MODEL)
    for event in _stream()[:11]:
        parser.feed(event)

    with pytest.raises(errors.RateLimitError) as info:
        parser.feed(
            ev(
                {
                    "type": "error",
                    "code": "rate_limit_exceeded",
                    "message": "Rate limit reached",
                    "param": None,
                    "sequence_number": 11,
                }
            )
        )
    assert info.value.partial.text == "Checking it."


def test_response_failed_raises_with_the_partial_turn():
    parser = ResponsesStreamParser(model=MODEL)
    for event in _stream()[:11]:
        parser.feed(event)
    failed = {
        "type": "response.failed",
        "response": {
            "id": "resp_1",
            "status": "failed",
            "error": {"code": "server_error", "message": "The model crashed"},
        },
    }

    with pytest.raises(errors.StreamError, match="The model crashed") as info:
        parser.feed(ev(failed))
    assert info.value.partial.text == "Checking it."


def test_an_incomplete_response_finishes_with_length():
    events = [
        *_stream()[:12],
        ev(
            {
                "type": "response.incomplete",
                "response": {
                    "status": "incomplete",
                    "incomplete_details": {"reason": "max_output_tokens"},
                    "output": [],
                },
            }
        ),
    ]

    _, turn = run(events)

    assert turn.finish_reason == "length"
    assert turn.text == "Checking it."
    assert turn.usage is None


# --- non-streamed -------------------------------------------------------------------------


def test_a_response_object_parses_into_a_turn():
    turn = parse_response(
        {
            "id": "resp_1",
            "object": "response",
            "status": "completed",
            "model": MODEL,
            "output": [
                RS_ITEM,
                {
                    "id": "msg_9",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "phase": "final_answer",
                    "content": [{"type": "output_text", "text": "Hi", "annotations": []}],
                },
                {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "c1",
                    "name": "f",
                    "arguments": '{"a": 1}',
                },
            ],
            "usage": {
                "input_tokens": 10,
                "input_tokens_details": {"cached_tokens": 4},
                "output_tokens": 3,
            },
        },
        model=MODEL,
    )

    assert turn.text == "Hi"
    assert turn.reasoning == "Plan."
    assert turn.tool_calls[0].arguments == {"a": 1}
    assert turn.finish_reason == "tool_calls"
    assert turn.extras["_openai"] == {
        "model": MODEL,
        "items": [RS_ITEM],
        "message": {"id": "msg_9", "phase": "final_answer"},
    }
    assert turn.usage.to_dict() == {"input": 6, "output": 3, "cache_read": 4, "cache_write": 0}


def test_a_failed_response_object_raises():
    with pytest.raises(errors.RateLimitError):
        parse_response(
            {
                "status": "failed",
                "output": [],
                "error": {"code": "rate_limit_exceeded", "message": "slow down"},
            },
            model=MODEL,
        )


# --- client -------------------------------------------------------------------------------


class RecordingTransport:
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


def _client(api_key="sk-test", transport=None, caps=REASONS, base_url=None):
    return OpenAIResponsesClient(
        OPENAI,
        api_key=api_key,
        base_url=base_url,
        transport=transport or RecordingTransport(),
        capabilities=lambda model: caps,
    )


def test_a_missing_key_fails_before_any_request():
    transport = RecordingTransport()

    with pytest.raises(errors.AuthenticationError, match="no API key configured for OpenAI"):
        _client(api_key=None, transport=transport).complete(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
    assert transport.calls == []


def test_stream_posts_to_responses_with_bearer_auth_and_the_cancel_token():
    transport = RecordingTransport(_stream())
    token = CancelToken()

    chunks = list(
        _client(transport=transport).stream(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], cancel=token
        )
    )

    call = transport.calls[0]
    assert call["url"] == "https://api.openai.com/v1/responses"
    assert call["headers"]["Authorization"] == "Bearer sk-test"
    assert call["cancel"] is token
    assert call["body"]["stream"] is True
    assert chunks[-1].turn.tool_calls[0].arguments == {"q": "a"}


def test_the_factory_builds_this_client_for_the_responses_api():
    from providers.factory import build_provider_client

    assert OPENAI.api == OPENAI_RESPONSES
    client = build_provider_client(
        "openai",
        {"api_key": "sk", "base_url": "http://127.0.0.1:9/v1/"},
        None,
        transport=RecordingTransport(),
        capabilities=lambda model: REASONS,
    )
    assert isinstance(client, OpenAIResponsesClient)
    assert client.url == "http://127.0.0.1:9/v1/responses"


# --- the fake, driven by the official SDK -------------------------------------------------


@pytest.fixture
def server():
    with OpenAIResponsesFake(api_key=KEY) as fake:
        yield fake


def sdk(fake: OpenAIResponsesFake, **options: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=fake.base_url, api_key=KEY, max_retries=0, **options)


def raw_events(fake: OpenAIResponsesFake, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Events as framed on the wire; each one's `event:` name must equal its `type`."""
    events, name, data = [], None, []
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream(
        "POST", fake.base_url + "/responses", json=body, headers=headers, timeout=10
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data.append(line[len("data: ") :])
            elif line == "" and data:
                payload = json.loads("\n".join(data))
                assert payload["type"] == name
                events.append(payload)
                name, data = None, []
    return events


SDK_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": False,
}


def test_sdk_stream_helper_builds_the_final_response(server):
    server.push(
        fake.Reply(
            fake.reasoning("The user wants weather."),
            fake.text("Checking."),
            fake.tool_call("get_weather", {"city": "Oslo"}, id="call_1"),
            fake.usage(input=100, output=40, cache_read=300, reasoning=25),
        )
    )
    with sdk(server).responses.stream(
        model="gpt-fake",
        input="weather?",
        tools=[SDK_TOOL],
        include=[ENCRYPTED_REASONING],
        store=False,
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        response = stream.get_final_response()

    reasoning, message, call = response.output
    assert "".join(deltas) == "Checking." == response.output_text
    assert reasoning.type == "reasoning"
    assert reasoning.summary[0].text == "The user wants weather."
    assert open_seal(reasoning.encrypted_content) == {"id": reasoning.id, "model": "gpt-fake"}
    assert message.type == "message" and message.status == "completed"
    assert (call.call_id, call.name, json.loads(call.arguments)) == (
        "call_1",
        "get_weather",
        {"city": "Oslo"},
    )
    usage = response.usage
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens) == (400, 300)
    assert (usage.output_tokens, usage.output_tokens_details.reasoning_tokens) == (40, 25)


def test_every_event_validates_in_the_real_order(server):
    server.push(
        fake.Reply(
            fake.reasoning("a"), fake.reasoning("b"), fake.text("Hi "), fake.tool_call("f", {})
        )
    )
    events = raw_events(
        server,
        {"model": "m", "input": "hi", "stream": True, "include": [ENCRYPTED_REASONING]},
    )

    for event in events:
        validate_openai_responses_event(event)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done")
    assert kinds.count("response.reasoning_summary_part.added") == 2
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[2]["item"].get("encrypted_content") is None
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done[0]["encrypted_content"] == seal_reasoning(done[0]["id"], "m")


def test_sdk_create_with_stream_true_yields_typed_events(server):
    server.push(fake.Reply(fake.text("one two")))
    events = list(sdk(server).responses.create(model="m", input="hi", stream=True))

    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "one two"


def test_non_streaming_response_validates(server):
    server.push(
        fake.Reply(fake.reasoning("why"), fake.text("Because."), fake.usage(input=3, output=4))
    )
    response = sdk(server).responses.create(model="m", input="hi")

    assert isinstance(response, Response)
    assert response.output_text == "Because."
    assert response.status == "completed"
    assert response.output[0].encrypted_content is None  # not requested
    assert (response.usage.input_tokens, response.usage.output_tokens) == (3, 4)


def test_encrypted_reasoning_sent_back_intact_is_accepted(server):
    server.push(fake.Reply(fake.reasoning("plan"), fake.tool_call("get_weather", {}, id="c9")))
    client = sdk(server)
    first = client.responses.create(
        model="m", input="go", include=[ENCRYPTED_REASONING], store=False, tools=[SDK_TOOL]
    )
    history = [
        {"role": "user", "content": "go"},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": "c9", "output": "sunny"},
    ]

    second = client.responses.create(model="m", input=history, store=False, tools=[SDK_TOOL])

    assert second.output_text == "sunny"


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda item: item.pop("encrypted_content"), "Items are not persisted"),
        (lambda item: item.update(encrypted_content="gAAAAAforged"), "could not be verified"),
        (lambda item: item.update(id="rs_other"), "could not be verified"),
    ],
)
def test_dropped_or_edited_encrypted_reasoning_is_refused(server, change, fragment):
    server.push(fake.Reply(fake.reasoning("plan"), fake.text("ok")))
    client = sdk(server)
    first = client.responses.create(
        model="m", input="go", include=[ENCRYPTED_REASONING], store=False
    )
    item = first.output[0].model_dump(exclude_none=True)
    change(item)

    with pytest.raises(openai.BadRequestError, match=fragment):
        client.responses.create(
            model="m", input=[item, {"role": "user", "content": "more"}], store=False
        )


def test_encrypted_reasoning_from_another_model_is_refused(server):
    server.push(fake.Reply(fake.reasoning("plan"), fake.text("ok")))
    client = sdk(server)
    first = client.responses.create(model="a", input="go", include=[ENCRYPTED_REASONING])

    with pytest.raises(openai.BadRequestError, match="could not be verified"):
        client.responses.create(
            model="b", input=[first.output[0].model_dump(exclude_none=True)], store=False
        )


@pytest.mark.parametrize(
    ("items", "fragment"),
    [
        (
            [{"type": "function_call_output", "call_id": "x", "output": "1"}],
            "No tool call found for function call output with call_id x",
        ),
        (
            [{"type": "function_call", "call_id": "y", "name": "f", "arguments": "{}"}],
            "No tool output found for function call y",
        ),
    ],
)
def test_unanswered_or_orphaned_tool_items_are_refused(server, items, fragment):
    with pytest.raises(openai.BadRequestError, match=fragment):
        sdk(server).responses.create(model="m", input=[{"role": "user", "content": "hi"}, *items])


@pytest.mark.parametrize(
    ("step", "error", "status", "code"),
    [
        (fake.rate_limited(retry_after=3), openai.RateLimitError, 429, "rate_limit_exceeded"),
        (fake.quota_exceeded(), openai.RateLimitError, 429, "insufficient_quota"),
        (fake.model_not_found(), openai.NotFoundError, 404, "model_not_found"),
        (fake.context_too_long(), openai.BadRequestError, 400, "context_length_exceeded"),
    ],
)
def test_http_errors_use_the_api_error_shape(server, step, error, status, code):
    server.push(step)
    with pytest.raises(error) as caught:
        sdk(server).responses.create(model="m", input="hi", stream=True)
    assert caught.value.status_code == status
    assert caught.value.code == code


def test_error_event_after_200_reaches_the_sdk_as_a_typed_event(server):
    server.push(fake.Reply(fake.text("partial"), fake.error_event("rate_limit")))
    events = list(sdk(server).responses.create(model="m", input="hi", stream=True))

    assert events[-1].type == "error"
    assert events[-1].code == "rate_limit_exceeded"


def test_failed_events_render_a_scripted_error_as_response_failed():
    with OpenAIResponsesFake(api_key=KEY, failed_events=True) as server:
        server.push(fake.Reply(fake.text("partial"), fake.error_event("server", "boom")))
        events = raw_events(server, {"model": "m", "input": "hi", "stream": True})

    for event in events:
        validate_openai_responses_event(event)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"] == {"code": "server_error", "message": "boom"}


def test_truncated_stream_has_no_terminal_event(server):
    server.push(fake.Reply(fake.text("half"), fake.truncate()))
    kinds = [e["type"] for e in raw_events(server, {"model": "m", "input": "hi", "stream": True})]

    assert "response.output_text.delta" in kinds
    assert "response.completed" not in kinds


def test_max_tokens_stop_is_an_incomplete_response(server):
    server.push(fake.Reply(fake.text("cut"), stop="max_tokens"))
    response = sdk(server).responses.create(model="m", input="hi")

    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"


def test_reset_mid_stream_is_a_connection_error(server):
    server.push(fake.Reply(fake.text("one two three"), fake.reset()))
    with pytest.raises(openai.APIConnectionError):
        list(sdk(server).responses.create(model="m", input="hi", stream=True))


def test_pause_mid_stream_trips_the_client_read_timeout(server):
    server.push(fake.Reply(fake.text("before"), fake.pause(3), fake.text("after")))
    client = sdk(server, timeout=openai.Timeout(5, read=0.3))
    with pytest.raises(openai.APITimeoutError):
        list(client.responses.create(model="m", input="hi", stream=True))


def test_unscripted_request_echoes_the_last_tool_output_or_user_text(server):
    answer = sdk(server).responses.create(
        model="m",
        input=[
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "42"},
        ],
    )
    assert answer.output_text == "42"
    assert sdk(server).responses.create(model="m", input="echo").output_text == "echo"


# --- end to end: our client, the real transport, the fake speaking the wire ---------------


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


def _live(server, transport, caps=REASONS):
    return OpenAIResponsesClient(
        OPENAI,
        api_key=KEY,
        base_url=server.base_url,
        transport=transport,
        capabilities=lambda model: caps,
    )


USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]
LIVE_TOOLS = [{"name": "weather", "description": "Weather", "parameters": {"type": "object"}}]


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


def _final(chunks) -> Any:
    return list(chunks)[-1].turn


def test_end_to_end_text_streams_and_parses(transport):
    with OpenAIResponsesFake() as server:
        server.push(fake.Reply(fake.text("Hello there"), fake.usage(input=3, output=2)))
        chunks = list(_live(server, transport).stream(model="gpt-fake", messages=USER))

        sent = server.last_request.body
    validate_openai_responses_request(sent)
    assert "".join(c.text for c in chunks if c.text) == "Hello there"
    turn = chunks[-1].turn
    assert (turn.text, turn.finish_reason) == ("Hello there", "stop")
    assert turn.usage.to_dict() == {"input": 3, "output": 2, "cache_read": 0, "cache_write": 0}


def test_end_to_end_reasoning_tool_round_trip_replays_encrypted_reasoning(transport):
    settings = {"reasoning_effort": "high", "max_tokens": 4096}
    with OpenAIResponsesFake() as server:
        server.push(
            fake.Reply(
                fake.reasoning("I should call the tool."),
                fake.text("Checking."),
                fake.tool_call("weather", {"city": "Bern"}, id="call_1"),
                fake.usage(input=50, output=30, cache_read=2000, reasoning=20),
            ),
            fake.Reply(fake.reasoning("Got it."), fake.text("Sunny.")),
        )
        client = _live(server, transport)
        first = _final(client.stream(model="gpt-fake", messages=USER, tools=LIVE_TOOLS, **settings))
        second = _final(
            client.stream(
                model="gpt-fake",
                messages=_history_after(first, "sunny"),
                tools=LIVE_TOOLS,
                **settings,
            )
        )
        sent = server.last_request.body

    validate_openai_responses_request(sent)
    assert first.reasoning == "I should call the tool."
    assert first.tool_calls[0].arguments == {"city": "Bern"}
    assert first.finish_reason == "tool_calls"
    assert first.usage.to_dict() == {
        "input": 50,
        "output": 30,
        "cache_read": 2000,
        "cache_write": 0,
    }
    assert sent["reasoning"] == {"effort": "high", "summary": "auto"}
    assert [item["type"] for item in sent["input"]] == [
        "message",
        "reasoning",
        "message",
        "function_call",
        "function_call_output",
    ]
    assert sent["input"][1] == first.extras["_openai"]["items"][0]
    assert second.text == "Sunny."
    assert second.reasoning == "Got it."


def test_end_to_end_another_model_continues_without_the_encrypted_reasoning(transport):
    with OpenAIResponsesFake() as server:
        server.push(fake.Reply(fake.reasoning("plan"), fake.tool_call("weather", {}, id="c1")))
        client = _live(server, transport)
        first = client.complete(model="gpt-a", messages=USER, tools=LIVE_TOOLS)
        second = client.complete(
            model="gpt-b", messages=_history_after(first, "done"), tools=LIVE_TOOLS
        )
        sent = server.last_request.body

    assert second.text == "done"
    assert all(item["type"] != "reasoning" for item in sent["input"])


def test_end_to_end_tampered_encrypted_reasoning_is_refused(transport):
    with OpenAIResponsesFake() as server:
        server.push(fake.Reply(fake.reasoning("Hmm."), fake.tool_call("weather", {}, id="t1")))
        client = _live(server, transport)
        first = client.complete(model="gpt-fake", messages=USER, tools=LIVE_TOOLS)
        history = _history_after(first, "ok")
        history[2]["extras"]["_openai"]["items"][0]["encrypted_content"] = "gAAAAAforged"

        with pytest.raises(errors.BadRequestError, match="could not be verified"):
            client.complete(model="gpt-fake", messages=history, tools=LIVE_TOOLS)


def test_end_to_end_non_streamed_response_parses(transport):
    with OpenAIResponsesFake() as server:
        server.push(
            fake.Reply(fake.reasoning("r"), fake.text("Hello"), fake.usage(input=3, output=2))
        )
        turn = _live(server, transport).complete(model="gpt-fake", messages=USER)

        sent = server.last_request.body
    validate_openai_responses_request(sent)
    assert turn.text == "Hello"
    assert turn.reasoning == "r"
    assert turn.finish_reason == "stop"
    assert turn.extras["_openai"]["items"][0]["type"] == "reasoning"


def test_end_to_end_truncated_stream_raises_with_partial_text(transport):
    with OpenAIResponsesFake() as server:
        server.push(fake.Reply(fake.text("Half an answer"), fake.truncate()))
        with pytest.raises(errors.StreamError) as info:
            list(_live(server, transport).stream(model="gpt-fake", messages=USER))

    assert info.value.partial.text == "Half an answer"


def test_end_to_end_reset_mid_stream_keeps_the_partial_text(transport):
    with OpenAIResponsesFake() as server:
        server.push(fake.Reply(fake.text("So far"), fake.reset()))
        with pytest.raises(errors.ProviderError) as info:
            list(_live(server, transport).stream(model="gpt-fake", messages=USER))

    assert info.value.partial.text == "So far"


@pytest.mark.parametrize("failed_events", [False, True])
def test_end_to_end_error_after_200_is_translated_with_the_partial(transport, failed_events):
    with OpenAIResponsesFake(failed_events=failed_events) as server:
        server.push(fake.Reply(fake.text("So far"), fake.error_event("rate_limit")))
        with pytest.raises(errors.RateLimitError) as info:
            list(_live(server, transport).stream(model="gpt-fake", messages=USER))

    assert info.value.partial.text == "So far"


def test_end_to_end_max_tokens_stop_finishes_with_length(transport):
    with OpenAIResponsesFake() as server:
        server.push(fake.Reply(fake.text("cut"), stop="max_tokens"))
        turn = _final(_live(server, transport).stream(model="gpt-fake", messages=USER))

    assert (turn.text, turn.finish_reason) == ("cut", "length")


@pytest.mark.parametrize(
    ("step", "error"),
    [
        (fake.rate_limited(retry_after=2), errors.RateLimitError),
        (fake.quota_exceeded(), errors.QuotaError),
        (fake.model_not_found(), errors.NoAccessError),
        (fake.context_too_long(), errors.ContextTooLongError),
    ],
)
def test_end_to_end_http_errors_are_translated(transport, step, error):
    with OpenAIResponsesFake() as server:
        server.push(step)
        with pytest.raises(error):
            list(_live(server, transport).stream(model="gpt-fake", messages=USER))


def test_end_to_end_a_wrong_key_is_an_authentication_error(transport):
    with (
        OpenAIResponsesFake(api_key="other") as server,
        pytest.raises(errors.AuthenticationError),
    ):
        _live(server, transport).complete(model="gpt-fake", messages=USER)
