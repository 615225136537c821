"""How long a serving process's thread may hold the GIL while another waits for it.

A worker process streams every turn from one event-loop thread (`WorkerLoop`) and does
its database work on threads beside it (`runtime/store/priority_pool.py`, the leases'
keeper); Daphne serves its sockets from one loop, with `sync_to_async` threads beside it.
The loop thread gives the GIL up each time it waits on its sockets, and when it wakes
while a database thread runs Python (Django compiling a statement, psycopg building
rows), it waits for that thread to hand the GIL back: after CPython's switch interval,
5 ms, at every such wake-up. At K = 1000, while a wave's turns end and the next start
(hundreds of commits and claims a second on those threads), that wait was added to the
loop's lateness, and to every token it was about to read.

One millisecond keeps the loop's wait short; the threads beside it do the same work in
more, shorter slices. `bench/stream_path.py --ks 1000` (500 places, 200 starts a
second), six paired runs: p99 added latency median 228 against 272 ms, lower in four,
the worst run 253 against 331 ms (docs/PERFORMANCE.md, session 22).
`OPENWORKER_SWITCH_INTERVAL_SECONDS` sets another interval; 0 keeps CPython's.
"""

from __future__ import annotations

import sys

from openworker.env import envfloat

SWITCH_INTERVAL_SECONDS = 0.001


def configured_interval() -> float | None:
    """The interval the serving processes use; None: CPython's own (the setting is 0)."""
    seconds = envfloat("OPENWORKER_SWITCH_INTERVAL_SECONDS", SWITCH_INTERVAL_SECONDS)
    return seconds if seconds > 0 else None


def tune_for_serving() -> None:
    """Set this process's switch interval to the configured one (safe to call again)."""
    seconds = configured_interval()
    if seconds is not None:
        sys.setswitchinterval(seconds)
