"""`runtime.live.loop_local.LoopLocal`: one value per event loop, the last loop's found
without a dictionary lookup."""

from __future__ import annotations

import asyncio
import gc
import weakref

from openworker.runtime.live.loop_local import LoopLocal


def test_each_loop_gets_its_own_value_made_once() -> None:
    made: list[asyncio.AbstractEventLoop] = []

    def make(loop: asyncio.AbstractEventLoop) -> object:
        made.append(loop)
        return object()

    local: LoopLocal[object] = LoopLocal(make)

    async def twice() -> tuple[object, object]:
        return local.get(), local.get()

    first = asyncio.new_event_loop()
    second = asyncio.new_event_loop()
    try:
        a1, a2 = first.run_until_complete(twice())
        b1, b2 = second.run_until_complete(twice())
        # Back to the first loop after the second asked: still its own value.
        a3, _ = first.run_until_complete(twice())
    finally:
        first.close()
        second.close()
    assert a1 is a2 is a3
    assert b1 is b2
    assert a1 is not b1
    assert made == [first, second]


def test_pop_forgets_the_loops_value_and_the_next_get_makes_a_new_one() -> None:
    local: LoopLocal[object] = LoopLocal(lambda loop: object())

    async def cycle() -> tuple[object, object | None, object]:
        before = local.get()
        popped = local.pop(asyncio.get_running_loop())
        return before, popped, local.get()

    before, popped, after = asyncio.run(cycle())
    assert popped is before
    assert after is not before


def test_a_closed_loops_value_is_dropped_once_another_loop_asks() -> None:
    class Value:
        pass

    local: LoopLocal[Value] = LoopLocal(lambda loop: Value())

    async def value_ref() -> weakref.ref[Value]:
        return weakref.ref(local.get())

    dead = asyncio.run(value_ref())
    asyncio.run(value_ref())  # another loop asks: the first one's value is not held
    gc.collect()
    assert dead() is None
