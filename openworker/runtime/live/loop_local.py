"""A value per event loop, found fast for the loop that asked last.

Asyncio connections must not cross loops, so the Redis batchers and the channel layer's
state are kept per loop. A `WeakKeyDictionary` lookup builds a weak reference and hashes
it on every call: on the streaming path that is every append and every publish, 4 % of
the emitter's CPU (bench/emit_path.py). A serving process runs one loop, so the last
loop's value answers almost every call with one weak-reference check.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class LoopLocal(Generic[T]):
    """`get()` gives the running loop's value, made by `make(loop)` on first use. Values
    are held weakly by their loop (dropped with it); the last one asked for is also held
    until another loop asks or `pop` drops it."""

    def __init__(self, make: Callable[[asyncio.AbstractEventLoop], T]) -> None:
        self._make = make
        self._values: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = (
            weakref.WeakKeyDictionary()
        )
        self._last: tuple[weakref.ref[asyncio.AbstractEventLoop], T] | None = None

    def get(self) -> T:
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0]() is loop:
            return last[1]
        value = self._values.get(loop)
        if value is None:
            value = self._values[loop] = self._make(loop)
        self._last = (weakref.ref(loop), value)
        return value

    def pop(self, loop: asyncio.AbstractEventLoop) -> T | None:
        """Forget `loop`'s value (the next `get` there makes a new one) and return it."""
        last = self._last
        if last is not None and last[0]() is loop:
            self._last = None
        return self._values.pop(loop, None)
