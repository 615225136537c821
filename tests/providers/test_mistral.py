"""Mistral: requests its strict API accepts, and its reasoning models' content chunks.

Against `MistralFake`, which checks every request body against the `mistralai` SDK's
request TypedDict (unknown keys refused, so `stream_options` is a 422), refuses tool-call
ids that are not nine letters and digits, and streams thinking as typed content chunks.
"""

from __future__ import annotations

import copy
import json
import logging
from types import SimpleNamespace

import httpx
import pytest

from providers.context import build_context
from providers.outbound import OutboundPolicy
from providers.registry import get_descriptor
from providers.transport import Transport
from providers.types import ModelCapabilities
from providers.wire.openai_completions import (
    CompletionsStreamParser,
    OpenAICompletionsClient,
    build_request,
    parse_completion,
    rekey_tool_call_ids,
)
from tests.fakes import script as fake
from tests.fakes.mistral import TOOL_CALL_ID, MistralFake
from tests.fakes.validate import validate_mistral_chunk, validate_mistral_request
from tests.providers.paths import STREAM_PATHS, streamed, tool_deltas

MISTRAL = get_descriptor("mistral")
MODEL = "magistral-medium-latest"
THINKS = ModelCapabilities(tools=True, reasoning=True)
USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "17 * 23?"}]
TOOLS = [
    {
        "name": "calc",
        "description": "Multiply",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    }
]


def _client(server: MistralFake):
    def make() -> OpenAICompletionsClient:
        transport = Transport(
            policy=OutboundPolicy(allow_loopback=True), max_retries=0, read_timeout=5.0
        )
        return OpenAICompletionsClient(
            MISTRAL,
            api_key="k",
            base_url=server.base_url,
            transport=transport,
            capabilities=lambda model: THINKS,
        )

    return make


def _post(server: MistralFake, body: dict) -> tuple[int, dict]:
    response = httpx.post(
        server.base_url + "/chat/completions", json=body, headers={"Authorization": "Bearer k"}
    )
    return response.status_code, response.json()


def _thinking_reply() -> fake.Reply:
    return fake.Reply(
        fake.reasoning("Seventeen times twenty-three is 391."),
        fake.text("It is 391."),
        fake.usage(input=20, output=12),
    )


# --- reasoning chunks ------------------------------------------------------------------


@pytest.mark.parametrize("path", STREAM_PATHS)
@pytest.mark.parametrize("text_chunks", [False, True], ids=["text-strings", "text-chunks"])
def test_streamed_thinking_chunks_land_in_reasoning_and_text_chunks_in_text(path, text_chunks):
    with MistralFake(api_key="k", text_chunks=text_chunks) as server:
        server.push(_thinking_reply())
        chunks = streamed(_client(server), path, model=MODEL, messages=USER)
        sent = server.last_request.body

    turn = chunks[-1].turn
    assert turn.reasoning == "Seventeen times twenty-three is 391."
    assert turn.text == "It is 391."
    assert "".join(c.reasoning or "" for c in chunks[:-1]) == turn.reasoning
    assert "".join(c.text or "" for c in chunks[:-1]) == turn.text
    # Usage comes in the last chunk without `stream_options`, which Mistral refuses.
    assert "stream_options" not in sent
    validate_mistral_request(sent)
    assert turn.usage.input == 20 and turn.usage.output == 12


def test_a_whole_reply_splits_its_content_chunks_into_reasoning_and_text():
    with MistralFake(api_key="k") as server:
        server.push(_thinking_reply())
        client = _client(server)()
        turn = client.complete(model=MODEL, messages=USER)
        client.close()
        sent = server.last_request.body

    validate_mistral_request(sent)
    assert (turn.reasoning, turn.text) == ("Seventeen times twenty-three is 391.", "It is 391.")
    assert turn.extras["_mistral"]["model"] == MODEL


def test_every_chunk_the_fake_streams_is_a_valid_sdk_chunk():
    with MistralFake(api_key="k", text_chunks=True) as server:
        server.push(fake.Reply(fake.reasoning("Hm."), fake.text("Ok."), fake.tool_call("calc")))
        response = httpx.post(
            server.base_url + "/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True},
            headers={"Authorization": "Bearer k"},
        )
    lines = response.text.splitlines()
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    for event in events:
        validate_mistral_chunk(event)
    assert events[-1]["usage"]["prompt_tokens"] > 0
    assert TOOL_CALL_ID.fullmatch(
        next(e for e in events if e["choices"][0]["delta"].get("tool_calls"))["choices"][0][
            "delta"
        ]["tool_calls"][0]["id"]
    )


def test_the_same_models_turn_goes_back_with_its_thinking_chunk_first():
    with MistralFake(api_key="k") as server:
        server.push(
            fake.Reply(fake.reasoning("Use the tool."), fake.tool_call("calc", {"a": 17})),
            fake.Reply(fake.text("391.")),
        )
        make = _client(server)
        first = streamed(make, "stream", model=MODEL, messages=USER, tools=TOOLS)[-1].turn
        history = [
            *USER,
            {
                "role": "assistant",
                "content": first.text,
                "reasoning": first.reasoning,
                "extras": first.extras,
                "tool_calls": [c.to_dict() for c in first.tool_calls],
            },
            {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "391"},
        ]
        streamed(make, "stream", model=MODEL, messages=history, tools=TOOLS)
        streamed(make, "stream", model="mistral-small-latest", messages=history, tools=TOOLS)
        same, other = (r.body for r in server.requests[-2:])

    validate_mistral_request(same)
    replayed = same["messages"][2]
    assert replayed["content"] == [
        {"type": "thinking", "thinking": [{"type": "text", "text": "Use the tool."}]}
    ]
    assert replayed["tool_calls"][0]["id"] == first.tool_calls[0].id  # Mistral's own id
    # Another model never sees this model's thinking: plain content only.
    assert other["messages"][2]["content"] is None


def test_a_thinking_chunk_signature_is_kept_and_replayed():
    parser = CompletionsStreamParser(model=MODEL, sidecar="_mistral")
    for delta in (
        {"content": [{"type": "thinking", "thinking": [{"type": "text", "text": "Hm"}]}]},
        {"content": [{"type": "thinking", "thinking": [], "signature": "c2ln"}]},
        {"content": "Done."},
    ):
        data = {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        parser.feed(SimpleNamespace(data=json.dumps(data)))
    parser.feed(SimpleNamespace(data="[DONE]"))
    turn = parser.finish()
    history = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": turn.text, "extras": turn.extras},
        {"role": "user", "content": "y"},
    ]
    body = build_request(
        build_context(history, None), model=MODEL, descriptor=MISTRAL, stream=True, settings={}
    )
    validate_mistral_request(body)
    assert body["messages"][1]["content"][0]["signature"] == "c2ln"
    assert body["messages"][1]["content"][1] == {"type": "text", "text": "Done."}


def test_unknown_content_chunks_are_skipped_with_a_debug_log_and_the_text_lands(caplog):
    payload = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": [
                        {"type": "hologram", "data": "?"},
                        {"type": "text", "text": "Still here."},
                    ],
                },
                "finish_reason": "stop",
            }
        ]
    }
    with caplog.at_level(logging.DEBUG, logger="providers.wire.openai_completions"):
        turn = parse_completion(payload, model=MODEL)
    assert turn.text == "Still here."
    assert "hologram" in caplog.text


# --- tool-call ids ---------------------------------------------------------------------

FOREIGN = [
    {"role": "user", "content": "Weather in Bern and Oslo?"},
    {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {"id": "toolu_01A09q90qw90lq917835lq9", "name": "calc", "arguments": {"a": 1}},
            {"id": "call_0_calc", "name": "calc", "arguments": {"a": 2}},
        ],
    },
    {"role": "tool", "tool_call_id": "toolu_01A09q90qw90lq917835lq9", "content": "one"},
    {"role": "tool", "tool_call_id": "call_0_calc", "content": "two"},
    {"role": "user", "content": "And now?"},
]


@pytest.mark.parametrize("path", [*STREAM_PATHS, "complete"])
def test_another_providers_history_is_rekeyed_on_the_way_out_only(path):
    history = copy.deepcopy(FOREIGN)
    with MistralFake(api_key="k") as server:
        server.push(fake.Reply(fake.text("Done.")), fake.Reply(fake.text("Again.")))
        make = _client(server)
        for _ in range(2):
            if path == "complete":
                client = make()
                turn = client.complete(model=MODEL, messages=history, tools=TOOLS)
                client.close()
            else:
                turn = streamed(make, path, model=MODEL, messages=history, tools=TOOLS)[-1].turn
        first, second = (r.body for r in server.requests[-2:])

    assert turn.text == "Again."
    validate_mistral_request(first)
    calls = [c["id"] for c in first["messages"][1]["tool_calls"]]
    results = [m["tool_call_id"] for m in first["messages"][2:4]]
    assert all(TOOL_CALL_ID.fullmatch(i) for i in calls) and calls == results
    assert len(set(calls)) == 2
    assert second["messages"] == first["messages"]  # stable: the cached prefix holds
    assert history == FOREIGN  # the transcript keeps its own ids


def test_a_history_with_foreign_ids_without_rekeying_is_what_mistral_refuses():
    # The fake's rule is the real API's: it is what the re-keying above gets past.
    with MistralFake(api_key="k") as server:
        status, body = _post(
            server,
            {
                "model": MODEL,
                "messages": [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "toolu_01",
                                "type": "function",
                                "function": {"name": "calc", "arguments": "{}"},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "toolu_01", "content": "r"},
                ],
            },
        )
    assert status == 400 and "length of 9" in body["message"]


def test_stream_options_is_refused_by_the_sdk_schema():
    with MistralFake(api_key="k") as server:
        status, body = _post(
            server,
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
    assert status == 422 and "stream_options" in json.dumps(body)


def test_rekeying_keeps_valid_ids_and_gives_clashing_ones_distinct_names():
    rename = rekey_tool_call_ids(9)
    assert rename("abcDEF123") == "abcDEF123"
    assert rename("toolu_x") == rename("toolu_x") != rename("toolu_y")
    tiny = rekey_tool_call_ids(1)  # 62 names: clashes are certain among 40 ids
    names = [tiny(f"call_{n}") for n in range(40)]
    assert len(set(names)) == 40


def test_tool_deltas_of_a_streamed_call_carry_mistrals_id():
    with MistralFake(api_key="k") as server:
        server.push(fake.Reply(fake.tool_call("calc", {"a": 3})))
        chunks = streamed(_client(server), "stream", model=MODEL, messages=USER, tools=TOOLS)
    deltas = tool_deltas(chunks)
    assert TOOL_CALL_ID.fullmatch(deltas[0]["id"])
    assert chunks[-1].turn.tool_calls[0].arguments == {"a": 3}
