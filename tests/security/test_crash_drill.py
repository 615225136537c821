"""Worker crash drill with real processes (Daphne, Celery, Redis, PostgreSQL).

1. Ten times: a fresh Celery worker runs three concurrent turns, each a tool step (an
   assistant message with a tool call and the tool's result, committed) and then a long
   streamed reply; mid-stream the worker is killed with SIGKILL. Every turn must be
   `interrupted` within 30 s (Daphne's lease sweeper) with its partial text; the next
   worker retries them to `completed` within 30 s. Across all rounds: zero lost
   committed messages (every row seen before a kill is there afterwards, unchanged) and
   zero duplicated assistant messages (each turn: exactly one user, two assistant and
   one tool message, the tool step not replayed).
2. Redis restarted mid-turn: a private redis-server on a free port with its own Daphne
   and worker; while a turn streams, Redis is killed and started again (empty, as after
   a crash without persistence). The turn ends cleanly and the transcript is intact.

Its own module, so that no other worker process consumes the turns queue.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from openworker.runtime.turns import commands
from sessions.models import Message, Session, Turn
from tests.fakes import Reply, drip, text, tool_call
from tests.security.figures import record
from tests.support import procs
from tests.support.chat import open_ws, point_provider_at, read_sync_until_status

# Ten rounds of worker start-ups and lease expiries: minutes on a loaded machine, past
# the suite's default timeout.
pytestmark = [
    pytest.mark.distributed,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(900),
]

MODEL = "anthropic:claude-test-1"
ROUNDS = 10
TURNS_PER_ROUND = 3
# The bound: a turn whose worker died is terminal (interrupted) within this.
TERMINAL_SECONDS = 30.0
DRIP_SECONDS = 0.05
DRIP_WORDS = [f"w{i} " for i in range(300)]  # ~15 s of stream: always killed mid-way
FINAL = "Complete answer."
TOOL_STEP = "Let me look first. "


class Upstream:
    """Scripts replies by phase: a tool call for a new message, then a long drip while
    the drill wants a worker to die mid-stream, or the short final answer on retry."""

    def __init__(self) -> None:
        self.dying = True

    def reply(self, last_user_text: str) -> Reply:
        if last_user_text.startswith("drill "):
            return Reply(text(TOOL_STEP), tool_call("list_files", {}))
        if self.dying:
            return Reply(drip(DRIP_SECONDS), *[text(w) for w in DRIP_WORDS])
        return Reply(text(FINAL))


def committed(sessions: list[Session]) -> dict[int, tuple[Any, ...]]:
    rows = Message.objects.filter(session__in=sessions)
    return {m.pk: (m.session_id, m.seq, m.role, m.content, m.tool_call_id) for m in rows}


def wait_all(turn_ids: list[Any], statuses: set[str], timeout: float) -> float:
    """Seconds until every turn is in `statuses`; fails after `timeout`."""
    started = time.monotonic()
    while True:
        found = dict(Turn.objects.filter(pk__in=turn_ids).values_list("pk", "status"))
        if all(found[t] in statuses for t in turn_ids):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise AssertionError(f"turns not {statuses} after {timeout}s: {found}")
        time.sleep(0.1)


def wait_streaming(turn_ids: list[Any], timeout: float = 30.0) -> None:
    """Until every turn's heartbeat has carried some of the long reply."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        partials = Turn.objects.filter(pk__in=turn_ids).values_list("partial_text", flat=True)
        if all(p.startswith("w0 w1 ") for p in partials):
            return
        time.sleep(0.1)
    raise AssertionError("the turns did not start streaming")


# Ten rounds of kill, sweep, restart and retry: about 12 s a round on a quiet machine.
@pytest.mark.timeout(360)
def test_ten_worker_kills_lose_nothing_duplicate_nothing_and_end_every_turn(
    daphne_server: str, distributed_env: dict[str, str], owner: Any, anthropic_fake: Any
) -> None:
    upstream = Upstream()
    anthropic_fake.script.default = upstream.reply
    point_provider_at(owner, "anthropic", anthropic_fake.base_url)
    sessions = [Session.objects.create(owner=owner, model=MODEL) for _ in range(TURNS_PER_ROUND)]
    all_turns: list[Any] = []
    interrupted_in: list[float] = []
    completed_in: list[float] = []
    before_kill: dict[int, tuple[Any, ...]] = {}
    stack = contextlib.ExitStack()
    worker = stack.enter_context(procs.celery_worker(distributed_env))
    try:
        for round_ in range(ROUNDS):
            upstream.dying = True
            turns = [
                commands.turn_send(session=s, user=owner, text=f"drill {round_} {i}").pk
                for i, s in enumerate(sessions)
            ]
            all_turns += turns
            wait_streaming(turns)
            before_kill = committed(sessions)
            worker.kill()
            interrupted_in.append(wait_all(turns, {"interrupted"}, TERMINAL_SECONDS))
            partials = Turn.objects.filter(pk__in=turns).values_list("partial_text", flat=True)
            assert all(p.startswith("w0 w1 ") for p in partials)
            # Nothing committed before the kill is lost or changed.
            after = committed(sessions)
            assert {k: after.get(k) for k in before_kill} == before_kill

            stack.close()  # the dead worker's log file
            stack = contextlib.ExitStack()
            worker = stack.enter_context(procs.celery_worker(distributed_env))
            upstream.dying = False
            for turn_id in turns:
                commands.turn_retry(turn=Turn.objects.get(pk=turn_id))
            completed_in.append(wait_all(turns, {"completed"}, TERMINAL_SECONDS))
    finally:
        stack.close()

    after = committed(sessions)
    assert {k: after.get(k) for k in before_kill} == before_kill
    for turn_id in all_turns:
        roles = list(
            Message.objects.filter(turn_id=turn_id).order_by("seq").values_list("role", flat=True)
        )
        assert roles == ["user", "assistant", "tool", "assistant"], (turn_id, roles)
        final = Message.objects.filter(turn_id=turn_id, role="assistant").order_by("seq").last()
        assert final is not None and final.content == FINAL
    for session in sessions:
        seqs = list(
            Message.objects.filter(session=session).order_by("seq").values_list("seq", flat=True)
        )
        assert seqs == list(range(1, len(seqs) + 1))
    assert max(interrupted_in) <= TERMINAL_SECONDS and max(completed_in) <= TERMINAL_SECONDS

    record("crash.kills", ROUNDS, "kill -9 of a Celery worker during streaming turns")
    record(
        "crash.turns",
        len(all_turns),
        "turns killed mid-stream, all interrupted then retried to completed: zero lost "
        "committed messages, zero duplicated assistant messages",
    )
    record(
        "crash.max_seconds_to_interrupted",
        math.ceil(max(interrupted_in)),
        "seconds at most from the kill to every turn of the round being interrupted",
    )
    record(
        "crash.max_seconds_retry_to_completed",
        math.ceil(max(completed_in)),
        "seconds at most from retry (fresh worker) to completed",
    )


# --- Redis restarted mid-turn ------------------------------------------------------------


@contextlib.contextmanager
def private_redis(port: int) -> Iterator[subprocess.Popen[bytes]]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, socket_connect_timeout=1)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.RedisError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.05)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


@contextlib.contextmanager
def worker_on(env: dict[str, str]) -> Iterator[procs.Proc]:
    """A Celery worker on another broker than the test process's: `procs.celery_worker`
    pings through this process's app (the main Redis), so readiness is read from its log."""
    hostname = f"drill-{procs.free_port()}@localhost"
    proc = procs.Proc(
        "celery",
        [
            str(procs.BIN / "celery"), "-A", "openworker", "worker",
            "--pool", "threads", "--concurrency", "4",
            "--queues", "turns,default", "--hostname", hostname,
            "--without-gossip", "--without-mingle", "--loglevel", "INFO",
        ],
        procs.process_env(env),
    )  # fmt: skip
    deadline = time.monotonic() + procs.START_TIMEOUT_SECONDS
    while f"{hostname} ready." not in proc.output():
        if proc.popen.poll() is not None:
            proc.fail("exited during start-up")
        if time.monotonic() > deadline:
            proc.fail("did not become ready")
        time.sleep(0.2)
    try:
        yield proc
    finally:
        proc.stop()


class RedisServer:
    """A redis-server on a fixed free port that the drill can kill and start again."""

    def __init__(self) -> None:
        self.port = procs.free_port()
        self._cm: contextlib.AbstractContextManager[Any] | None = None

    def start(self) -> None:
        self._cm = private_redis(self.port)
        self._cm.__enter__()

    def kill(self) -> None:
        if self._cm is not None:
            self._cm.__exit__(None, None, None)
            self._cm = None


def test_a_redis_restart_mid_turn_ends_the_turn_cleanly_with_the_transcript_intact(
    distributed_env: dict[str, str], owner: Any, anthropic_fake: Any
) -> None:
    anthropic_fake.push(
        Reply(text(TOOL_STEP), tool_call("list_files", {})),
        Reply(drip(0.05), *[text(w) for w in DRIP_WORDS[:100]]),
    )
    point_provider_at(owner, "anthropic", anthropic_fake.base_url)
    session = Session.objects.create(owner=owner, model=MODEL)
    server = RedisServer()
    server.start()
    env = {**distributed_env, "REDIS_URL": f"redis://127.0.0.1:{server.port}/0"}
    try:
        with procs.daphne(env) as base, worker_on(env):
            with open_ws(base, owner, session) as ws:
                ws.send(json.dumps({"type": "send", "text": "drill redis"}))
                seen = 0
                while seen < 5:
                    event = json.loads(ws.recv(timeout=15))
                    seen += event.get("type") == "delta"
            turn_id = event["turn"]
            server.kill()
            time.sleep(1.0)  # the stream goes on while Redis is down
            server.start()
            started = time.monotonic()
            turn = Turn.objects.get(pk=turn_id)
            while turn.status in Turn.ACTIVE and time.monotonic() - started < TERMINAL_SECONDS:
                time.sleep(0.2)
                turn.refresh_from_db()
            # A page opened after the restart still gets the turn's end.
            with open_ws(base, owner, session) as ws:
                if turn.status in Turn.ACTIVE:
                    read_sync_until_status(ws, timeout=5)
    finally:
        server.kill()

    turn.refresh_from_db()
    # The stream never needed Redis (PostgreSQL holds the turn and its messages; the
    # emitter drops socket frames it cannot deliver): the turn completes.
    assert turn.status == "completed", (turn.status, turn.error)
    roles = list(
        Message.objects.filter(session=session).order_by("seq").values_list("role", flat=True)
    )
    assert roles == ["user", "assistant", "tool", "assistant"]
    final = Message.objects.filter(session=session, role="assistant").order_by("seq").last()
    assert final is not None and final.content == "".join(DRIP_WORDS[:100])
    record(
        "crash.redis_restarts",
        1,
        "Redis killed and restarted mid-turn: the turn completed, transcript intact",
    )
