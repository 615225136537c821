"""How the websocket consumers call the database from their event loop."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

from openworker.runtime.store.dbcall import db
from openworker.runtime.store.sync_thread import embedded_db


def socket_db(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """`fn` as a coroutine function for the websocket consumers: Channels'
    `database_sync_to_async` in distributed mode (the pooled connection goes back after
    each call); embedded, on the sync thread the turns use, its SQLite connection kept
    (`runtime.store.sync_thread`)."""
    if settings.DISTRIBUTED:
        return db(fn, pool="socket-db")
    return embedded_db(fn)
