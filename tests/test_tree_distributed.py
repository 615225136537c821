"""The tree in distributed mode with real processes (PostgreSQL, Redis, Daphne, a Celery
worker, a websocket client, a fake Anthropic upstream that checks what it is sent): edit,
regenerate, switch back and continue, each turn on its own path."""

from __future__ import annotations

import json

import pytest

from sessions.models import Message, Session
from tests.fakes import Reply, text, tool_call
from tests.fakes.validate import validate_anthropic_request
from tests.support.chat import open_ws, point_provider_at, read_sync_until_status

pytestmark = [pytest.mark.distributed, pytest.mark.django_db(transaction=True)]
MODEL = "anthropic:claude-test-1"


def _until(ws, kind: str) -> dict:  # type: ignore[no-untyped-def]
    while True:
        event = json.loads(ws.recv(timeout=15))
        if event.get("type") == kind:
            return event


def _turn(ws, frame: dict) -> list[dict]:  # type: ignore[no-untyped-def]
    ws.send(json.dumps(frame))
    return read_sync_until_status(ws)


def test_edit_regenerate_switch_and_continue_run_each_turn_on_its_own_path(
    daphne_server, celery_worker, owner, anthropic_fake
):
    anthropic_fake.strict_roles = True
    anthropic_fake.push(
        Reply(text("Looking. "), tool_call("list_files", {})),
        Reply(text("Nothing there.")),
        Reply(text("Hi.")),
        Reply(text("Hello, "), stop="max_tokens"),
        Reply(text("friend.")),
        Reply(text("Bye.")),
    )
    point_provider_at(owner, "anthropic", anthropic_fake.base_url)
    session = Session.objects.create(owner=owner, model=MODEL)
    with open_ws(daphne_server, owner, session) as ws:
        assert _turn(ws, {"type": "send", "text": "Any files?"})[-1]["status"] == "completed"
        events = _turn(ws, {"type": "edit", "message": 1, "text": "Say hi", "leaf": 4})
        assert any(e["type"] == "session.branch" for e in events)
        hi = Message.objects.get(session=session, content="Hi.")
        events = _turn(ws, {"type": "regenerate", "message": hi.seq})
        cut = Message.objects.get(session=session, content="Hello, ")
        assert cut.parent_seq == hi.parent_seq
        events = _turn(ws, {"type": "continue", "turn": events[-1]["turn"]})
        assert events[-1]["status"] == "completed"
        rest = Message.objects.get(session=session, content="friend.")
        assert (rest.parent_seq, rest.continuation) == (cut.seq, "prefill")
        ws.send(json.dumps({"type": "switch", "message": 1}))
        assert _until(ws, "session.branch")["path"] == [1, 2, 3, 4]
        _turn(ws, {"type": "send", "text": "Thanks"})
    # The continue request ended with the cut reply (a prefill, no trailing space).
    assert anthropic_fake.requests[4].body["messages"][-1]["role"] == "assistant"
    after_switch = json.dumps(anthropic_fake.requests[5].body["messages"])
    assert "Any files?" in after_switch and "Say hi" not in after_switch
    for request in anthropic_fake.requests:
        validate_anthropic_request(request.body)
        assert anthropic_fake.check_request(request.body) is None
