"""Embedded mode's database calls (openworker/runtime/store/sync_thread.py): the turns'
and the sockets' calls share Django's sync thread, whose SQLite connection stays open
between calls (opening one per call was 9 % of Daphne's CPU at K = 200)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from asgiref.sync import sync_to_async
from channels.db import DatabaseSyncToAsync, database_sync_to_async
from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS, connection, connections

from openworker.runtime.store import dbcall
from openworker.runtime.turns.socket_db import socket_db

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def closes(monkeypatch):  # type: ignore[no-untyped-def]
    """The threads whose database connection was closed, one entry per close (the test
    database lives in memory, where Django's close keeps it: count the calls)."""
    seen: list[str] = []
    wrapper = type(connections[DEFAULT_DB_ALIAS])
    original = wrapper.close

    def close(self):  # type: ignore[no-untyped-def]
        if self.connection is not None:
            seen.append(threading.current_thread().name)
        return original(self)

    monkeypatch.setattr(wrapper, "close", close)
    asyncio.run(sync_to_async(_as_django_opened_it, thread_sensitive=True)())
    yield seen
    asyncio.run(sync_to_async(_as_django_opened_it, thread_sensitive=True)())


def _as_django_opened_it() -> None:
    """The sync thread's connection as CONN_MAX_AGE 0 leaves it (the in-memory test
    database is never really closed, so a kept connection would outlive its test)."""
    if connection.connection is not None:
        connection.close_at = time.monotonic()


def _query() -> str:
    get_user_model().objects.count()
    return threading.current_thread().name


def test_socket_and_turn_calls_keep_the_sync_threads_connection_open(settings, closes):
    settings.DISTRIBUTED = False

    async def scenario() -> list[str]:
        return [
            await socket_db(_query)(),
            await dbcall.db(_query)(),
            # Channels' own calls (the auth middleware's, on the same thread) close the
            # connections they find obsolete, before and after: this one is not.
            await database_sync_to_async(_query)(),
            await socket_db(_query)(),
        ]

    threads = asyncio.run(scenario())
    assert len(set(threads)) == 1  # one thread: Django's sync thread
    assert closes == []


def test_distributed_socket_calls_run_on_the_sockets_own_database_thread(settings, monkeypatch):  # type: ignore[no-untyped-def]
    """Distributed, a socket's calls run on a pool of their own (`socket-db`,
    OPENWORKER_SOCKET_DB_THREADS threads) rather than Django's sync thread, and keep the
    thread's connection between calls (re-checked every few seconds, `dbcall._pooled`):
    Channels' `database_sync_to_async` gave it back to the pool and took and checked one
    again on every call, a round trip more per send."""
    settings.DISTRIBUTED = True
    assert not isinstance(socket_db(_query), DatabaseSyncToAsync)
    checks: list[str] = []
    monkeypatch.setattr(
        dbcall, "close_old_connections", lambda: checks.append(threading.current_thread().name)
    )

    def thread_name() -> str:
        return threading.current_thread().name

    async def scenario() -> list[str]:
        return [await socket_db(thread_name)() for _ in range(5)]

    names = asyncio.run(scenario())
    assert len(set(names)) == 1 and names[0].startswith("socket-db"), names
    # At most the periodic re-check, not one before and after every call.
    assert len(checks) <= 1, checks
    settings.DISTRIBUTED = False
    assert not isinstance(socket_db(_query), DatabaseSyncToAsync)
