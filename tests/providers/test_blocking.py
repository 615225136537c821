"""The blocking face of the async provider path: `providers.blocking.run` / `iterate`.

What the seed's blocking `complete()`/`stream()` promise, checked on the bridge itself
(the HTTP behaviour through it is in test_transport.py and test_async_streaming.py): items
come as they are made, errors come after the items before them, a consumer that leaves
closes the stream before its `close()` returns, and a caller may be any thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest

from providers import blocking

# Generous bound for a hand-over that takes microseconds: only a hang fails it.
PATIENCE = 5.0


async def numbers(log: list[str], count: int, *, fail_after: int | None = None):
    log.append("started")
    try:
        for n in range(count):
            if fail_after is not None and n == fail_after:
                raise ValueError("broken upstream")
            yield n
            await asyncio.sleep(0)
        log.append("ended")
    finally:
        log.append("closed")


def test_iterate_yields_every_item_in_order_then_ends():
    log: list[str] = []

    assert list(blocking.iterate(numbers(log, 5))) == [0, 1, 2, 3, 4]
    assert log == ["started", "ended", "closed"]


def test_nothing_runs_before_the_first_next():
    log: list[str] = []
    items = blocking.iterate(numbers(log, 3))

    assert log == []
    assert next(items) == 0
    assert log[0] == "started"
    items.close()


def test_an_error_comes_after_the_items_before_it():
    log: list[str] = []
    got: list[int] = []

    with pytest.raises(ValueError, match="broken upstream"):
        for n in blocking.iterate(numbers(log, 5, fail_after=2)):
            got.append(n)
    assert got == [0, 1]
    assert log[-1] == "closed"


async def first_then_forever(log: list[str]) -> AsyncIterator[str]:
    """One item, then a wait nothing ends but the consumer's leaving."""
    try:
        yield "first"
        await asyncio.Event().wait()
        yield "never"
    finally:
        log.append("closed")


def test_a_consumer_that_leaves_early_has_the_stream_closed_before_close_returns():
    log: list[str] = []
    items = blocking.iterate(first_then_forever(log))

    assert next(items) == "first"
    items.close()

    assert log == ["closed"]


def test_a_consumer_raising_mid_stream_closes_the_stream():
    log: list[str] = []

    with pytest.raises(KeyError):
        for _ in blocking.iterate(first_then_forever(log)):
            raise KeyError("the consumer's own failure")
    assert log == ["closed"]


def test_a_caller_may_be_a_thread_that_runs_its_own_event_loop():
    log: list[str] = []

    async def inside_a_loop() -> list[int]:
        return list(blocking.iterate(numbers(log, 3)))  # asyncio.run would refuse here

    assert asyncio.run(inside_a_loop()) == [0, 1, 2]


def test_callers_on_many_threads_share_the_one_private_loop():
    seen: list[asyncio.AbstractEventLoop] = []
    lock = threading.Lock()

    async def which_loop() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def call() -> None:
        loop = blocking.run(which_loop())
        with lock:
            seen.append(loop)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(PATIENCE)

    assert len(seen) == 4
    assert len(set(map(id, seen))) == 1
    assert seen[0] is blocking.running_loop_if_started()


def test_run_returns_the_result_or_raises_the_error():
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    async def refuse() -> int:
        raise PermissionError("no")

    assert blocking.run(answer()) == 42
    with pytest.raises(PermissionError, match="no"):
        blocking.run(refuse())


def test_a_blocking_call_from_the_private_loop_itself_is_refused_not_deadlocked():
    async def nested() -> None:
        coro = asyncio.sleep(0)
        try:
            blocking.run(coro)
        finally:
            coro.close()

    with pytest.raises(RuntimeError, match="on the provider loop itself"):
        blocking.run(nested())
