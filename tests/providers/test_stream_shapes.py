"""Shapes of the current APIs beyond the basics, on every wire (issue 23): refusals and
safety stops, the new stop reasons, and events or parts a parser does not know, which
are skipped with a debug log while what is known still lands.

End to end through the router against each API's fake, on the blocking path and on both
streaming paths; parser-level where the fake has no way to emit the shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from providers import ProviderRouter
from providers.outbound import OutboundPolicy
from providers.registry import get_descriptor
from providers.types import AssistantTurn, ModelCapabilities
from providers.wire.bedrock_converse import ConverseStreamParser
from providers.wire.gemini import GeminiStreamParser
from providers.wire.openai_responses import ResponsesStreamParser
from tests.fakes import script as fake
from tests.providers.test_every_provider import MODEL_FOR_API, _profile, _server

USER = [{"role": "user", "content": "Tell me."}]
PATHS = ("complete", "stream", "astream")


@contextlib.contextmanager
def _wired(name: str) -> Iterator[tuple[Any, ProviderRouter, str]]:
    descriptor = get_descriptor(name)
    model = MODEL_FOR_API[descriptor.api]
    with _server(descriptor) as server:
        router = ProviderRouter(
            {f"provider:{name}": _profile(descriptor, server, sigv4=True)},
            matrix={f"{name}:{model}": ModelCapabilities(tools=True, curated=True)},
            outbound=OutboundPolicy(allow_loopback=True),
        )
        try:
            yield server, router, f"{name}:{model}"
        finally:
            router.close()


def _turn(router: ProviderRouter, model: str, path: str) -> AssistantTurn:
    if path == "complete":
        return router.complete(model=model, messages=USER)
    if path == "stream":
        return list(router.stream(model=model, messages=USER))[-1].turn

    async def read() -> AssistantTurn:
        try:
            return [c async for c in router.astream(model=model, messages=USER)][-1].turn
        finally:
            await router.aclose()

    return asyncio.run(read())


# --- refusals and safety stops ----------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_a_chat_completions_refusal_is_the_text_the_user_sees(path):
    with _wired("together") as (server, router, model):
        server.push(
            fake.Reply(
                fake.wire_event("openai", {"refusal": "I can't help with that."}),
                stop="content_filter",
            )
        )
        turn = _turn(router, model, path)
    assert turn.text == "I can't help with that."
    assert turn.finish_reason == "content_filter"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("reason", ["SAFETY", "RECITATION", "MALFORMED_FUNCTION_CALL"])
def test_gemini_safety_stops_finish_with_what_was_said(path, reason):
    with _wired("gemini") as (server, router, model):
        server.push(fake.Reply(fake.text("The first part"), stop=reason))
        turn = _turn(router, model, path)
    assert turn.finish_reason == reason
    assert turn.text == "The first part"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "reason", ["guardrail_intervened", "content_filtered", "model_context_window_exceeded"]
)
def test_bedrock_new_stop_reasons_come_through(path, reason):
    with _wired("bedrock") as (server, router, model):
        server.push(fake.Reply(fake.text("Up to here."), stop=reason))
        turn = _turn(router, model, path)
    assert turn.finish_reason == reason
    assert turn.text == "Up to here."


# --- unknown shapes: skipped, logged, the rest lands -------------------------------------


def _sse(payload: dict, event: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(event=event or payload.get("type"), data=json.dumps(payload))


def test_gemini_parts_of_unknown_kinds_are_skipped_and_the_text_lands(caplog):
    parser = GeminiStreamParser(model="gemini-3-fake")
    parts = [
        {"text": "Here is a chart: "},
        {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
        {"hologram": {"x": 1}},
        {"text": "done."},
    ]
    payload = {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP"}]
    }
    with caplog.at_level(logging.DEBUG, logger="providers.wire.gemini"):
        parser.feed(_sse(payload))
    turn = parser.finish()
    assert turn.text == "Here is a chart: done."
    assert "hologram" in caplog.text and "inlineData" in caplog.text


def test_responses_events_of_unknown_types_are_skipped_and_the_text_lands(caplog):
    parser = ResponsesStreamParser(model="gpt-5")
    events = [
        {"type": "response.created", "response": {"id": "resp_1", "model": "gpt-5"}},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"type": "message", "id": "msg_1", "content": []},
        },
        {"type": "response.hologram.delta", "output_index": 0, "delta": "?"},
        {"type": "response.output_text.delta", "output_index": 0, "delta": "Still here."},
        {"type": "response.completed", "response": {"status": "completed", "output": []}},
    ]
    with caplog.at_level(logging.DEBUG, logger="providers.wire.openai_responses"):
        for event in events:
            parser.feed(_sse(event))
    assert parser.finish().text == "Still here."
    assert "response.hologram.delta" in caplog.text


def test_bedrock_events_and_deltas_of_unknown_kinds_are_skipped_and_the_text_lands(caplog):
    parser = ConverseStreamParser(model="anthropic.claude-sonnet-4-5-v1:0")
    with caplog.at_level(logging.DEBUG, logger="providers.wire.bedrock_converse"):
        parser.feed_event("messageStart", {"role": "assistant"})
        parser.feed_event("futureEvent", {"x": 1})
        parser.feed_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hi."}})
        parser.feed_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"hologram": {}}})
        parser.feed_event("messageStop", {"stopReason": "end_turn"})
    assert parser.finish().text == "Hi."
    assert "futureEvent" in caplog.text and "hologram" in caplog.text
