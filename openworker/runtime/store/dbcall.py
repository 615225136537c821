"""How the async runtime (engine, compactor, sweeper) calls the synchronous ORM."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, close_old_connections

from openworker.runtime.store.priority_pool import PriorityThreadPool
from openworker.runtime.store.sync_thread import embedded_db

# Distributed mode: database calls of every turn in a worker share a small thread pool
# (settings.WORKER_DB_THREADS), so a worker holds at most that many PostgreSQL
# connections however many turns it runs (one connection per turn exhausted the server
# at ~100 concurrent turns). One by default: ORM calls are mostly Python, so a second
# busy thread mostly competes for the GIL, and the event loop, which gives the GIL up at
# every socket call, waits up to a switch interval (5 ms) to take it back each time (the
# "convoy": at 200 streaming turns p99 doubled with four threads; bench/stream_path.py).
# A database across a slow network, where calls mostly wait, may want more. Calls run
# oldest turn first (openworker/priority_pool.py), so a burst of new turns starts
# streaming one after another instead of all at once.
# Lease heartbeats get a thread of their own: queued behind a burst of turn starts on the
# shared pool, a late beat would let the sweeper take live turns for dead ones.
# Embedded mode (SQLite, turns in Daphne) runs turn calls on Django's one sync thread,
# which the websocket consumers share: every turn write goes through one connection. Its
# heartbeats get their own thread too: behind 200 sends and turn starts on the sync
# thread they came so late that the sweeper interrupted 8 of 200 live turns, whose stored
# reply then lacked what they had streamed. Turn calls on a pool thread of their own,
# oldest first, cost Daphne 40% more CPU at K = 200 (11.9-12.9 s against 8.4-11.1 s)
# and spread the starts so the last first token came 27-34 s after the send instead of
# 4-20 s (bench/stream_path.py --mode embedded, docs/PERFORMANCE.md). The writers that
# remain (the sync thread, heartbeats, web requests) take SQLite's write lock in turn:
# WAL, IMMEDIATE transactions and a busy timeout (settings.DATABASES) make them wait
# rather than fail.
_POOLS: dict[str, PriorityThreadPool] = {}
_POOLS_LOCK = threading.Lock()


def _db_pool(name: str) -> PriorityThreadPool:
    with _POOLS_LOCK:
        pool = _POOLS.get(name)
        if pool is None:
            threads = {
                "turn-db": settings.WORKER_DB_THREADS,
                "socket-db": settings.SOCKET_DB_THREADS,
            }.get(name, 1)
            pool = _POOLS[name] = PriorityThreadPool(threads, thread_name_prefix=name)
        return pool


# How often a pooled thread re-checks its connection (CONN_MAX_AGE, and with health
# checks on, a `SELECT 1`). Checking before every call doubled the queries of a busy
# worker; a connection that failed is checked again before the next call.
RECHECK_SECONDS = 5.0
_checked = threading.local()


def _pooled(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        now = time.monotonic()
        if now >= getattr(_checked, "next", 0.0):
            close_old_connections()
            _checked.next = now + RECHECK_SECONDS
        try:
            return fn(*args, **kwargs)
        except DatabaseError:
            _checked.next = 0.0
            raise

    return call


def db_blocking(fn: Callable[..., Any], /, *, pool: str, **kwargs: Any) -> Any:
    """`fn(**kwargs)` run on `pool`'s database thread, waited for from a plain thread (the
    lease keeper's ticker), with the same connection handling as `db`."""
    call = _pooled(fn) if settings.DISTRIBUTED else fn
    return _db_pool(pool).submit(call, **kwargs).result()


def db(fn: Callable[..., Any], *, pool: str = "turn-db") -> Callable[..., Any]:
    """`fn` as a coroutine function run on the worker's database threads (`pool`:
    "turn-db", or "lease-db" for heartbeats); embedded, turn calls run on Django's sync
    thread and heartbeats on their own."""
    if settings.DISTRIBUTED:
        return sync_to_async(_pooled(fn), thread_sensitive=False, executor=_db_pool(pool))
    if pool == "lease-db":
        # SQLite: the thread's one connection is a local file, nothing to re-check.
        return sync_to_async(fn, thread_sensitive=False, executor=_db_pool(pool))
    return embedded_db(fn)
