"""Benchmark: the CPU and the statements of a send and of a turn's start, call by call.

A burst of sends waits on two single threads. Daphne runs every send
(`commands.turn_send`) on its one sync thread, one after another. The worker runs every
turn's database calls on its one database thread, oldest turn first: the claim, the
tools, the model policy and the router, the path, the compaction state, and at the end
the model call's commit and the title. `bench/stream_path.py` shows the first token of a
burst waiting on those threads. This bench shows what each call costs, measured on its
own rather than through the whole pipeline: CPU per call depends less on how busy the
machine is than the pipeline's latencies do, though its speed still moves them (compare
trees run back to back).

It runs the calls in this process, as those threads run them, for K users with one
session each:
- against PostgreSQL by default (`openworker_bench_start`, dropped and recreated; Redis
  db 14 for the send's Celery publish and channel-layer event, as in distributed mode);
- with `--mode embedded`, against SQLite as `make run` (a temporary state folder).

A send keeps its database connection between calls, as Daphne's socket database thread
does (`runtime.turns.socket_db`); half the users send alone, half in the batches a burst
of sends gathers into (`send_batch.MAX_BATCH` sends per call: the row is per send); the
claims go a burst at a time, as the worker's
`Claimer` sends them (`claims.MAX_BATCH` turns per call: the row is per turn). Per call it
prints the CPU of the calling thread
(`time.thread_time`, p50 and p95, µs), the wall time (p50, µs) and the SQL statements
(Django's query capture, BEGIN and COMMIT included on PostgreSQL), then the totals per
send and per turn. No target: docs/PERFORMANCE.md says what was cut. A few seconds.

    .venv/bin/python bench/turn_start.py            # --k 200, --mode embedded
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import percentile, print_table

DATABASE_URL = "postgres://postgres@127.0.0.1:5432/openworker_bench_start"
REDIS_URL = "redis://127.0.0.1:6379/14"
# Never called: the provider profiles only need an address.
UPSTREAM = "http://127.0.0.1:9"
# A typical reply's commit: its text, usage, and the turn's end.
REPLY = "A reply of a few sentences, as a model writes one. " * 10


@dataclass
class Measured:
    cpu_us: list[float] = field(default_factory=list)
    wall_us: list[float] = field(default_factory=list)
    statements: list[float] = field(default_factory=list)


def measure(fn: Callable[[Any], Any], items: list[Any]) -> tuple[Measured, list[Any]]:
    """`fn(item)` for each item, each timed on this thread and its statements counted."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    measured, results = Measured(), []
    for item in items:
        with CaptureQueriesContext(connection) as queries:
            cpu, wall = time.thread_time(), time.perf_counter()
            results.append(fn(item))
            measured.cpu_us.append((time.thread_time() - cpu) * 1e6)
            measured.wall_us.append((time.perf_counter() - wall) * 1e6)
        measured.statements.append(len(queries.captured_queries))
    return measured, results


def per_item(measured: Measured, batches: list[list[Any]]) -> Measured:
    """A call per batch as its cost per item."""
    out = Measured()
    for index, batch in enumerate(batches):
        out.cpu_us.append(measured.cpu_us[index] / len(batch))
        out.wall_us.append(measured.wall_us[index] / len(batch))
        out.statements.append(measured.statements[index] / len(batch))
    return out


def prepare(mode: str) -> None:
    from bench import stream_path

    if mode == "embedded":
        stream_path.prepare_embedded(Path(tempfile.mkdtemp(prefix="ow-bench-start-")))
        # A loop that never runs: a send schedules its turn there, and it stays queued.
        import asyncio

        from openworker.runtime.turns.runner import embedded_runner

        embedded_runner.bind(asyncio.new_event_loop())
    else:
        stream_path.prepare_environment(DATABASE_URL, REDIS_URL)
        stream_path.flush_redis(REDIS_URL)


def run(k: int, batch: int | None = None) -> list[tuple[str, Measured]]:
    """`batch`: the size of every batch (sends, claims, starts, ends) instead of each
    module's largest: a paced burst's batches are a few turns each."""

    from bench.stream_path import MODEL, make_sessions
    from openworker.runtime.agent import starts
    from openworker.runtime.agent.history import outbound_messages
    from openworker.runtime.agent.llm import router_for_user
    from openworker.runtime.store import step_commits, turn_state
    from openworker.runtime.store.claims import MAX_BATCH
    from openworker.runtime.turns import commands
    from openworker.runtime.turns.send_batch import MAX_BATCH as SEND_BATCH
    from sessions import selectors, services
    from sessions.models import Session

    SEND_BATCH = batch or SEND_BATCH  # the constant, or --batch
    MAX_BATCH = batch or MAX_BATCH
    START_BATCH = batch or starts.MAX_BATCH
    END_BATCH = batch or step_commits.MAX_BATCH
    ids = [session_id for session_id, _ in make_sessions(k, UPSTREAM)]
    sessions = list(Session.objects.select_related("owner").filter(pk__in=ids))

    def send(session: Session) -> Any:
        return commands.turn_send(session=session, user=session.owner, text="Hello there.")

    def claim(batch: list[Any]) -> list[Any]:
        claimed = turn_state.turns_claim(turn_ids=[turn.pk for turn in batch], worker="bench")
        return [claimed[str(turn.pk)] for turn in batch]

    def start(batch: list[Any]) -> list[Any]:
        asks = [starts.StartAsk(turn=turn, read_tools=True, check_own_key=True) for turn in batch]
        started = starts.turns_start(asks)
        for item in started:
            if isinstance(item, Exception):
                raise item
        return started

    router = router_for_user(sessions[0].owner_id)
    caps = router.capabilities(MODEL)

    def outbound(turn: Any) -> Any:
        history = [row.to_canonical() for row in paths[turn.pk]]
        return outbound_messages(
            history, owner_id=turn.session.owner_id, caps=caps, compaction_state=None
        )

    def step(turn: Any) -> step_commits.StepAsk:
        # As the engine asks it: the step's parent is its path's tip, read for the call.
        return step_commits.StepAsk(
            turn_id=turn.pk,
            worker="bench",
            session_id=turn.session_id,
            message={
                "content": REPLY,
                "model": turn.model,
                "finish_reason": "end_turn",
                "usage": {"input": 40, "output": 120},
            },
            dedupe_key=f"{turn.pk}:a0",
            totals=turn_state.StepTotals(usage={"input": 40, "output": 120}, steps=1, cost=None),
            context_tokens=160,
            finish="completed",
            parent_seq=tips[turn.pk],
        )

    def commit(turn: Any) -> Any:
        return step(turn).alone()

    def commits(batch: list[Any]) -> list[Any]:
        saved = step_commits.turn_step_commits([step(turn) for turn in batch])
        for item in saved:
            if isinstance(item, Exception):
                raise item
        return saved

    def title(turn: Any) -> Any:
        return services.session_title_save(session_id=turn.session_id, title="A short title")

    def titles(batch: list[Any]) -> list[str]:
        return services.session_titles_save([(turn.session_id, "A short title") for turn in batch])

    def send_batch(batch: list[Session]) -> list[Any]:
        requests = [
            commands.SendRequest(session=session, user=session.owner, text="Hello there.")
            for session in batch
        ]
        return commands.turns_send(sends=requests)

    rows: list[tuple[str, Measured]] = []
    # Half the users send alone, half in the batches a burst gathers into (send_batch).
    alone, together = sessions[: k // 2], sessions[k // 2 :]
    measured, turns = measure(send, alone)
    rows.append(("send alone (Daphne)", measured))
    send_batches = [together[i : i + SEND_BATCH] for i in range(0, len(together), SEND_BATCH)]
    measured, sent_batches = measure(send_batch, send_batches)
    rows.append((f"send ({SEND_BATCH} at once, per send)", per_item(measured, send_batches)))
    turns += [turn for batch in sent_batches for turn in batch]
    batches = [turns[i : i + MAX_BATCH] for i in range(0, len(turns), MAX_BATCH)]
    measured, claimed_batches = measure(claim, batches)
    rows.append((f"claim ({MAX_BATCH} at once, per turn)", per_item(measured, batches)))
    claimed = [turn for batch in claimed_batches for turn in batch]
    # A turn's start alone (one turn per call, as a lone send's), and a burst's: the tools,
    # the model policy, the router over the owner's profiles, the path and the compaction
    # state (`starts.turns_start`).
    half = len(claimed) // 2
    measured, _ = measure(lambda turn: start([turn]), claimed[:half])
    rows.append(("start alone", measured))
    start_batches = [claimed[i : i + START_BATCH] for i in range(half, len(claimed), START_BATCH)]
    measured, started = measure(start, start_batches)
    rows.append((f"start ({START_BATCH} at once, per turn)", per_item(measured, start_batches)))
    together = [item for batch in started for item in batch]
    paths = {turn.pk: item.path for turn, item in zip(claimed[half:], together, strict=True)}
    rows.append(("outbound view", measure(outbound, claimed[half:])[0]))
    tips = {turn.pk: selectors.turn_path(turn=turn)[-1].seq for turn in claimed}
    # A turn's end alone, and a wave's (`step_commits`, `session_titles_save`).
    rows.append(("model call's commit alone", measure(commit, claimed[:half])[0]))
    end_batches = [claimed[i : i + END_BATCH] for i in range(half, len(claimed), END_BATCH)]
    measured, _ = measure(commits, end_batches)
    per_turn = f"{END_BATCH} at once, per turn"
    rows.append((f"model calls' commits ({per_turn})", per_item(measured, end_batches)))
    rows.append(("title alone", measure(title, claimed[:half])[0]))
    measured, _ = measure(titles, end_batches)
    rows.append((f"titles ({per_turn})", per_item(measured, end_batches)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=200, help="users, each sending once")
    parser.add_argument("--mode", choices=("distributed", "embedded"), default="distributed")
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        help="every batch this size (a paced burst's are a few turns; default: each "
        "module's largest, 100)",
    )
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "openworker.settings")
    prepare(args.mode)
    from django.db import connection

    rows = run(args.k, args.batch)
    print(
        f"turn start: {args.k} sends and turn starts, {args.mode} ({connection.vendor}), "
        f"load average before the run: {', '.join(f'{x:.2f}' for x in os.getloadavg())}\n"
    )
    table = [
        (name, round(statistics.median(m.cpu_us)), round(percentile(m.cpu_us, 95)),
         round(statistics.median(m.wall_us)), round(statistics.median(m.statements), 2))
        for name, m in rows
    ]  # fmt: skip
    # Totals of the medians (a p95 does not add up): a burst's turn start is its claim,
    # its share of the start call and its outbound view.
    for label, part in (
        ("per turn start (worker, a burst)", [table[2], table[4], table[5]]),
        ("per turn end (worker, alone)", [table[6], table[8]]),
        ("per turn end (worker, a wave)", [table[7], table[9]]),
    ):
        table.append(
            (label, sum(r[1] for r in part), "-", sum(r[3] for r in part), sum(r[4] for r in part))
        )
    print_table(("call", "CPU p50 µs", "CPU p95 µs", "wall p50 µs", "statements"), table)


if __name__ == "__main__":
    main()
