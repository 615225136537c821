"""Gemini 3 function calls whose arguments stream as `partialArgs` (issue 23).

The fake streams each call as Gemini 3 does with argument streaming: a `functionCall`
with the name and `willContinue`, nameless parts that each carry one `partialArgs` entry
(a JSON path and a typed value, strings spread over several parts), then an empty
`functionCall` that closes it, or nothing (the API may leave the closing part out).
"""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from providers.outbound import OutboundPolicy
from providers.registry import get_descriptor
from providers.transport import Transport
from providers.types import ModelCapabilities
from providers.wire.gemini import (
    GeminiClient,
    GeminiStreamParser,
    StreamedArguments,
    json_path_steps,
    parse_response,
)
from tests.fakes import script as fake
from tests.fakes.gemini import GeminiFake, streamed_call_parts
from tests.fakes.validate import validate_gemini_request, validate_gemini_response
from tests.providers.paths import STREAM_PATHS, streamed, tool_deltas

GEMINI = get_descriptor("gemini")
MODEL = "gemini-3-fake"
THINKS = ModelCapabilities(reasoning=True, thinking="effort")
USER = [{"role": "user", "content": "Plan the trip."}]
TOOLS = [
    {"name": "book", "description": "Book a trip", "parameters": {"type": "object"}},
    {"name": "notify", "description": "Tell someone", "parameters": {"type": "object"}},
]
BOOKING = {
    "destination": {"city": "Zürich", "country": "CH"},
    "items": [
        {"name": "hotel room with a view of the lake", "price": 240.5, "refundable": True},
        {"name": "train", "price": 62, "refundable": False},
    ],
    "note": None,
    "nights": 3,
}
NOTICE = {"to": "ana@example.com", "text": "Booked, see you in Zürich"}


def _client(server: GeminiFake):
    def make() -> GeminiClient:
        transport = Transport(
            policy=OutboundPolicy(allow_loopback=True), max_retries=0, read_timeout=5.0
        )
        return GeminiClient(
            GEMINI,
            api_key="test-key",
            base_url=server.base_url,
            transport=transport,
            capabilities=lambda model: THINKS,
        )

    return make


def _reply() -> fake.Reply:
    return fake.Reply(
        fake.reasoning("Book first, then tell Ana."),
        fake.tool_call("book", BOOKING),
        fake.tool_call("notify", NOTICE),
    )


def _history(turn) -> list[dict]:
    return [
        *USER,
        {
            "role": "assistant",
            "content": turn.text,
            "extras": turn.extras,
            "tool_calls": [c.to_dict() for c in turn.tool_calls],
        },
        *({"role": "tool", "tool_call_id": call.id, "content": "done"} for call in turn.tool_calls),
    ]


@pytest.mark.parametrize("path", STREAM_PATHS)
@pytest.mark.parametrize("closed", [True, False], ids=["closing-part", "no-closing-part"])
def test_each_streamed_call_comes_out_once_with_its_whole_nested_arguments(path, closed):
    with GeminiFake(stream_arguments=True, close_streamed_calls=closed) as server:
        server.push(_reply())
        chunks = streamed(_client(server), path, model=MODEL, messages=USER, tools=TOOLS)

    turn = chunks[-1].turn
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [
        ("book", BOOKING),
        ("notify", NOTICE),
    ]
    deltas = tool_deltas(chunks)
    assert [(d["index"], d["name"]) for d in deltas] == [(0, "book"), (1, "notify")]
    assert [json.loads(d["arguments"]) for d in deltas] == [BOOKING, NOTICE]
    assert turn.finish_reason == "STOP"


@pytest.mark.parametrize("path", STREAM_PATHS)
def test_a_streamed_call_replays_its_thought_signature_and_the_api_accepts_it(path):
    # The fake signs the call's full arguments: a replay with fragments or `{}` would be
    # refused as "Corrupted thought signature.".
    with GeminiFake(stream_arguments=True) as server:
        server.push(_reply(), fake.Reply(fake.text("All set.")))
        make = _client(server)
        first = streamed(make, path, model=MODEL, messages=USER, tools=TOOLS)[-1].turn
        client = make()
        second = client.complete(model=MODEL, messages=_history(first), tools=TOOLS)
        client.close()
        sent = server.last_request.body

    validate_gemini_request(sent)
    replayed = sent["contents"][1]["parts"]
    assert replayed[0]["functionCall"] == {"name": "book", "args": BOOKING}
    assert replayed[0]["thoughtSignature"] == first.extras["_gemini"]["signatures"][0]["signature"]
    assert replayed[1]["functionCall"] == {"name": "notify", "args": NOTICE}
    assert second.text == "All set."


def test_every_chunk_the_fake_streams_is_a_valid_sdk_response():
    with GeminiFake(stream_arguments=True) as server:
        server.push(_reply())
        parts = streamed_call_parts({"functionCall": {"name": "book", "args": BOOKING}})
    for part in parts:
        validate_gemini_response({"candidates": [{"content": {"role": "model", "parts": [part]}}]})
    strings = [p for p in parts if "stringValue" in str(p)]
    assert any(p["functionCall"]["partialArgs"][0]["willContinue"] for p in strings)
    assert parts[-1] == {"functionCall": {}}


def _event(parts: list, finish: str | None = None) -> SimpleNamespace:
    candidate: dict = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    return SimpleNamespace(data=json.dumps({"candidates": [candidate]}))


def test_a_new_call_closes_the_previous_one_and_an_id_from_the_api_is_kept():
    parser = GeminiStreamParser(model=MODEL)
    out = parser.feed(_event([{"functionCall": {"name": "a", "id": "x1", "willContinue": True}}]))
    assert out == []  # not out before its arguments are complete
    parser.feed(
        _event(
            [
                {
                    "functionCall": {
                        "partialArgs": [{"jsonPath": "$.n", "numberValue": 1}],
                        "willContinue": True,
                    }
                }
            ]
        )
    )
    out = parser.feed(_event([{"functionCall": {"name": "b", "args": {"k": "v"}}}], finish="STOP"))
    turn = parser.finish()
    assert [d.tool_call_delta["name"] for d in out] == ["a", "b"]
    assert [(c.id, c.arguments) for c in turn.tool_calls] == [
        ("x1", {"n": 1}),
        ("call_1_b", {"k": "v"}),
    ]


def test_a_stream_cut_inside_a_call_keeps_the_arguments_so_far_in_the_partial_turn():
    parser = GeminiStreamParser(model=MODEL)
    parser.feed(_event([{"functionCall": {"name": "a", "willContinue": True}}]))
    parser.feed(
        _event(
            [
                {
                    "functionCall": {
                        "partialArgs": [
                            {"jsonPath": "$.q", "stringValue": "hal", "willContinue": True}
                        ],
                        "willContinue": True,
                    }
                }
            ]
        )
    )
    assert parser.partial_turn().tool_calls[0].arguments == {"q": "hal"}


def test_fragments_without_an_open_call_are_skipped_with_a_debug_log(caplog):
    parser = GeminiStreamParser(model=MODEL)
    stray = {"functionCall": {"partialArgs": [{"jsonPath": "$.x", "boolValue": True}]}}
    with caplog.at_level(logging.DEBUG, logger="providers.wire.gemini"):
        parser.feed(_event([stray, {"text": "Still here."}], finish="STOP"))
    turn = parser.finish()
    assert turn.tool_calls == [] and turn.text == "Still here."
    assert "no open call" in caplog.text


def test_a_whole_response_with_streamed_shapes_parses_the_same_way():
    # The blocking path reads its reply through the same parser.
    parts = [
        *streamed_call_parts({"functionCall": {"name": "book", "args": BOOKING}}),
        {"text": "Booked."},
    ]
    payload = {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP"}]
    }
    turn = parse_response(payload, model=MODEL)
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("book", BOOKING)]
    assert turn.text == "Booked."


@pytest.mark.parametrize(
    ("path", "steps"),
    [
        ("$.location", ["location"]),
        ("$.items[1].price", ["items", 1, "price"]),
        ("$['odd key'][0]", ["odd key", 0]),
        ('$["quote\\"d"]', ['quote"d']),
        ("$..deep", None),
        ("$.items[*]", None),
        ("items", None),
    ],
)
def test_json_paths_are_read_as_normalized_paths(path, steps):
    assert json_path_steps(path) == steps


def test_strings_join_only_while_the_previous_piece_said_it_continues():
    args = StreamedArguments()
    args.apply({"jsonPath": "$.s", "stringValue": "ab", "willContinue": True})
    args.apply({"jsonPath": "$.s", "stringValue": "cd"})
    args.apply({"jsonPath": "$.t", "stringValue": "x"})
    args.apply({"jsonPath": "$.t", "stringValue": "y"})  # a restart, not a continuation
    assert args.value == {"s": "abcd", "t": "y"}
    assert not args.apply({"jsonPath": "$.s[0]", "stringValue": "z"})  # index into a string
