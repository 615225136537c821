"""Distributed mode with real processes: PostgreSQL, Redis, a Daphne process, a Celery
worker process (threads pool), a websocket client and a fake Anthropic upstream."""

from __future__ import annotations

import json
import time

import pytest
from websockets.sync.client import connect

from sessions.models import Message, Session, Turn
from tests.fakes import Reply, drip, pause, text, tool_call, usage
from tests.support.chat import (
    assert_gapless,
    open_ws,
    point_provider_at,
    read_sync_until_status,
    session_cookie,
    streamed_text,
)

pytestmark = [pytest.mark.distributed, pytest.mark.django_db(transaction=True)]
MODEL = "anthropic:claude-test-1"


def make_session(owner, fake) -> Session:
    point_provider_at(owner, "anthropic", fake.base_url)
    return Session.objects.create(owner=owner, model=MODEL)


def test_a_two_step_tool_turn_streams_in_order_and_is_persisted(
    daphne_server, celery_worker, owner, anthropic_fake
):
    anthropic_fake.push(
        Reply(
            text("Checking the workspace. "), tool_call("list_files", {}), usage(input=40, output=9)
        ),
        Reply(text("It is empty."), usage(input=60, output=4)),
    )
    session = make_session(owner, anthropic_fake)
    with open_ws(daphne_server, owner, session) as ws:
        ws.send(json.dumps({"type": "send", "text": "What is in my workspace?"}))
        events = read_sync_until_status(ws)
    assert events[-1]["status"] == "completed"
    assert_gapless(events)
    assert streamed_text(events) == "Checking the workspace. It is empty."
    roles = list(Message.objects.filter(session=session).values_list("role", flat=True))
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert Turn.objects.get(session=session).usage["input"] == 100


def test_reconnect_mid_turn_yields_the_full_text_once(
    daphne_server, celery_worker, owner, anthropic_fake
):
    words = [f"w{i} " for i in range(40)]
    anthropic_fake.push(Reply(drip(0.03), *[text(w) for w in words]))
    session = make_session(owner, anthropic_fake)
    first: list[dict] = []
    with open_ws(daphne_server, owner, session) as ws:
        ws.send(json.dumps({"type": "send", "text": "count slowly"}))
        while sum(e["type"] == "delta" for e in first) < 3:
            event = json.loads(ws.recv(timeout=15))
            if event.get("turn"):
                first.append(event)
    turn_id, seq = first[-1]["turn"], first[-1]["seq"]
    with open_ws(daphne_server, owner, session, query=f"resume={turn_id}:{seq}") as ws2:
        rest = read_sync_until_status(ws2)
    events = first + rest
    assert_gapless(events)
    assert streamed_text(events) == "".join(words)


def test_stop_ends_the_upstream_request(daphne_server, celery_worker, owner, anthropic_fake):
    anthropic_fake.push(Reply(text("so far "), pause(30), text("never")))
    session = make_session(owner, anthropic_fake)
    with open_ws(daphne_server, owner, session) as ws:
        ws.send(json.dumps({"type": "send", "text": "go"}))
        streamed = ""
        while streamed != "so far ":  # all of it, then the upstream stalls
            event = json.loads(ws.recv(timeout=15))
            streamed += event.get("text", "") if event.get("type") == "delta" else ""
        ws.send(json.dumps({"type": "stop", "turn": event["turn"]}))
        events = read_sync_until_status(ws)
    assert events[-1]["status"] == "cancelled"
    assert anthropic_fake.wait_for_disconnect(5)
    assert Message.objects.get(session=session, role="assistant").content == "so far "


def test_an_ask_tool_waits_for_approval_across_a_disconnect(
    daphne_server, celery_worker, owner, anthropic_fake
):
    anthropic_fake.push(
        Reply(tool_call("fetch_url", {"url": "http://127.0.0.1:9/"})), Reply(text("Done."))
    )
    session = make_session(owner, anthropic_fake)
    with open_ws(daphne_server, owner, session) as ws:
        ws.send(json.dumps({"type": "send", "text": "fetch it"}))
        events = read_sync_until_status(ws)
    assert events[-1]["status"] == "awaiting_approval"
    turn_id = events[-1]["turn"]
    time.sleep(1)
    assert Turn.objects.get(pk=turn_id).status == "awaiting_approval"
    url = daphne_server.replace("http://", "ws://") + f"/ws/sessions/{session.pk}/"
    with connect(
        url, additional_headers={"Cookie": session_cookie(owner), "Origin": daphne_server}
    ) as ws:
        hello = json.loads(ws.recv(timeout=10))
        pending = hello["turns"][0]["pending"]
        assert pending[0]["name"] == "fetch_url"
        ws.send(json.dumps({"type": "approve", "turn": turn_id, "call_id": pending[0]["id"]}))
        events = read_sync_until_status(ws, {"completed", "failed"})
    assert events[-1]["status"] == "completed"
    assert Message.objects.filter(session=session, role="tool").count() == 1
