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
# Embedded mode (SQLite, turns in Daphne) uses the same two pools, one thread each: every
# turn write goes through one connection, oldest turn first. On Django's one sync thread,
# which the websocket consumers share, 200 turns sent at once queued the heartbeats
# behind every send and turn start (first token p50 20 s), and the sweeper interrupted 8
# live turns, whose stored reply then lacked what they had streamed
# (bench/stream_path.py --mode embedded).
# The other writers (web requests, the consumers' sends) take SQLite's write lock in turn:
# WAL, IMMEDIATE transactions and a busy timeout (settings.DATABASES) make them wait
# rather than fail.
_POOLS: dict[str, PriorityThreadPool] = {}
_POOLS_LOCK = threading.Lock()


def _db_pool(name: str) -> PriorityThreadPool:
    with _POOLS_LOCK:
        pool = _POOLS.get(name)
        if pool is None:
            # SQLite has one writer at a time: more threads would only wait for its lock.
            many = name == "turn-db" and settings.DISTRIBUTED
            threads = settings.WORKER_DB_THREADS if many else 1
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


def db(fn: Callable[..., Any], *, pool: str = "turn-db") -> Callable[..., Any]:
    """`fn` as a coroutine function run on the process's database threads (`pool`:
    "turn-db", or "lease-db" for heartbeats)."""
    return sync_to_async(_pooled(fn), thread_sensitive=False, executor=_db_pool(pool))
