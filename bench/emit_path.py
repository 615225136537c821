"""Benchmark: the worker's CPU per streamed frame from the turn's emitter to Redis.

Run from the repository root (Redis on 127.0.0.1:6379): `.venv/bin/python
bench/emit_path.py`. It uses Redis db 13 (flushed: the bench's own) and no database.

TURNS turns on one event loop (uvloop's, as the worker's) each send DELTAS deltas, one
frame each: `TurnEmitter.delta` then `flush_now`, as a delta past its coalescing window
goes out, with a yield to the loop between (a turn waits for its next token). Each frame
is what a streaming worker does per token on this path: numbered and kept, its replay
buffer append (XADD, and EXPIRE every so often) and its channel-layer publish (PUBLISH)
queued on the loop's batchers, written in one pipeline per round trip, replies parsed and
outcomes settled. Reports this process's CPU per frame (`time.process_time`; the Redis
server's CPU is not counted), best and median of RUNS. The upstream read, the turn's
database calls and Daphne are not here (`bench/stream_path.py` measures the whole path).

No target: a figure to compare trees by (docs/PERFORMANCE.md). About twenty seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import distributed_without_database

REDIS_URL = "redis://127.0.0.1:6379/13"
TURNS = 200
DELTAS = 200
RUNS = 5
WARM_UP_TURNS = 10


async def _turn(buffer: Any, turn_id: str, deltas: int) -> None:
    from openworker.runtime.live.emitter import TurnEmitter

    emitter = TurnEmitter(
        session_id=f"bench-{turn_id}", turn_id=turn_id, buffer=buffer, coalesce_seconds=0
    )
    for _ in range(deltas):
        emitter.delta(text="token ")
        emitter.flush_now()
        await asyncio.sleep(0)
    await emitter.close()


async def _run(turns: int, deltas: int) -> float:
    """CPU µs per frame of one run, after a warm-up (connections made, code warm)."""
    from openworker.runtime.live.replay import get_replay_buffer

    buffer = get_replay_buffer()
    warm = uuid.uuid4().hex
    await asyncio.gather(*(_turn(buffer, f"{warm}-{n}", deltas) for n in range(WARM_UP_TURNS)))
    run = uuid.uuid4().hex
    started = time.process_time()
    await asyncio.gather(*(_turn(buffer, f"{run}-{n}", deltas) for n in range(turns)))
    return (time.process_time() - started) * 1e6 / (turns * deltas)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=REDIS_URL)
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument("--deltas", type=int, default=DELTAS)
    parser.add_argument("--runs", type=int, default=RUNS)
    args = parser.parse_args()
    distributed_without_database(args.redis_url)
    import redis

    from openworker.event_loop import new_event_loop

    redis.Redis.from_url(args.redis_url).flushdb()
    figures = []
    try:
        for _ in range(args.runs):
            loop = new_event_loop()
            try:
                figures.append(loop.run_until_complete(_run(args.turns, args.deltas)))
            finally:
                loop.close()
    finally:
        redis.Redis.from_url(args.redis_url).flushdb()
    print(
        f"emit path: {args.turns} turns x {args.deltas} frames on one loop, {args.runs} runs: "
        f"CPU per frame best {min(figures):.1f} µs, median {statistics.median(figures):.1f} µs "
        f"({', '.join(f'{f:.1f}' for f in figures)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
