"""Worker crash drill with real processes: `kill -9` of the Celery worker mid-turn leaves
an interrupted turn (within seconds, via the Daphne process's lease sweeper) that keeps
its partial text; a redelivered task changes nothing; retry completes the turn.

Its own module so that no other worker process is consuming the turns queue."""

from __future__ import annotations

import json
import time

import pytest

from openworker.runtime.turns.tasks import run_turn_task
from sessions.models import Message, Session, Turn
from tests.fakes import Reply, drip, text
from tests.support import procs
from tests.support.chat import (
    open_ws,
    point_provider_at,
    read_sync_until_status,
    wait_for_turn_status,
)

MODEL = "anthropic:claude-test-1"


def _session(owner, fake) -> Session:
    point_provider_at(owner, "anthropic", fake.base_url)
    return Session.objects.create(owner=owner, model=MODEL)


pytestmark = [pytest.mark.distributed, pytest.mark.django_db(transaction=True)]


def test_a_killed_worker_leaves_an_interrupted_turn_that_retry_completes(
    daphne_server, distributed_env, owner, anthropic_fake
):
    words = [f"x{i} " for i in range(200)]
    anthropic_fake.push(Reply(drip(0.05), *[text(w) for w in words]))
    anthropic_fake.push(Reply(text("Complete answer.")))
    session = _session(owner, anthropic_fake)
    with (
        procs.celery_worker(distributed_env) as worker,
        open_ws(daphne_server, owner, session) as ws,
    ):
        ws.send(json.dumps({"type": "send", "text": "long"}))
        seen = 0
        while seen < 5:
            event = json.loads(ws.recv(timeout=15))
            seen += event.get("type") == "delta"
        turn_id = event["turn"]
        time.sleep(1.2)  # at least one heartbeat carried the partial text
        worker.kill()
        turn, elapsed = wait_for_turn_status(turn_id, {"interrupted"}, timeout=10)
        events = read_sync_until_status(ws, {"interrupted"}, timeout=10)
    assert elapsed < 10
    assert turn.partial_text.startswith("x0 x1 x2 ")
    assert events[-1]["status"] == "interrupted"
    assert list(Message.objects.filter(session=session).values_list("role", flat=True)) == ["user"]

    # A redelivered task for the interrupted turn does nothing.
    run_turn_task.apply(args=[turn_id])
    assert Turn.objects.get(pk=turn_id).status == "interrupted"

    with procs.celery_worker(distributed_env), open_ws(daphne_server, owner, session) as ws:
        ws.send(json.dumps({"type": "retry", "turn": turn_id}))
        events = read_sync_until_status(ws, {"completed", "failed"}, timeout=30)
    assert events[-1]["status"] == "completed"
    roles = list(Message.objects.filter(session=session).values_list("role", flat=True))
    assert roles == ["user", "assistant"]
    assert Message.objects.get(session=session, role="assistant").content == "Complete answer."
    # Redelivery after completion is a no-op too: still exactly one assistant message.
    run_turn_task.apply(args=[turn_id])
    assert Message.objects.filter(session=session, role="assistant").count() == 1
