"""The worker's database threads (openworker/dbcall.py): turn calls share a small pool
(settings.WORKER_DB_THREADS), and lease heartbeats never queue behind them."""

from __future__ import annotations

import asyncio
import threading

import pytest

from openworker.runtime.store import dbcall


@pytest.fixture
def distributed(settings):  # type: ignore[no-untyped-def]
    settings.DISTRIBUTED = True
    settings.WORKER_DB_THREADS = 1
    saved = dict(dbcall._POOLS)
    dbcall._POOLS.clear()
    yield
    for pool in dbcall._POOLS.values():
        pool.shutdown(wait=False, cancel_futures=True)
    dbcall._POOLS.clear()
    dbcall._POOLS.update(saved)


def test_a_heartbeat_runs_while_the_turn_threads_are_busy(distributed):
    release = threading.Event()

    def slow_turn_call() -> str:
        release.wait(5)
        return "turn"

    def heartbeat() -> str:
        return threading.current_thread().name

    async def scenario() -> tuple[str, str]:
        busy = asyncio.ensure_future(dbcall.db(slow_turn_call)())
        queued = asyncio.ensure_future(dbcall.db(heartbeat)())  # behind the slow call
        beat = await asyncio.wait_for(dbcall.db(heartbeat, pool="lease-db")(), 2)
        assert not queued.done()
        release.set()
        await busy
        return beat, await queued

    beat_thread, turn_thread = asyncio.run(scenario())
    assert beat_thread.startswith("lease-db")
    assert turn_thread.startswith("turn-db")


@pytest.fixture
def embedded(settings):  # type: ignore[no-untyped-def]
    settings.DISTRIBUTED = False
    saved = dict(dbcall._POOLS)
    dbcall._POOLS.clear()
    yield
    for pool in dbcall._POOLS.values():
        pool.shutdown(wait=False, cancel_futures=True)
    dbcall._POOLS.clear()
    dbcall._POOLS.update(saved)


def test_embedded_heartbeats_run_while_the_sync_thread_is_busy(embedded):
    """Turn calls share Django's sync thread with the websocket consumers; a burst of sends
    there must not delay the heartbeats into a lease expiry."""
    from asgiref.sync import sync_to_async

    release = threading.Event()

    def busy_consumer_call() -> str:
        release.wait(5)
        return threading.current_thread().name

    def where() -> str:
        return threading.current_thread().name

    async def scenario() -> tuple[str, str, str]:
        busy = asyncio.ensure_future(sync_to_async(busy_consumer_call, thread_sensitive=True)())
        turn_call = asyncio.ensure_future(dbcall.db(where)())  # behind it, same thread
        beat = await asyncio.wait_for(dbcall.db(where, pool="lease-db")(), 2)
        assert not turn_call.done()
        release.set()
        return await busy, await turn_call, beat

    sync_thread, turn_thread, beat_thread = asyncio.run(scenario())
    assert turn_thread == sync_thread
    assert beat_thread.startswith("lease-db")


def test_the_turn_pool_has_the_configured_number_of_threads(distributed, settings):
    settings.WORKER_DB_THREADS = 3
    assert dbcall._db_pool("turn-db")._max_workers == 3
    assert dbcall._db_pool("lease-db")._max_workers == 1


def test_calls_run_oldest_turn_first_then_in_submit_order():
    from openworker.runtime.store.priority_pool import PriorityThreadPool, call_priority

    pool = PriorityThreadPool(1, thread_name_prefix="test-db")
    gate = threading.Event()
    ran: list[str] = []
    try:
        first = pool.submit(gate.wait, 5)  # occupies the only thread
        futures = []
        for name, priority in [("turn3-a", 3), ("turn1-a", 1), ("turn2", 2), ("turn1-b", 1)]:
            token = call_priority.set(priority)
            try:
                futures.append(pool.submit(ran.append, name))
            finally:
                call_priority.reset(token)
        gate.set()
        first.result(5)
        for future in futures:
            future.result(5)
    finally:
        pool.shutdown()
    assert ran == ["turn1-a", "turn1-b", "turn2", "turn3-a"]


def test_a_failing_call_reports_its_error_and_the_pool_keeps_working():
    from openworker.runtime.store.priority_pool import PriorityThreadPool

    pool = PriorityThreadPool(1, thread_name_prefix="test-db")
    try:
        failed = pool.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failed.result(5)
        assert pool.submit(lambda: "still here").result(5) == "still here"
    finally:
        pool.shutdown()
    with pytest.raises(RuntimeError):
        pool.submit(print)


async def test_a_turn_gets_a_later_priority_than_the_turns_before_it():
    from openworker.runtime.store.priority_pool import call_priority, next_arrival

    async def turn() -> int:
        call_priority.set(next_arrival())
        await asyncio.sleep(0)
        return call_priority.get()

    before = call_priority.get()  # another test's `await run_turn()` may have set it here
    first, second = await asyncio.gather(turn(), turn())
    assert 0 < first < second
    assert call_priority.get() == before  # each turn's task set its own copy
