"""Where the embedded process's database calls run: Django's one sync thread, for the
turns and the sockets (`runtime.turns.socket_db`), its SQLite connection kept open
between calls. Distributed mode does not use it: the worker's pools are in
`runtime.store.dbcall`, and Daphne's socket calls go through Channels'
`database_sync_to_async`.

The turns' calls and the sends share that thread first in first out. Tried and measured
(bench/stream_path.py --mode embedded, K = 200): the same calls on a thread of our own
with the turns' calls ahead of new sends started each turn as soon as its send was in,
but the sends then ran beside the streams and both took the GIL from each other: Daphne
used 18-22 CPU s instead of 13-14, and the last first token came 16-20 s after the sends
instead of 6.5 s."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DEFAULT_DB_ALIAS, connections


def _keep_open(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, leaving the SQLite connection it used open for the next call on this thread.

    With CONN_MAX_AGE 0 (settings.DATABASES: the web requests' threads must not keep
    theirs) every Channels call closed its thread's connection before and after, and the
    next call opened a new one (the WAL pragmas, the SQL functions registered again): 9 %
    of Daphne's CPU at K = 200 (bench/stream_path.py --mode embedded). One long-lived
    thread's one connection to a local file is what SQLite wants; Django's
    `close_old_connections` still closes it if an error left it unusable."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            connection = connections[DEFAULT_DB_ALIAS]
            if connection.connection is not None:
                connection.close_at = None

    return call


def embedded_db(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """`fn` as a coroutine function on Django's sync thread, its connection kept."""
    return sync_to_async(_keep_open(fn), thread_sensitive=True)
