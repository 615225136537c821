"""Redis drills with real processes: the test's own redis-server (never the machine's),
its own Daphne and Celery worker, the real websocket.

1. Redis killed (SIGKILL, by PID) mid-stream and started again empty: the page shows
   the whole reply, in order, with no hole and no repeat; the worker survives (kombu's
   restore of the unacknowledged turn task used to kill it) and runs the next turn.
2. Redis restarted empty while a turn waits in the queue (no worker yet): the turn is
   handed over again from the database and completes once a worker is up.

`DRILL_ROUNDS` (default 1) repeats each drill; `bench/crash_drill.py` runs ten and
prints the figures for docs/SECURITY.md.

Its own module, so that no other worker process consumes the turns queue.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from typing import Any

import pytest

from sessions.models import Message, Session, Turn
from tests.fakes import Reply, drip, text
from tests.security.figures import record
from tests.security.test_crash_drill import RedisServer, worker_on
from tests.support import procs
from tests.support.chat import TERMINAL, open_ws, point_provider_at, read_sync_until_status

MODEL = "anthropic:claude-test-1"
ROUNDS = int(os.environ.get("DRILL_ROUNDS", "1"))
# Rounds take ~10-25 s each on a loaded two-core machine (worker start-ups, the sweeper).
pytestmark = [
    pytest.mark.distributed,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120 + 90 * ROUNDS),
]
WORDS = [f"t{i} " for i in range(120)]
DRIP_SECONDS = 0.04  # ~5 s of stream: Redis is always killed mid-way
REDIS_DOWN_SECONDS = 1.0
# The bound for "the next turn runs" and "a stranded turn runs again".
NEXT_TURN_SECONDS = 30.0


def long_reply(_last_user_text: str) -> Reply:
    return Reply(drip(DRIP_SECONDS), *[text(w) for w in WORDS])


def read_timed_until_status(ws: Any, arrivals: list[float], timeout: float) -> list[dict]:
    """`read_sync_until_status`, noting when each event arrived."""
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        event = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        arrivals.append(time.monotonic())
        events.append(event)
        if event.get("type") == "turn.status" and event.get("status") in TERMINAL:
            return events


def page_text(events: list[dict[str, Any]], turn_id: str) -> tuple[str, list[int]]:
    deltas = [e for e in events if e.get("turn") == turn_id and e.get("type") == "delta"]
    seqs = [e["seq"] for e in events if e.get("turn") == turn_id and "seq" in e]
    return "".join(e.get("text", "") for e in deltas), seqs


def test_a_redis_restart_mid_stream_loses_no_token_and_the_worker_runs_the_next_turn(
    distributed_env: dict[str, str], owner: Any, anthropic_fake: Any
) -> None:
    anthropic_fake.script.default = long_reply
    point_provider_at(owner, "anthropic", anthropic_fake.base_url)
    server = RedisServer()
    server.start()
    env = {**distributed_env, "REDIS_URL": f"redis://127.0.0.1:{server.port}/0"}
    next_turn_in: list[float] = []
    pauses: list[float] = []
    tokens = 0
    try:
        with procs.daphne(env) as base, worker_on(env) as worker:
            for round_ in range(ROUNDS):
                session = Session.objects.create(owner=owner, model=MODEL)
                arrivals: list[float] = []
                with open_ws(base, owner, session) as ws:
                    ws.send(json.dumps({"type": "send", "text": f"redis drill {round_}"}))
                    events: list[dict[str, Any]] = []
                    while sum(e.get("type") == "delta" for e in events) < 5:
                        events.append(json.loads(ws.recv(timeout=15)))
                    turn_id = events[-1]["turn"]
                    server.kill()
                    killed = time.monotonic()
                    time.sleep(REDIS_DOWN_SECONDS)
                    server.start()
                    events += read_timed_until_status(ws, arrivals, timeout=60)
                # How long the page showed nothing new: about the outage.
                pauses.append(max(b - a for a, b in itertools.pairwise([killed, *arrivals])))
                shown, seqs = page_text(events, turn_id)
                turn = Turn.objects.get(pk=turn_id)
                assert turn.status == "completed", (turn.status, turn.error)
                assert shown == "".join(WORDS), shown
                assert seqs == list(range(1, len(seqs) + 1)), seqs
                tokens += len(WORDS)

                # The worker survived the restart and takes the next turn.
                started = time.monotonic()
                with open_ws(base, owner, session) as ws:
                    ws.send(json.dumps({"type": "send", "text": f"after {round_}"}))
                    last = read_sync_until_status(ws, timeout=NEXT_TURN_SECONDS)[-1]
                assert last["status"] == "completed", last
                next_turn_in.append(time.monotonic() - started)
                assert worker.popen.poll() is None, worker.output()[-3000:]
            assert "Unrecoverable error" not in worker.output()
    finally:
        server.kill()

    record("redis.restarts_mid_stream", ROUNDS, "Redis SIGKILLed and restarted empty mid-stream")
    record("redis.tokens_checked", tokens, "tokens streamed across a Redis restart: 0 lost")
    record(
        "redis.max_page_pause_tenths",
        math.ceil(max(pauses) * 10),
        "tenths of a second at most that the page showed nothing new around the outage"
        f" (Redis down {REDIS_DOWN_SECONDS} s)",
    )
    record(
        "redis.max_seconds_next_turn",
        math.ceil(max(next_turn_in)),
        "seconds at most for the next turn to complete on the same worker after a restart",
    )


def test_a_turn_queued_when_redis_restarts_is_dispatched_again_and_completes(
    distributed_env: dict[str, str], owner: Any, anthropic_fake: Any
) -> None:
    anthropic_fake.script.default = lambda _text: Reply(text("Answered after the restart."))
    point_provider_at(owner, "anthropic", anthropic_fake.base_url)
    server = RedisServer()
    server.start()
    env = {**distributed_env, "REDIS_URL": f"redis://127.0.0.1:{server.port}/0"}
    completed_in: list[float] = []
    try:
        with procs.daphne(env) as base:
            for round_ in range(ROUNDS):
                session = Session.objects.create(owner=owner, model=MODEL)
                with open_ws(base, owner, session) as ws:
                    # No worker: the task waits in Redis's queue.
                    ws.send(json.dumps({"type": "send", "text": f"queued {round_}"}))
                    assert json.loads(ws.recv(timeout=10))["type"] == "message.user"
                turn = Turn.objects.get(session=session)
                assert turn.status == "queued"
                server.kill()
                server.start()  # empty: the task is gone
                started = time.monotonic()
                with worker_on(env), open_ws(base, owner, session) as ws:
                    events = read_sync_until_status(ws, timeout=NEXT_TURN_SECONDS)
                    completed_in.append(time.monotonic() - started)
                assert events[-1]["status"] == "completed", events[-1]
                turn.refresh_from_db()
                assert turn.status == "completed"
                roles = list(
                    Message.objects.filter(turn=turn).order_by("seq").values_list("role", flat=True)
                )
                assert roles == ["user", "assistant"]
    finally:
        server.kill()

    record("redis.restarts_while_queued", ROUNDS, "Redis restarted empty while a turn was queued")
    record(
        "redis.max_seconds_stranded_to_completed",
        math.ceil(max(completed_in)),
        "seconds at most from the worker's start to the stranded turn completed (0 stuck)",
    )
