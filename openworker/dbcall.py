"""How the async runtime (engine, compactor, sweeper) calls the synchronous ORM."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, close_old_connections

# Distributed mode: database calls of every turn in a worker share this many threads, so
# a worker holds at most this many PostgreSQL connections however many turns it runs
# (one connection per turn exhausted the server at ~100 concurrent turns). Few: each
# call is short, and every extra runnable thread competes with the event loop for the
# GIL (16 threads stalled the streams when 200 turns ended at once; bench/stream_path.py).
# Embedded mode keeps Django's single sync thread: SQLite wants one writer.
DB_THREADS = 4
_DB_POOL = ThreadPoolExecutor(max_workers=DB_THREADS, thread_name_prefix="turn-db")


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


def db(fn: Callable[..., Any]) -> Callable[..., Any]:
    if settings.DISTRIBUTED:
        return sync_to_async(_pooled(fn), thread_sensitive=False, executor=_DB_POOL)
    return sync_to_async(fn, thread_sensitive=True)
