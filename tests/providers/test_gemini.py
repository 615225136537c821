from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from providers import errors
from providers.cancel import CancelToken
from providers.context import build_context
from providers.factory import build_provider_client
from providers.outbound import OutboundPolicy
from providers.registry import get_descriptor
from providers.transport import Transport
from providers.types import ModelCapabilities
from providers.wire.gemini import (
    FOREIGN_SIGNATURE,
    GeminiClient,
    GeminiStreamParser,
    build_request,
    gemini_schema,
    parse_response,
    usage_from_gemini,
)
from tests.fakes import script as fake
from tests.fakes.gemini import GeminiFake
from tests.fakes.validate import validate_gemini_request, validate_gemini_response

GEMINI = get_descriptor("gemini")
MODEL = "gemini-3-pro-preview"
PNG = "iVBORw0KGgo="
PDF = "JVBERi0xLjQK"
THINKS = ModelCapabilities(reasoning=True, thinking="effort")


def ev(payload: dict) -> SimpleNamespace:
    return SimpleNamespace(event=None, data=json.dumps(payload), id=None, retry=None)


def chunk(parts: list, *, finish: str | None = None, usage: dict | None = None) -> SimpleNamespace:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    payload: dict[str, Any] = {"candidates": [candidate], "modelVersion": MODEL}
    if usage is not None:
        payload["usageMetadata"] = usage
    return ev(payload)


def run(events: list, model: str = MODEL) -> tuple[list, Any]:
    parser = GeminiStreamParser(model=model)
    out = []
    for event in events:
        out.extend(parser.feed(event))
    return out, parser.finish()


def _build(messages, *, model=MODEL, settings=None, caps=THINKS, tools=None):
    return build_request(
        build_context(messages, tools), model=model, settings=settings or {}, capabilities=caps
    )


TOOLS = [
    {
        "name": "lookup",
        "description": "Look up",
        "parameters": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "additionalProperties": False,
            "properties": {"q": {"type": "string", "format": "uri", "default": "x"}},
            "required": ["q", "gone"],
        },
        "cache_control": {"type": "ephemeral"},
    },
    {"name": "now", "description": "Time", "parameters": {"type": "object", "properties": {}}},
]


# --- usage --------------------------------------------------------------------------------


def test_usage_maps_the_documented_caching_example():
    # The Gemini caching guide's printed usage_metadata.
    usage = usage_from_gemini(
        {
            "promptTokenCount": 696219,
            "cachedContentTokenCount": 696190,
            "candidatesTokenCount": 214,
            "totalTokenCount": 696433,
        }
    )

    assert usage.to_dict() == {"input": 29, "output": 214, "cache_read": 696190, "cache_write": 0}
    assert usage.context_tokens == 696219


def test_thoughts_are_billed_as_output():
    usage = usage_from_gemini(
        {"promptTokenCount": 10, "candidatesTokenCount": 5, "thoughtsTokenCount": 40}
    )

    assert (usage.input, usage.output) == (10, 45)


def test_no_usage_metadata_is_none():
    assert usage_from_gemini(None) is None
    assert usage_from_gemini({"totalTokenCount": None}) is None
    _, turn = run([chunk([{"text": "hi"}], finish="STOP")])
    assert turn.usage is None


# --- request ------------------------------------------------------------------------------


def _conversation(model: str = MODEL) -> list[dict]:
    return [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look", "cache_control": {"type": "ephemeral"}},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{PDF}"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning": "secret thoughts",
            "extras": {
                "_gemini": {
                    "model": model,
                    "signatures": [{"position": 1, "kind": "call", "signature": "c2lnMQ=="}],
                    "api_ids": True,
                },
                "_anthropic": {"model": "claude", "thinking": []},
            },
            "tool_calls": [
                {"id": "fc_1", "name": "lookup", "arguments": {"q": "a"}},
                {"id": "fc_2", "name": "lookup", "arguments": {"q": "b"}},
            ],
        },
        {"role": "tool", "tool_call_id": "fc_1", "content": "A"},
        {"role": "tool", "tool_call_id": "fc_2", "content": "B failed", "is_error": True},
        {"role": "user", "content": "And now?"},
    ]


def test_system_becomes_system_instruction_and_the_key_a_header():
    from providers.wire.gemini import request_headers

    body = _build(_conversation())

    assert body["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert [c["role"] for c in body["contents"]] == ["user", "model", "user", "user"]
    assert request_headers(GEMINI, "AIza-key") == {"x-goog-api-key": "AIza-key"}


def test_images_and_pdfs_travel_as_inline_data():
    assert _build(_conversation())["contents"][0]["parts"] == [
        {"text": "Look"},
        {"inlineData": {"mimeType": "image/png", "data": PNG}},
        {"inlineData": {"mimeType": "application/pdf", "data": PDF}},
    ]


def test_signatures_go_back_on_their_parts_to_the_same_model():
    model = _build(_conversation())["contents"][1]

    assert model == {
        "role": "model",
        "parts": [
            {"text": "Checking."},
            {
                "functionCall": {"name": "lookup", "args": {"q": "a"}, "id": "fc_1"},
                "thoughtSignature": "c2lnMQ==",
            },
            {"functionCall": {"name": "lookup", "args": {"q": "b"}, "id": "fc_2"}},
        ],
    }


def test_another_models_calls_get_the_placeholder_signature_not_the_real_one():
    body = _build(_conversation(model="gemini-2.5-flash"))
    raw = json.dumps(body)

    assert "c2lnMQ==" not in raw
    assert body["contents"][1]["parts"][1]["thoughtSignature"] == FOREIGN_SIGNATURE
    assert "thoughtSignature" not in body["contents"][1]["parts"][2]


def test_reasoning_and_other_sidecars_never_reach_the_wire():
    raw = json.dumps(_build(_conversation()))

    assert "secret thoughts" not in raw
    assert "_anthropic" not in raw and "_gemini" not in raw and "cache_control" not in raw


def test_tool_results_carry_the_function_name_and_share_one_content():
    contents = _build(_conversation())["contents"]

    assert contents[2] == {
        "role": "user",
        "parts": [
            {"functionResponse": {"name": "lookup", "response": {"output": "A"}, "id": "fc_1"}},
            {
                "functionResponse": {
                    "name": "lookup",
                    "response": {"error": "B failed"},
                    "id": "fc_2",
                }
            },
        ],
    }
    assert contents[3] == {"role": "user", "parts": [{"text": "And now?"}]}


def test_ids_we_made_up_are_never_sent_back():
    history = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "call_0_lookup", "name": "lookup", "arguments": {}}],
        },
        {"role": "tool", "tool_call_id": "call_0_lookup", "content": "A"},
    ]

    contents = _build(history)["contents"]

    assert "id" not in contents[1]["parts"][0]["functionCall"]
    assert contents[2]["parts"][0]["functionResponse"] == {
        "name": "lookup",
        "response": {"output": "A"},
    }


def test_tool_schemas_are_cut_to_the_subset_gemini_accepts():
    declarations = _build(_conversation(), tools=TOOLS)["tools"]

    assert declarations == [
        {
            "functionDeclarations": [
                {
                    "name": "lookup",
                    "description": "Look up",
                    "parameters": {
                        "type": "OBJECT",
                        "properties": {"q": {"type": "STRING"}},
                        "required": ["q"],
                    },
                },
                {"name": "now", "description": "Time"},
            ]
        }
    ]


def test_schema_refs_nullable_unions_and_consts_are_translated():
    schema = {
        "type": "object",
        "$defs": {"Item": {"type": "object", "properties": {"n": {"type": "integer"}}}},
        "properties": {
            "item": {"$ref": "#/$defs/Item", "description": "one"},
            "maybe": {"type": ["string", "null"]},
            "either": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "kind": {"const": "fixed"},
            "level": {"enum": [1, 2]},
            "loop": {"$ref": "#/$defs/Loop"},
        },
    }

    assert gemini_schema(schema)["properties"] == {
        "item": {"type": "OBJECT", "properties": {"n": {"type": "INTEGER"}}, "description": "one"},
        "maybe": {"type": "STRING", "nullable": True},
        "either": {"type": "INTEGER", "nullable": True},
        "kind": {"enum": ["fixed"], "type": "STRING"},
        "level": {},
        "loop": {},
    }


@pytest.mark.parametrize(
    ("caps", "effort", "expected"),
    [
        (THINKS, "high", {"includeThoughts": True, "thinkingLevel": "HIGH"}),
        (THINKS, "off", {"includeThoughts": True}),
        (THINKS, None, {"includeThoughts": True}),
        (
            ModelCapabilities(reasoning=True, thinking="budget"),
            "low",
            {"includeThoughts": True, "thinkingBudget": 2048},
        ),
        (
            ModelCapabilities(reasoning=True, thinking="budget"),
            "off",
            {"includeThoughts": False, "thinkingBudget": 0},
        ),
        (ModelCapabilities(reasoning=None), "high", None),
    ],
)
def test_thinking_config_follows_the_models_declared_shape(caps, effort, expected):
    body = _build(
        [{"role": "user", "content": "hi"}],
        model="gemini-2.5-flash",
        settings={"reasoning_effort": effort, "max_tokens": 100, "temperature": 0.2},
        caps=caps,
    )

    generation = body["generationConfig"]
    assert generation["maxOutputTokens"] == 100
    assert generation["temperature"] == 0.2
    assert generation.get("thinkingConfig") == expected


def test_gemini_25_pro_is_never_asked_for_a_zero_budget():
    body = _build(
        [{"role": "user", "content": "hi"}],
        model="gemini-2.5-pro",
        settings={"reasoning_effort": "off"},
        caps=ModelCapabilities(reasoning=True, thinking="budget"),
    )

    assert body["generationConfig"]["thinkingConfig"] == {"includeThoughts": True}


def test_request_bodies_validate_against_the_sdk_types():
    validate_gemini_request(
        _build(_conversation(), tools=TOOLS, settings={"reasoning_effort": "low"})
    )


def test_the_request_validator_catches_a_misspelled_part():
    body = _build(_conversation())
    body["contents"][0]["parts"][1]["inline_data_x"] = {}

    with pytest.raises(AssertionError, match="inline_data_x"):
        validate_gemini_request(body)


# --- stream parsing -----------------------------------------------------------------------


def _thinking_tool_stream() -> list:
    return [
        chunk([{"text": "Let me ", "thought": True}], usage={"promptTokenCount": 20}),
        chunk([{"text": "think.", "thought": True}]),
        chunk([{"text": "Checking "}]),
        chunk([{"text": "both."}]),
        chunk(
            [
                {
                    "functionCall": {"name": "lookup", "args": {"q": "a"}},
                    "thoughtSignature": "U0lH",
                },
                {"functionCall": {"name": "lookup", "args": {"q": "b"}}},
            ],
            finish="STOP",
            usage={
                "promptTokenCount": 20,
                "candidatesTokenCount": 12,
                "thoughtsTokenCount": 30,
                "totalTokenCount": 62,
            },
        ),
    ]


def test_a_thinking_and_tool_stream_assembles_into_the_turn():
    chunks, turn = run(_thinking_tool_stream())

    assert [c.reasoning for c in chunks if c.reasoning] == ["Let me ", "think."]
    assert [c.text for c in chunks if c.text] == ["Checking ", "both."]
    assert turn.text == "Checking both."
    assert turn.reasoning == "Let me think."
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("call_0_lookup", "lookup", {"q": "a"}),
        ("call_1_lookup", "lookup", {"q": "b"}),
    ]
    assert turn.finish_reason == "STOP"
    assert turn.usage.to_dict() == {"input": 20, "output": 42, "cache_read": 0, "cache_write": 0}


def test_function_calls_arrive_whole_in_one_delta_each():
    chunks, _ = run(_thinking_tool_stream())

    assert [c.tool_call_delta for c in chunks if c.tool_call_delta] == [
        {"index": 0, "id": "call_0_lookup", "name": "lookup", "arguments": '{"q": "a"}'},
        {"index": 1, "id": "call_1_lookup", "name": "lookup", "arguments": '{"q": "b"}'},
    ]


def test_signatures_are_kept_with_the_position_of_their_part():
    _, turn = run(_thinking_tool_stream())

    assert turn.extras == {
        "_gemini": {
            "model": MODEL,
            "signatures": [{"position": 1, "kind": "call", "signature": "U0lH"}],
            "api_ids": False,
        }
    }


def test_a_streamed_turn_replays_its_signatures_on_the_same_parts():
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
        {"role": "tool", "tool_call_id": "call_0_lookup", "content": "A"},
        {"role": "tool", "tool_call_id": "call_1_lookup", "content": "B"},
    ]

    parts = _build(history)["contents"][1]["parts"]

    assert parts == [
        {"text": "Checking both."},
        {"functionCall": {"name": "lookup", "args": {"q": "a"}}, "thoughtSignature": "U0lH"},
        {"functionCall": {"name": "lookup", "args": {"q": "b"}}},
    ]


def test_a_trailing_signature_only_part_is_replayed_as_one():
    _, turn = run(
        [
            chunk([{"text": "Hello"}]),
            chunk([{"text": "", "thoughtSignature": "RU5E"}], finish="STOP"),
        ]
    )
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": turn.text, "extras": turn.extras},
        {"role": "user", "content": "more"},
    ]

    assert turn.extras["_gemini"]["signatures"] == [
        {"position": 1, "kind": "empty", "signature": "RU5E"}
    ]
    assert _build(history)["contents"][1]["parts"] == [
        {"text": "Hello"},
        {"text": "", "thoughtSignature": "RU5E"},
    ]


def test_api_issued_call_ids_are_used_and_marked():
    _, turn = run(
        [chunk([{"functionCall": {"id": "fc_9", "name": "now", "args": {}}}], finish="STOP")]
    )

    assert turn.tool_calls[0].id == "fc_9"
    assert turn.extras["_gemini"]["api_ids"] is True


def test_a_stream_without_a_finish_reason_raises_with_the_partial_turn():
    parser = GeminiStreamParser(model=MODEL)
    parser.feed(chunk([{"text": "half"}]))

    with pytest.raises(errors.StreamError) as info:
        parser.finish()
    assert info.value.partial.text == "half"


def test_an_error_in_the_stream_raises_the_matching_error_with_the_partial_turn():
    parser = GeminiStreamParser(model=MODEL)
    parser.feed(chunk([{"text": "so far"}]))

    with pytest.raises(errors.OverloadedError) as info:
        parser.feed(
            ev(
                {
                    "error": {
                        "code": 503,
                        "message": "The model is overloaded.",
                        "status": "UNAVAILABLE",
                    }
                }
            )
        )
    assert info.value.partial.text == "so far"


def test_a_blocked_prompt_finishes_with_its_block_reason():
    _, turn = run([ev({"promptFeedback": {"blockReason": "SAFETY"}})])

    assert (turn.text, turn.finish_reason) == (None, "SAFETY")


def test_a_whole_response_parses_into_a_turn():
    turn = parse_response(
        {
            "candidates": [
                {
                    "content": {
                        "role": "model",
                        "parts": [{"text": "Hi", "thoughtSignature": "VA=="}],
                    },
                    "finishReason": "MAX_TOKENS",
                    "index": 0,
                }
            ],
            "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4},
        },
        model=MODEL,
    )

    assert (turn.text, turn.finish_reason) == ("Hi", "MAX_TOKENS")
    assert turn.extras["_gemini"]["signatures"] == [
        {"position": 0, "kind": "text", "signature": "VA=="}
    ]
    assert turn.usage.to_dict() == {"input": 3, "output": 4, "cache_read": 0, "cache_write": 0}


# --- errors -------------------------------------------------------------------------------


def _google_error(code: int, status: str, message: str, reason: str | None = None) -> str:
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if reason:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason}]
    return json.dumps({"error": error})


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            429,
            _google_error(429, "RESOURCE_EXHAUSTED", "You exceeded your current quota, please"),
            errors.QuotaError,
        ),
        (
            429,
            _google_error(
                429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."
            ),
            errors.RateLimitError,
        ),
        (
            403,
            _google_error(403, "PERMISSION_DENIED", "The caller does not have permission"),
            errors.NoAccessError,
        ),
        (
            404,
            _google_error(404, "NOT_FOUND", f"models/{MODEL} is not found for API version v1beta"),
            errors.NoAccessError,
        ),
        (
            400,
            _google_error(400, "INVALID_ARGUMENT", "API key not valid.", reason="API_KEY_INVALID"),
            errors.AuthenticationError,
        ),
        (
            400,
            _google_error(
                400,
                "INVALID_ARGUMENT",
                "The input token count (2) exceeds the maximum number of tokens allowed (1).",
            ),
            errors.ContextTooLongError,
        ),
        (
            503,
            _google_error(503, "UNAVAILABLE", "The model is overloaded."),
            errors.OverloadedError,
        ),
    ],
)
def test_google_error_bodies_translate(status, body, expected):
    assert type(errors.error_from_response(status, body, model=MODEL)) is expected


def test_an_unrelated_404_keeps_its_raw_message():
    error = errors.error_from_response(404, "<html>Not Found</html>", model=MODEL)

    assert type(error) is errors.BadRequestError


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


def test_the_factory_builds_a_gemini_client():
    client = build_provider_client(
        "gemini",
        {"api_key": "k"},
        None,
        transport=RecordingTransport(),
        capabilities=lambda m: ModelCapabilities(),
    )

    assert isinstance(client, GeminiClient)
    assert client.base_url == "https://generativelanguage.googleapis.com/v1beta"


def test_a_missing_key_fails_before_any_request():
    transport = RecordingTransport()
    client = GeminiClient(
        GEMINI, api_key=None, base_url=None, transport=transport, capabilities=lambda m: THINKS
    )

    with pytest.raises(errors.AuthenticationError, match="no API key configured"):
        client.complete(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert transport.calls == []


def test_stream_posts_to_stream_generate_content_with_alt_sse_and_the_cancel_token():
    transport = RecordingTransport(_thinking_tool_stream())
    token = CancelToken()
    client = GeminiClient(
        GEMINI, api_key="k", base_url=None, transport=transport, capabilities=lambda m: THINKS
    )

    chunks = list(
        client.stream(model=MODEL, messages=[{"role": "user", "content": "hi"}], cancel=token)
    )

    call = transport.calls[0]
    assert call["url"] == (
        f"https://generativelanguage.googleapis.com/v1beta/models/{MODEL}"
        ":streamGenerateContent?alt=sse"
    )
    assert call["headers"] == {"x-goog-api-key": "k"}
    assert call["cancel"] is token
    assert chunks[-1].turn.tool_calls[1].arguments == {"q": "b"}


# --- the fake, driven by the google-genai SDK ---------------------------------------------


def _sdk(server):
    from google import genai
    from google.genai import types

    return genai.Client(
        api_key="test-key",
        http_options=types.HttpOptions(base_url=server.root_url, api_version="v1beta"),
    )


def test_the_sdk_streams_from_the_fake_and_every_chunk_validates():
    with GeminiFake() as server:
        server.push(
            fake.Reply(
                fake.reasoning("Hmm."),
                fake.text("Hello there, friend."),
                fake.usage(input=10, output=7, cache_read=3, reasoning=2),
            )
        )
        client = _sdk(server)  # kept referenced: the SDK closes its pool when collected
        chunks = list(client.models.generate_content_stream(model="gemini-fake", contents="hi"))
        sent = server.last_request

    for item in chunks:
        validate_gemini_response(item.model_dump(exclude_none=True, by_alias=True, mode="json"))
    assert sent.path == "/v1beta/models/gemini-fake:streamGenerateContent"
    assert "".join(c.text or "" for c in chunks) == "Hello there, friend."
    last = chunks[-1]
    assert last.candidates[0].finish_reason.value == "STOP"
    assert last.usage_metadata.thoughts_token_count == 2
    assert last.usage_metadata.cached_content_token_count == 3


def test_the_sdk_gets_a_function_call_and_the_fake_checks_the_key():
    from google.genai import errors as genai_errors

    with GeminiFake() as server:
        server.push(fake.Reply(fake.tool_call("weather", {"city": "Bern"})))
        client = _sdk(server)
        response = client.models.generate_content(model="gemini-fake", contents="weather?")
        server.api_key = "other"
        with pytest.raises(genai_errors.ClientError, match="API key not valid"):
            client.models.generate_content(model="gemini-fake", contents="x")

    assert response.function_calls[0].name == "weather"
    assert response.function_calls[0].args == {"city": "Bern"}


# --- end to end: our client, the real transport, the fake ---------------------------------


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


def _live(server, transport, caps=THINKS):
    return GeminiClient(
        GEMINI,
        api_key="test-key",
        base_url=server.base_url,
        transport=transport,
        capabilities=lambda model: caps,
    )


USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]
WEATHER = [
    {
        "name": "weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


def _after(turn, result: str) -> list[dict]:
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


def test_end_to_end_thinking_and_a_function_call_round_trip_with_signature_replay(transport):
    with GeminiFake() as server:
        server.push(
            fake.Reply(
                fake.reasoning("I should call the tool."),
                fake.text("Checking."),
                fake.tool_call("weather", {"city": "Bern"}),
                fake.usage(input=50, output=30, cache_read=200, reasoning=10),
            ),
            fake.Reply(fake.text("Sunny.")),
        )
        client = _live(server, transport)
        streamed = list(client.stream(model="gemini-3-fake", messages=USER, tools=WEATHER))
        first = streamed[-1].turn
        second = list(
            client.stream(model="gemini-3-fake", messages=_after(first, "sunny"), tools=WEATHER)
        )[-1].turn
        sent = server.last_request.body

    validate_gemini_request(sent)
    assert [c.reasoning for c in streamed if c.reasoning] == ["I should call the tool."]
    assert first.tool_calls[0].arguments == {"city": "Bern"}
    assert first.usage.to_dict() == {"input": 50, "output": 30, "cache_read": 200, "cache_write": 0}
    replayed = sent["contents"][1]["parts"]
    assert replayed[1]["functionCall"] == {"name": "weather", "args": {"city": "Bern"}}
    assert replayed[1]["thoughtSignature"] == first.extras["_gemini"]["signatures"][0]["signature"]
    assert sent["contents"][2]["parts"][0]["functionResponse"]["name"] == "weather"
    assert second.text == "Sunny."


def test_end_to_end_a_forged_signature_is_refused(transport):
    with GeminiFake() as server:
        server.push(fake.Reply(fake.reasoning("Hmm."), fake.tool_call("weather", {})))
        client = _live(server, transport)
        first = client.complete(model="gemini-3-fake", messages=USER, tools=WEATHER)
        history = _after(first, "ok")
        history[2]["extras"]["_gemini"]["signatures"][0]["signature"] = "Zm9yZ2Vk"

        with pytest.raises(errors.BadRequestError, match="Corrupted thought signature"):
            client.complete(model="gemini-3-fake", messages=history, tools=WEATHER)


def test_end_to_end_a_switch_to_another_model_sends_the_placeholder(transport):
    with GeminiFake() as server:
        server.push(fake.Reply(fake.reasoning("Hmm."), fake.tool_call("weather", {})))
        client = _live(server, transport)
        first = client.complete(model="gemini-3-fake", messages=USER, tools=WEATHER)
        turn = client.complete(model="gemini-3-other", messages=_after(first, "ok"), tools=WEATHER)
        sent = server.last_request.body

    assert sent["contents"][1]["parts"][0]["thoughtSignature"] == FOREIGN_SIGNATURE
    assert turn.text


def test_end_to_end_a_text_reply_replays_its_trailing_signature(transport):
    with GeminiFake() as server:
        server.push(fake.Reply(fake.reasoning("Hmm."), fake.text("Hello.")))
        client = _live(server, transport)
        first = list(client.stream(model="gemini-3-fake", messages=USER))[-1].turn
        history = [*USER, {"role": "assistant", "content": first.text, "extras": first.extras}]
        client.complete(
            model="gemini-3-fake", messages=[*history, {"role": "user", "content": "?"}]
        )
        sent = server.last_request.body

    assert sent["contents"][1]["parts"][-1]["text"] == ""
    assert sent["contents"][1]["parts"][-1]["thoughtSignature"]


def test_end_to_end_truncated_stream_raises_with_partial_text(transport):
    with GeminiFake() as server:
        server.push(fake.Reply(fake.text("Half an answer"), fake.truncate()))
        with pytest.raises(errors.StreamError) as info:
            list(_live(server, transport).stream(model="gemini-fake", messages=USER))

    assert info.value.partial.text == "Half an answer"


def test_end_to_end_overloaded_error_in_the_stream_is_translated(transport):
    with GeminiFake() as server:
        server.push(fake.Reply(fake.text("So far"), fake.error_event("overloaded")))
        with pytest.raises(errors.OverloadedError) as info:
            list(_live(server, transport).stream(model="gemini-fake", messages=USER))

    assert info.value.partial.text == "So far"


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (fake.quota_exceeded(), errors.QuotaError),
        (fake.rate_limited(retry_after=None), errors.RateLimitError),
        (fake.model_not_found(), errors.NoAccessError),
        (fake.http_error(None, kind="permission"), errors.NoAccessError),
        (fake.context_too_long(), errors.ContextTooLongError),
    ],
)
def test_end_to_end_http_errors_are_translated(transport, step, expected):
    with GeminiFake() as server:
        server.push(fake.Reply(step))
        with pytest.raises(expected):
            _live(server, transport).complete(model="gemini-fake", messages=USER)


def test_end_to_end_a_wrong_key_is_an_authentication_error(transport):
    with GeminiFake(api_key="right") as server, pytest.raises(errors.AuthenticationError):
        _live(server, transport).complete(model="gemini-fake", messages=USER)
