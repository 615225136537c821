"""Admission control in distributed mode, with real processes: a Celery worker allowed
two turns at once gets a burst of five through a real Daphne; the three beyond wait
first come first served, their pages told their place, and every turn completes with
every token, each run once."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection

from sessions.models import Message, Session, Turn
from tests.fakes import Reply, drip, text
from tests.support import procs
from tests.support.chat import (
    assert_gapless,
    open_ws,
    read_sync_until_status,
    streamed_text,
    users_with_a_session,
)

pytestmark = [pytest.mark.distributed, pytest.mark.django_db(transaction=True)]
MODEL = "anthropic:claude-test-1"
WORDS = [f"w{i} " for i in range(20)]
BURST = 5


def _users_with_a_session(prefix: str, fake: Any) -> list[tuple[Any, Session]]:
    """BURST users, each with a session on `fake`."""
    return users_with_a_session(BURST, fake.base_url, prefix=prefix, model=MODEL)


def test_a_burst_beyond_a_workers_capacity_waits_its_turn_and_loses_nothing(
    distributed_env: dict[str, str], daphne_server: str, anthropic_fake: Any
) -> None:
    for _ in range(BURST):
        anthropic_fake.push(Reply(drip(0.1), *[text(w) for w in WORDS]))
    pairs = _users_with_a_session("burst", anthropic_fake)
    env = {**distributed_env, "OPENWORKER_TURNS_PER_PROCESS": "2"}

    with procs.celery_worker(env, concurrency=BURST + 2), ThreadPoolExecutor(BURST) as pool:

        def one(index: int) -> list[dict]:
            user, session = pairs[index]
            try:
                with open_ws(daphne_server, user, session) as ws:
                    ws.send(json.dumps({"type": "send", "text": "stream, please"}))
                    return read_sync_until_status(ws, timeout=90)
            finally:
                # The sign-in cookie took a pooled connection in this thread: give it back.
                connection.close()

        pages = list(pool.map(one, range(BURST)))

    for events in pages:
        assert events[-1]["status"] == "completed"
        assert streamed_text(events) == "".join(WORDS)
        assert_gapless(events)
    places = [[e["position"] for e in events if e["type"] == "turn.queued"] for events in pages]
    # Two ran at once; the other three waited, each told its place before it started.
    waited = [seen for seen in places if seen]
    assert len(waited) == BURST - 2
    assert sorted(seen[0] for seen in waited) == [1, 2, 3]
    for events, seen in zip(pages, places, strict=True):
        if seen:
            kinds = [e["type"] for e in events]
            assert kinds.index("turn.queued") < kinds.index("turn.status")
            assert seen == sorted(seen, reverse=True)
    # Each turn ran once: one model request and one reply each.
    assert len(anthropic_fake.requests) == BURST
    assert Message.objects.filter(role="assistant").count() == BURST
    assert set(Turn.objects.values_list("attempts", flat=True)) == {1}


def test_a_burst_written_together_reaches_the_worker_as_one_message_and_each_turn_runs_once(
    distributed_env: dict[str, str], anthropic_fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from openworker.runtime.turns import commands, tasks

    sent = []
    delay = tasks.run_turns_task.delay
    monkeypatch.setattr(tasks.run_turns_task, "delay", lambda ids: sent.append(ids) or delay(ids))
    for _ in range(BURST):
        anthropic_fake.push(Reply(drip(0.05), *[text(w) for w in WORDS]))
    sends = [
        commands.SendRequest(session=session, user=user, text="stream, please")
        for user, session in _users_with_a_session("together", anthropic_fake)
    ]
    env = {**distributed_env, "OPENWORKER_TURNS_PER_PROCESS": "2"}

    with procs.celery_worker(env, concurrency=2):
        turns = commands.turns_send(sends=sends)
        deadline = time.monotonic() + 90
        while Turn.objects.exclude(status__in=["completed", "failed", "interrupted"]).exists():
            assert time.monotonic() < deadline, list(Turn.objects.values_list("status", flat=True))
            time.sleep(0.2)

    # One message for the five; each turn ran once, within the worker's two places.
    assert sent == [[str(turn.pk) for turn in turns]]
    assert set(Turn.objects.values_list("status", flat=True)) == {"completed"}
    assert set(Turn.objects.values_list("attempts", flat=True)) == {1}
    assert len(anthropic_fake.requests) == BURST
    replies = Message.objects.filter(role="assistant").values_list("content", flat=True)
    assert list(replies) == ["".join(WORDS)] * BURST
