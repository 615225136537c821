from __future__ import annotations

import json

import pytest

from providers import errors
from providers.cancel import CancelToken
from providers.context import build_context
from providers.eventstream import encode_message
from providers.factory import build_provider_client
from providers.outbound import OutboundPolicy
from providers.registry import get_descriptor
from providers.transport import Transport
from providers.types import ModelCapabilities
from providers.wire.bedrock_converse import (
    BedrockConverseClient,
    ConverseStreamParser,
    build_request,
    document_name,
    parse_response,
    refine_error,
    region_from_url,
    usage_from_bedrock,
)
from tests.fakes import script as fake
from tests.fakes.bedrock import (
    DEFAULT_ACCESS_KEY_ID,
    DEFAULT_SECRET_ACCESS_KEY,
    BedrockFake,
    validate_converse_request,
)

BEDROCK = get_descriptor("bedrock")
MODEL = "anthropic.claude-fake-v1:0"
OTHER_MODEL = "amazon.nova-pro-v1:0"
PNG_DATA = "iVBORw0KGgo="
PDF_DATA = "JVBERi0xLjQK"
BUDGET_CAPS = ModelCapabilities(reasoning=True, thinking="budget", max_output_tokens=64000)
SIGNED = {"reasoningContent": {"reasoningText": {"text": "Let me think.", "signature": "sig"}}}
REDACTED = {"reasoningContent": {"redactedContent": "b3BhcXVl"}}
TOOLS = [
    {
        "name": "weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]


def _assistant(model: str = MODEL) -> dict:
    return {
        "role": "assistant",
        "content": "Checking.",
        "reasoning": "Let me think.",
        "extras": {"_bedrock": {"model": model, "blocks": [SIGNED, REDACTED]}, "_gemini": {}},
        "tool_calls": [
            {"id": "tooluse_1", "name": "weather", "arguments": {"city": "Bern"}},
            {"id": "tooluse_2", "name": "weather", "arguments": {"city": "Chur"}},
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
                        "filename": "q3 report.v2.pdf",
                        "file_data": f"data:application/pdf;base64,{PDF_DATA}",
                    },
                },
            ],
        },
        _assistant(model),
        {"role": "tool", "tool_call_id": "tooluse_1", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "tooluse_2", "content": "", "is_error": True},
        {"role": "user", "content": "And now?"},
    ]


def _build(messages=None, *, model=MODEL, settings=None, caps=None, tools=TOOLS):
    return build_request(
        build_context(messages or _conversation(), tools),
        model=model,
        settings=settings or {},
        capabilities=caps,
    )


# --- usage --------------------------------------------------------------------------------


def test_usage_input_tokens_exclude_both_cache_buckets():
    usage = usage_from_bedrock(
        {
            "inputTokens": 12,
            "outputTokens": 40,
            "totalTokens": 3052,
            "cacheReadInputTokens": 2000,
            "cacheWriteInputTokens": 1000,
        }
    )
    assert usage.to_dict() == {"input": 12, "output": 40, "cache_read": 2000, "cache_write": 1000}
    assert usage.context_tokens == 3012


def test_no_usage_reported_is_none_not_zeros():
    assert usage_from_bedrock(None) is None
    assert usage_from_bedrock({}) is None


# --- request ------------------------------------------------------------------------------


def test_system_is_a_list_of_text_blocks_and_the_model_is_not_in_the_body():
    body = _build()
    assert body["system"] == [{"text": "Be brief."}]
    assert "modelId" not in body and "model" not in body


def test_user_parts_become_text_image_and_document_blocks_with_cache_points():
    content = _build()["messages"][0]["content"]
    assert content[0] == {"text": "Look"}
    assert content[1] == {"cachePoint": {"type": "default"}}
    assert content[2] == {"image": {"format": "png", "source": {"bytes": PNG_DATA}}}
    assert "https://example.com/cat.png" in content[3]["text"]
    assert content[4] == {
        "document": {"format": "pdf", "name": "q3 report-v2", "source": {"bytes": PDF_DATA}}
    }


def test_document_names_keep_only_allowed_characters_and_stay_unique():
    taken: set[str] = set()
    assert document_name("résumé_2024.pdf", taken) == "r-sum-2024"
    assert document_name("résumé_2024.pdf", taken) == "r-sum-2024 (2)"
    assert document_name(None, taken) == "document"


def test_reasoning_blocks_are_replayed_first_to_the_same_model():
    content = _build()["messages"][1]["content"]
    assert content[:2] == [SIGNED, REDACTED]
    assert content[2] == {"text": "Checking."}
    assert content[3] == {
        "toolUse": {"toolUseId": "tooluse_1", "name": "weather", "input": {"city": "Bern"}}
    }


def test_reasoning_blocks_are_not_sent_to_another_model():
    body = _build(_conversation(model=MODEL), model=OTHER_MODEL)
    assert not any("reasoningContent" in b for b in body["messages"][1]["content"])


def test_display_reasoning_and_other_providers_sidecars_never_reach_the_wire():
    raw = json.dumps(_build())
    assert "_gemini" not in raw and "_bedrock" not in raw
    assert raw.count("Let me think.") == 1  # only inside the signed block


def test_tool_results_and_the_next_user_message_merge_into_one_user_turn():
    messages = _build()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    content = messages[2]["content"]
    assert content[0] == {"toolResult": {"toolUseId": "tooluse_1", "content": [{"text": "Sunny"}]}}
    assert content[1] == {
        "toolResult": {
            "toolUseId": "tooluse_2",
            "content": [{"text": "(no output)"}],
            "status": "error",
        }
    }
    assert content[2] == {"text": "And now?"}


def test_tools_are_tool_specs_with_a_json_input_schema():
    tools = [{**TOOLS[0], "cache_control": {"type": "ephemeral"}}]
    config = _build(tools=tools)["toolConfig"]
    assert config["tools"][0] == {
        "toolSpec": {
            "name": "weather",
            "description": "Weather for a city",
            "inputSchema": {"json": TOOLS[0]["parameters"]},
        }
    }
    assert config["tools"][1] == {"cachePoint": {"type": "default"}}


def test_inference_config_carries_max_tokens_and_temperature():
    body = _build(settings={"max_tokens": 500, "temperature": 0.2})
    assert body["inferenceConfig"] == {"maxTokens": 500, "temperature": 0.2}
    assert "additionalModelRequestFields" not in body


def test_reasoning_effort_asks_claude_for_thinking_through_additional_fields():
    body = _build(settings={"reasoning_effort": "low", "temperature": 0.2}, caps=BUDGET_CAPS)
    thinking = body["additionalModelRequestFields"]["thinking"]
    assert thinking["type"] == "enabled"
    assert body["inferenceConfig"]["maxTokens"] > thinking["budget_tokens"] >= 1024
    assert "temperature" not in body["inferenceConfig"]


def test_a_model_of_unknown_thinking_shape_is_sent_no_thinking():
    body = _build(settings={"reasoning_effort": "high"}, caps=ModelCapabilities(reasoning=True))
    assert "additionalModelRequestFields" not in body


@pytest.mark.parametrize("stream", [False, True])
def test_request_bodies_validate_against_the_bedrock_runtime_service_model(stream):
    body = _build(settings={"reasoning_effort": "medium"}, caps=BUDGET_CAPS)
    assert validate_converse_request(body, MODEL, stream=stream) is None


def test_the_service_model_validator_catches_a_misspelt_field():
    body = _build()
    body["messages"][0]["content"][0] = {"txt": "typo"}
    assert "txt" in validate_converse_request(body, MODEL, stream=False)


# --- stream parsing -----------------------------------------------------------------------


def _events(*pairs):
    return [
        encode_message(
            {":event-type": name, ":content-type": "application/json", ":message-type": "event"},
            json.dumps({**payload, "p": "abc"}).encode(),
        )
        for name, payload in pairs
    ]


def _run(frames, model=MODEL):
    from providers.eventstream import EventStreamDecoder

    parser = ConverseStreamParser(model=model)
    decoder = EventStreamDecoder()
    chunks = []
    for frame in frames:
        for message in decoder.feed(frame):
            chunks.extend(parser.feed(message))
    return chunks, parser


REASONING_TOOL_STREAM = (
    ("messageStart", {"role": "assistant"}),
    ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "Hm"}}}),
    ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "m."}}}),
    (
        "contentBlockDelta",
        {"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": "sig-1"}}},
    ),
    ("contentBlockStop", {"contentBlockIndex": 0}),
    ("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"text": "Checking."}}),
    ("contentBlockStop", {"contentBlockIndex": 1}),
    (
        "contentBlockStart",
        {"contentBlockIndex": 2, "start": {"toolUse": {"toolUseId": "t1", "name": "weather"}}},
    ),
    ("contentBlockDelta", {"contentBlockIndex": 2, "delta": {"toolUse": {"input": '{"city":'}}}),
    ("contentBlockDelta", {"contentBlockIndex": 2, "delta": {"toolUse": {"input": '"Bern"}'}}}),
    ("contentBlockStop", {"contentBlockIndex": 2}),
    ("messageStop", {"stopReason": "tool_use"}),
    ("metadata", {"usage": {"inputTokens": 9, "outputTokens": 4, "totalTokens": 13}}),
)


def test_a_reasoning_and_tool_stream_assembles_into_the_turn_with_its_sidecar():
    chunks, parser = _run(_events(*REASONING_TOOL_STREAM))
    turn = parser.finish()

    assert "".join(c.reasoning or "" for c in chunks) == "Hmm."
    assert "".join(c.text or "" for c in chunks) == "Checking."
    assert chunks[-3].tool_call_delta == {
        "index": 0,
        "id": "t1",
        "name": "weather",
        "arguments": "",
    }
    assert turn.tool_calls[0].arguments == {"city": "Bern"}
    assert turn.finish_reason == "tool_use"
    assert turn.usage.to_dict() == {"input": 9, "output": 4, "cache_read": 0, "cache_write": 0}
    assert turn.extras == {
        "_bedrock": {
            "model": MODEL,
            "blocks": [
                {"reasoningContent": {"reasoningText": {"text": "Hmm.", "signature": "sig-1"}}}
            ],
        }
    }


def test_invalid_tool_json_is_reported_on_the_call_not_raised():
    frames = _events(
        ("contentBlockStart", {"contentBlockIndex": 0, "start": {"toolUse": {"toolUseId": "t"}}}),
        ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"toolUse": {"input": "{oops"}}}),
        ("messageStop", {"stopReason": "tool_use"}),
    )
    _, parser = _run(frames)
    call = parser.finish().tool_calls[0]
    assert call.error and call.raw_arguments == "{oops"


def test_a_stream_without_message_stop_raises_with_the_partial_turn():
    _, parser = _run(_events(*REASONING_TOOL_STREAM[:6]))
    with pytest.raises(errors.StreamError) as info:
        parser.finish()
    assert info.value.partial.text == "Checking."


@pytest.mark.parametrize(
    ("exception_type", "message", "expected"),
    [
        ("throttlingException", "Too many requests", errors.RateLimitError),
        ("serviceUnavailableException", "Bedrock is unable", errors.OverloadedError),
        ("modelStreamErrorException", "model crashed", errors.StreamError),
        (
            "validationException",
            "Input is too long for requested model.",
            errors.ContextTooLongError,
        ),
    ],
)
def test_exception_events_raise_the_matching_error_with_the_partial(
    exception_type, message, expected
):
    frames = _events(("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "So"}}))
    frames.append(
        encode_message(
            {":message-type": "exception", ":exception-type": exception_type},
            json.dumps({"message": message}).encode(),
        )
    )
    with pytest.raises(expected) as info:
        _run(frames)
    assert type(info.value) is expected
    assert info.value.partial.text == "So"


def test_a_response_object_parses_into_a_turn():
    turn = parse_response(
        {
            "output": {
                "message": {
                    "role": "assistant",
                    "content": [
                        SIGNED,
                        {"text": "Hi"},
                        {"toolUse": {"toolUseId": "t", "name": "weather", "input": {"a": 1}}},
                    ],
                }
            },
            "stopReason": "tool_use",
            "usage": {"inputTokens": 1, "outputTokens": 2, "totalTokens": 3},
            "metrics": {"latencyMs": 5},
        },
        model=MODEL,
    )
    assert turn.text == "Hi" and turn.reasoning == "Let me think."
    assert turn.tool_calls[0].arguments == {"a": 1}
    assert turn.extras["_bedrock"]["blocks"] == [SIGNED]


# --- errors, credentials, factory ---------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "message", "expected"),
    [
        (403, "The security token included in the request is invalid.", errors.AuthenticationError),
        (403, "The request signature we calculated does not match", errors.AuthenticationError),
        (
            403,
            "You don't have access to the model with the specified model ID.",
            errors.NoAccessError,
        ),
        (400, "The provided model identifier is invalid.", errors.NoAccessError),
        (429, "Too many tokens per day, please wait before trying again.", errors.QuotaError),
    ],
)
def test_bedrock_http_errors_are_read_by_their_message(status, message, expected):
    refined = refine_error(errors.BadRequestError(message, status=status), model=MODEL)
    assert type(refined) is expected
    assert refined.status == status


def test_the_region_comes_from_the_profile_or_a_bedrock_host():
    assert region_from_url("https://bedrock-runtime.eu-west-3.amazonaws.com") == "eu-west-3"
    assert region_from_url("https://bedrock-runtime-fips.us-east-1.amazonaws.com") == "us-east-1"
    assert region_from_url("http://127.0.0.1:9000") is None


def test_the_factory_builds_a_sigv4_client_with_the_default_regional_url():
    client = build_provider_client(
        "bedrock",
        {"access_key_id": "AKID", "secret_access_key": "s", "region": "ap-south-1"},
        None,
        transport=Transport(policy=OutboundPolicy()),
        capabilities=lambda model: ModelCapabilities(),
    )
    assert isinstance(client, BedrockConverseClient)
    assert client.url("a.b-v1:0", stream=True) == (
        "https://bedrock-runtime.ap-south-1.amazonaws.com/model/a.b-v1%3A0/converse-stream"
    )
    client.close()


class RecordingTransport:
    def __init__(self):
        self.calls = []

    def post_json(self, url, **kwargs):
        self.calls.append((url, kwargs))
        return {"output": {"message": {"content": [{"text": "ok"}]}}, "stopReason": "end_turn"}

    def close(self):
        pass


def _client(transport, **profile):
    return BedrockConverseClient(
        BEDROCK,
        api_key=profile.get("api_key"),
        base_url=profile.get("base_url"),
        transport=transport,
        capabilities=lambda model: ModelCapabilities(),
        profile=profile,
    )


def test_missing_credentials_fail_before_any_request():
    transport = RecordingTransport()
    with pytest.raises(errors.AuthenticationError) as info:
        _client(transport, region="us-east-1").complete(model=MODEL, messages=USER)
    assert "access key" in info.value.friendly
    assert transport.calls == []


def test_a_missing_region_fails_with_a_friendly_message():
    transport = RecordingTransport()
    with pytest.raises(errors.BadRequestError) as info:
        _client(transport, api_key="k").complete(model=MODEL, messages=USER)
    assert "region" in info.value.friendly
    assert transport.calls == []


def test_an_api_key_is_a_bearer_token_and_nothing_is_signed():
    transport = RecordingTransport()
    _client(transport, api_key="bedrock-api-key", region="us-west-2").complete(
        model=MODEL, messages=USER
    )
    url, kwargs = transport.calls[0]
    assert url.endswith("/model/anthropic.claude-fake-v1%3A0/converse")
    assert kwargs["headers"]["Authorization"] == "Bearer bedrock-api-key"
    assert not any(name.lower().startswith("x-amz") for name in kwargs["headers"])


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


SIGV4 = {
    "access_key_id": DEFAULT_ACCESS_KEY_ID,
    "secret_access_key": DEFAULT_SECRET_ACCESS_KEY,
    "region": "us-east-1",
}
PROFILES = {"bearer": {"api_key": "test-key"}, "sigv4": SIGV4}


def _live(server, transport, profile, caps=BUDGET_CAPS):
    return BedrockConverseClient(
        BEDROCK,
        api_key=profile.get("api_key"),
        base_url=server.base_url,
        transport=transport,
        capabilities=lambda model: caps,
        profile=profile,
    )


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


@pytest.mark.parametrize("auth", sorted(PROFILES))
def test_end_to_end_text_streams_with_either_credential_style(transport, auth):
    with BedrockFake() as server:
        server.push(fake.Reply(fake.text("Hello there"), fake.usage(input=3, output=2)))
        chunks = list(_live(server, transport, PROFILES[auth]).stream(model=MODEL, messages=USER))
        request = server.last_request

    assert "".join(c.text or "" for c in chunks[:-1]) == "Hello there"
    assert chunks[-1].turn.text == "Hello there"
    assert chunks[-1].turn.usage.to_dict() == {
        "input": 3,
        "output": 2,
        "cache_read": 0,
        "cache_write": 0,
    }
    assert request.path == "/model/anthropic.claude-fake-v1%3A0/converse-stream"
    scheme = "AWS4-HMAC-SHA256" if auth == "sigv4" else "Bearer"
    assert request.headers["authorization"].startswith(scheme)


def test_end_to_end_reasoning_tool_round_trip_replays_valid_signatures(transport):
    settings = {"reasoning_effort": "low"}
    with BedrockFake() as server:
        server.push(
            fake.Reply(
                fake.reasoning("I should call the tool."),
                fake.redacted_thinking(),
                fake.text("Checking."),
                fake.tool_call("weather", {"city": "Bern"}),
                fake.usage(input=50, output=30, cache_read=2000, cache_write=100),
            ),
            fake.Reply(fake.text("Sunny.")),
        )
        client = _live(server, transport, SIGV4)
        first = list(client.stream(model=MODEL, messages=USER, tools=TOOLS, **settings))[-1].turn
        second = list(
            client.stream(
                model=MODEL, messages=_history_after(first, "sunny"), tools=TOOLS, **settings
            )
        )[-1].turn
        sent = server.last_request.body

    assert first.reasoning == "I should call the tool."
    assert first.tool_calls[0].arguments == {"city": "Bern"}
    assert first.usage.context_tokens == 2150
    assert [list(b["reasoningContent"]) for b in first.extras["_bedrock"]["blocks"]] == [
        ["reasoningText"],
        ["redactedContent"],
    ]
    assert [next(iter(b)) for b in sent["messages"][1]["content"]] == [
        "reasoningContent",
        "reasoningContent",
        "text",
        "toolUse",
    ]
    assert sent["additionalModelRequestFields"]["thinking"]["type"] == "enabled"
    assert second.text == "Sunny."


def test_end_to_end_a_tampered_reasoning_signature_is_refused(transport):
    with BedrockFake() as server:
        server.push(fake.Reply(fake.reasoning("Hmm."), fake.tool_call("weather", {}, id="t1")))
        client = _live(server, transport, PROFILES["bearer"])
        first = client.complete(model=MODEL, messages=USER, tools=TOOLS)
        history = _history_after(first, "ok")
        block = history[2]["extras"]["_bedrock"]["blocks"][0]
        block["reasoningContent"]["reasoningText"]["signature"] = "forged"

        with pytest.raises(errors.BadRequestError, match="signature"):
            client.complete(model=MODEL, messages=history, tools=TOOLS)


def test_end_to_end_a_wrong_secret_key_is_an_authentication_error(transport):
    with BedrockFake() as server:
        profile = {**SIGV4, "secret_access_key": "not-the-secret"}
        with pytest.raises(errors.AuthenticationError) as info:
            _live(server, transport, profile).complete(model=MODEL, messages=USER)
    assert info.value.status == 403
    assert "not-the-secret" not in str(info.value)


def test_end_to_end_temporary_credentials_send_and_sign_the_session_token(transport):
    with BedrockFake(session_token="FQoGZXIvYXdzSESSION") as server:
        profile = {**SIGV4, "session_token": "FQoGZXIvYXdzSESSION"}
        turn = _live(server, transport, profile).complete(model=MODEL, messages=USER)
        headers = server.last_request.headers

    assert turn.text == "Weather?"  # the fake echoes the last user message
    assert "x-amz-security-token" in headers["authorization"]


def test_end_to_end_non_streamed_converse_parses(transport):
    with BedrockFake() as server:
        server.push(fake.Reply(fake.text("Hello"), fake.usage(input=3, output=2)))
        turn = _live(server, transport, SIGV4).complete(model=MODEL, messages=USER)

    assert turn.text == "Hello"
    assert turn.finish_reason == "end_turn"
    assert turn.usage.to_dict() == {"input": 3, "output": 2, "cache_read": 0, "cache_write": 0}


def test_end_to_end_a_truncated_stream_raises_with_partial_text(transport):
    with BedrockFake() as server:
        server.push(fake.Reply(fake.text("Half an answer"), fake.truncate()))
        with pytest.raises(errors.StreamError) as info:
            list(_live(server, transport, SIGV4).stream(model=MODEL, messages=USER))

    assert info.value.partial.text == "Half an answer"


def test_end_to_end_a_reset_mid_stream_raises_with_partial_text(transport):
    with BedrockFake() as server:
        server.push(fake.Reply(fake.text("Before the cut"), fake.pause(0.05), fake.reset()))
        with pytest.raises(errors.StreamError) as info:
            list(_live(server, transport, SIGV4).stream(model=MODEL, messages=USER))

    assert info.value.partial.text == "Before the cut"


def test_end_to_end_a_throttling_exception_event_is_a_rate_limit_with_partial(transport):
    with BedrockFake() as server:
        server.push(fake.Reply(fake.text("So far"), fake.error_event("rate_limit")))
        with pytest.raises(errors.RateLimitError) as info:
            list(_live(server, transport, SIGV4).stream(model=MODEL, messages=USER))

    assert info.value.partial.text == "So far"


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (fake.rate_limited(retry_after=None), errors.RateLimitError),
        (fake.context_too_long(), errors.ContextTooLongError),
        (fake.model_not_found(), errors.NoAccessError),
        (fake.http_error(None, kind="permission"), errors.NoAccessError),
        (fake.overloaded(), errors.OverloadedError),
    ],
)
def test_end_to_end_http_errors_in_bedrocks_shape_are_translated(transport, step, expected):
    with BedrockFake() as server:
        server.push(fake.Reply(step))
        with pytest.raises(expected):
            _live(server, transport, SIGV4).complete(model=MODEL, messages=USER)


def test_end_to_end_cancel_during_a_slow_drip_closes_the_upstream(transport):
    cancel = CancelToken()
    with BedrockFake() as server:
        server.push(fake.Reply(fake.text("one two three four five six"), delay=0.2))
        stream = _live(server, transport, SIGV4).stream(model=MODEL, messages=USER, cancel=cancel)
        first = next(stream)
        cancel.cancel()
        with pytest.raises(errors.RequestCancelled):
            list(stream)
        assert server.wait_for_disconnect(5.0)

    assert first.text == "one "


def test_a_thinking_budget_is_not_sent_into_another_models_tool_loop():
    from providers.context import build_context
    from providers.types import ModelCapabilities
    from providers.wire.bedrock_converse import build_request

    caps = ModelCapabilities(reasoning=True, thinking="budget", max_output_tokens=64_000)
    history = [
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "call_1", "name": "list_files", "arguments": {}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
    ]
    settings = {"reasoning_effort": "high"}
    body = build_request(
        build_context(history, None), model="m", settings=settings, capabilities=caps
    )
    assert "additionalModelRequestFields" not in body
    fresh = build_request(
        build_context(history[:1], None), model="m", settings=settings, capabilities=caps
    )
    assert fresh["additionalModelRequestFields"]["thinking"]["type"] == "enabled"
