"""Anthropic shapes of this year's models, end to end against the fake (issue 23).

Programmatic tool calling (a client `tool_use` called from code execution, its whole
`input` in `content_block_start` and a `caller`, no `input_json_delta`), server tools
(web search: `server_tool_use`, `web_search_tool_result`, cited text), the new stop
reasons, unknown blocks and events (skipped, the rest lands) and header hygiene. Every
streamed event is checked against the `anthropic` SDK's event union, every request body
against its `MessageCreateParams`.
"""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from providers.outbound import OutboundPolicy
from providers.registry import get_descriptor
from providers.transport import Transport
from providers.types import ModelCapabilities
from providers.wire.anthropic_messages import AnthropicMessagesClient
from tests.fakes import script as fake
from tests.fakes.anthropic_messages import AnthropicMessagesFake
from tests.fakes.validate import validate_anthropic_event, validate_anthropic_request
from tests.providers.paths import STREAM_PATHS, streamed, tool_deltas

ANTHROPIC = get_descriptor("anthropic")
MODEL = "claude-opus-4-6"
USER = [{"role": "user", "content": "How warm is it in Bern, per the latest news?"}]
TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
CALLER = {"type": "code_execution_20250825", "tool_id": "srvtoolu_01Code"}
PTC_INPUT = {"city": "Bern", "units": {"temperature": "celsius"}, "days": [1, 2]}
PATHS = [*STREAM_PATHS, "complete"]


def _client(server: AnthropicMessagesFake):
    def make() -> AnthropicMessagesClient:
        transport = Transport(
            policy=OutboundPolicy(allow_loopback=True), max_retries=0, read_timeout=5.0
        )
        return AnthropicMessagesClient(
            ANTHROPIC,
            api_key="k",
            base_url=server.root_url,
            transport=transport,
            capabilities=lambda model: ModelCapabilities(tools=True),
        )

    return make


def _reply(server: AnthropicMessagesFake, path: str, messages=USER, **call):
    """(streamed chunks or None, the turn) of one reply read through `path`."""
    if path == "complete":
        client = _client(server)()
        try:
            return None, client.complete(model=MODEL, messages=messages, tools=TOOLS, **call)
        finally:
            client.close()
    chunks = streamed(_client(server), path, model=MODEL, messages=messages, tools=TOOLS, **call)
    return chunks, chunks[-1].turn


def _raw_events(server: AnthropicMessagesFake) -> list[dict]:
    """The fake's stream of its next scripted reply, as parsed SSE data."""
    response = httpx.post(
        server.root_url + "/v1/messages",
        json={"model": MODEL, "max_tokens": 64, "messages": USER, "stream": True},
        headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
    )
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data:")]


def _history(turn, result: str = "18 degrees") -> list[dict]:
    return [
        *USER,
        {
            "role": "assistant",
            "content": turn.text,
            "extras": turn.extras,
            "tool_calls": [c.to_dict() for c in turn.tool_calls],
        },
        *({"role": "tool", "tool_call_id": c.id, "content": result} for c in turn.tool_calls),
    ]


# --- programmatic tool calling ---------------------------------------------------------


def _ptc_reply() -> fake.Reply:
    return fake.Reply(
        fake.wire_block(
            "anthropic",
            {
                "type": "server_tool_use",
                "id": "srvtoolu_01Code",
                "name": "code_execution",
                "input": {},
            },
            {"type": "input_json_delta", "partial_json": '{"code": "get_weather(\\"Bern\\")"}'},
        ),
        fake.tool_call("get_weather", PTC_INPUT, id="toolu_01Ptc", caller=CALLER),
    )


@pytest.mark.parametrize("path", PATHS)
def test_a_programmatic_tool_call_keeps_its_whole_input_as_the_arguments(path):
    with AnthropicMessagesFake(api_key="k") as server:
        server.push(_ptc_reply())
        chunks, turn = _reply(server, path)

    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("toolu_01Ptc", "get_weather", PTC_INPUT)
    ]
    assert turn.extras["_anthropic"]["callers"] == {"toolu_01Ptc": CALLER}
    if chunks is not None:  # the call's delta carries the arguments, once
        deltas = tool_deltas(chunks)
        assert [json.loads(d["arguments"]) for d in deltas if d["arguments"]] == [PTC_INPUT]


def test_a_programmatic_tool_call_goes_back_with_its_caller_and_the_code_block():
    with AnthropicMessagesFake(api_key="k") as server:
        server.push(_ptc_reply(), fake.Reply(fake.text("18 degrees in Bern.")))
        _, first = _reply(server, "stream")
        _, second = _reply(server, "stream", messages=_history(first))
        sent = server.last_request.body

    validate_anthropic_request(sent)
    # The results go to the container the paused code runs in (the fake refuses them
    # without it, as the API does).
    assert sent["container"] == first.extras["_anthropic"]["container"]["id"]
    blocks = sent["messages"][1]["content"]
    assert blocks[0]["type"] == "server_tool_use"
    assert blocks[0]["input"] == {"code": 'get_weather("Bern")'}
    assert blocks[-1] == {
        "type": "tool_use",
        "id": "toolu_01Ptc",
        "name": "get_weather",
        "input": PTC_INPUT,
        "caller": CALLER,
    }
    assert second.text == "18 degrees in Bern."


def test_the_fakes_programmatic_call_events_are_valid_sdk_events():
    with AnthropicMessagesFake(api_key="k") as server:
        server.push(_ptc_reply())
        events = _raw_events(server)
    for event in events:
        validate_anthropic_event(event)
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert starts[-1]["input"] == PTC_INPUT and starts[-1]["caller"] == CALLER
    tool_index = len(starts) - 1
    assert not [
        e for e in events if e["type"] == "content_block_delta" and e["index"] == tool_index
    ]


# --- server tools: web search with citations ---------------------------------------------

SEARCH_RESULT = {
    "type": "web_search_result",
    "url": "https://news.example/bern",
    "title": "Bern weather",
    "encrypted_content": "EqgfCioIARgBIiQ3YTAwMjY1Mi1mZjM5",
    "page_age": "April 30, 2025",
}
CITATION = {
    "type": "web_search_result_location",
    "url": "https://news.example/bern",
    "title": "Bern weather",
    "encrypted_index": "Eo8BCioIAhgBIiQyYjQ0OWJmZi1lNm",
    "cited_text": "Bern reaches 18 degrees today.",
}


def _search_reply(stop: str | None = None) -> fake.Reply:
    return fake.Reply(
        fake.text("Let me search. "),
        fake.wire_block(
            "anthropic",
            {"type": "server_tool_use", "id": "srvtoolu_01Web", "name": "web_search", "input": {}},
            {"type": "input_json_delta", "partial_json": '{"query": "Bern'},
            {"type": "input_json_delta", "partial_json": ' weather"}'},
        ),
        fake.wire_block(
            "anthropic",
            {
                "type": "web_search_tool_result",
                "tool_use_id": "srvtoolu_01Web",
                "content": [SEARCH_RESULT],
            },
        ),
        fake.wire_block(
            "anthropic",
            {"type": "text", "text": "", "citations": []},
            {"type": "citations_delta", "citation": CITATION},
            {"type": "text_delta", "text": "It is 18 degrees."},
        ),
        stop=stop,
    )


@pytest.mark.parametrize("path", PATHS)
def test_a_web_search_reply_keeps_its_text_citations_and_server_blocks(path):
    with AnthropicMessagesFake(api_key="k") as server:
        server.push(_search_reply())
        chunks, turn = _reply(server, path)

    assert turn.text == "Let me search. It is 18 degrees."
    assert turn.tool_calls == []  # the API ran the search itself
    sidecar = turn.extras["_anthropic"]
    assert [b["type"] for b in sidecar["server"]] == ["server_tool_use", "web_search_tool_result"]
    assert sidecar["server"][0]["input"] == {"query": "Bern weather"}
    assert sidecar["citations"] == [CITATION]
    if chunks is not None:
        assert "".join(c.text or "" for c in chunks[:-1]) == turn.text
        assert tool_deltas(chunks) == []


def test_server_blocks_go_back_to_the_same_model_and_validate():
    with AnthropicMessagesFake(api_key="k") as server:
        server.push(_search_reply(), fake.Reply(fake.text("You're welcome.")))
        _, first = _reply(server, "stream")
        history = [
            *USER,
            {"role": "assistant", "content": first.text, "extras": first.extras},
            {"role": "user", "content": "Thanks!"},
        ]
        _reply(server, "stream", messages=history)
        same = server.last_request.body
        client = _client(server)()
        client.complete(model="claude-sonnet-4-5", messages=history, tools=TOOLS)
        client.close()
        other = server.last_request.body

    validate_anthropic_request(same)
    kinds = [b["type"] for b in same["messages"][1]["content"]]
    assert kinds == ["server_tool_use", "web_search_tool_result", "text"]
    assert [b["type"] for b in other["messages"][1]["content"]] == ["text"]


def test_the_fakes_server_tool_events_are_valid_sdk_events():
    with AnthropicMessagesFake(api_key="k") as server:
        server.push(_search_reply())
        events = _raw_events(server)
    for event in events:
        validate_anthropic_event(event)
    assert any(e.get("delta", {}).get("type") == "citations_delta" for e in events)


# --- stop reasons ------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("reason", ["pause_turn", "refusal", "model_context_window_exceeded"])
def test_new_stop_reasons_come_through_with_what_was_said(path, reason):
    with AnthropicMessagesFake(api_key="k") as server:
        server.push(fake.Reply(fake.text("Partial answer."), stop=reason))
        _, turn = _reply(server, path)
    assert turn.finish_reason == reason
    assert turn.text == "Partial answer."


# --- unknown shapes ------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_unknown_blocks_deltas_and_events_are_skipped_and_the_rest_lands(path, caplog):
    with AnthropicMessagesFake(api_key="k", validate=True) as server:
        server.push(
            fake.Reply(
                fake.text("Before. "),
                fake.wire_block(
                    "anthropic",
                    {"type": "hologram", "data": "?"},
                    {"type": "hologram_delta", "bits": "01"},
                ),
                fake.wire_event("anthropic", {"type": "future_event", "x": 1}),
                fake.wire_block(
                    "anthropic",
                    {"type": "text", "text": ""},
                    {"type": "sparkle_delta", "sparkle": "*"},
                    {"type": "text_delta", "text": "After."},
                ),
                fake.tool_call("get_weather", {"city": "Bern"}, id="toolu_01After"),
            )
        )
        with caplog.at_level(logging.DEBUG, logger="providers.wire.anthropic_messages"):
            _, turn = _reply(server, path)

    assert turn.text == "Before. After."
    assert [(c.id, c.arguments) for c in turn.tool_calls] == [("toolu_01After", {"city": "Bern"})]
    assert "hologram" not in json.dumps(turn.extras)
    if path != "complete":
        assert "hologram" in caplog.text and "future_event" in caplog.text
        assert "sparkle_delta" in caplog.text


# --- header hygiene ------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_requests_carry_content_type_exactly_once(path):
    with AnthropicMessagesFake(api_key="k") as server:
        server.push(fake.Reply(fake.text("Hi.")))
        _, turn = _reply(server, path)
        request = server.last_request

    assert turn.text == "Hi."
    assert request.header_count("content-type") == 1
    assert request.headers["content-type"] == "application/json"
    assert request.header_count("x-api-key") == 1


def test_the_fake_refuses_a_repeated_content_type_header():
    with AnthropicMessagesFake(api_key="k") as server:
        response = httpx.post(
            server.root_url + "/v1/messages",
            content=json.dumps({"model": MODEL, "max_tokens": 8, "messages": USER}),
            headers=[
                ("x-api-key", "k"),
                ("anthropic-version", "2023-06-01"),
                ("Content-Type", "application/json"),
                ("content-type", "application/json"),
            ],
        )
    assert response.status_code == 400
    assert "content-type" in response.json()["error"]["message"]


# --- cache TTL order -------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_mixed_cache_ttls_go_out_longest_first_and_the_api_accepts_them(path):
    hour = {"type": "ephemeral", "ttl": "1h"}
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Doc", "cache_control": hour}]},
        {"role": "assistant", "content": "Read it."},
        {"role": "user", "content": "Summarise."},
    ]
    with AnthropicMessagesFake(api_key="k") as server:
        server.push(fake.Reply(fake.text("Short.")))
        _, turn = _reply(server, path, messages=history)
        sent = server.last_request.body

    validate_anthropic_request(sent)
    assert turn.text == "Short."
    ttls = [
        sent["tools"][-1]["cache_control"].get("ttl"),
        sent["system"][0]["cache_control"].get("ttl"),
    ]
    assert ttls == ["1h", "1h"]  # before the caller's 1h mark: raised to match
    assert "ttl" not in sent["messages"][-1]["content"][-1]["cache_control"]
