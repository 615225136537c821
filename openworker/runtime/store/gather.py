"""Database calls that a burst of turns makes at the same moment, gathered into one.

The worker runs every turn's database calls on one thread, where a burst of new turns
queues: each call costs that thread its statements, and under load each statement
waits to take the GIL back from the streaming loop. A `Gatherer` lets the turns that ask
while its call is in flight go together in the next one: the batch function answers a
list of asks with one result each, in a few statements for the lot. Nothing waits on a
timer: a lone ask goes at once. (`claims.Claimer` is the same idea for the claim, with
a lease owner per batch.)
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from openworker.runtime.store.dbcall import db
from openworker.runtime.store.priority_pool import call_priority

logger = logging.getLogger(__name__)

Ask = TypeVar("Ask")
Answer = TypeVar("Answer")
Item = TypeVar("Item")

# A batch's askers are woken at most this many per event-loop iteration. A hundred turns
# woken at once ran their next steps back to back while every stream on the loop waited:
# the worker's loop ran ~100 ms late when a wave of turns ended or started together
# (bench/stream_path.py at K = 500, docs/PERFORMANCE.md session 15).
WAKE_PER_ITERATION = 8


def settle_spread(items: list[Item], settle: Callable[[Item], None]) -> None:
    """`settle(item)` for every item in order, WAKE_PER_ITERATION of them per iteration
    of the running loop: what the loop's sockets have for it runs between the groups."""
    if len(items) <= WAKE_PER_ITERATION:
        for item in items:
            settle(item)
        return
    loop = asyncio.get_running_loop()

    def group(start: int) -> None:
        for item in items[start : start + WAKE_PER_ITERATION]:
            settle(item)
        if start + WAKE_PER_ITERATION < len(items):
            loop.call_soon(group, start + WAKE_PER_ITERATION)

    group(0)


@dataclass
class _Waiting(Generic[Ask, Answer]):
    ask: Ask
    future: asyncio.Future[Answer]
    # The asker's place in the database threads' queue (priority_pool): a batch goes at
    # its oldest turn's.
    priority: int


class Gatherer(Generic[Ask, Answer]):
    """One event loop's asks of one kind, gathered into batches while a call runs.

    `call(asks)` runs on the database thread and returns one answer per ask, in order;
    an answer that is an exception is raised to its asker alone, and an exception raised
    by `call` itself to every asker of the batch. `abandoned(answer)` is told of an
    answer whose asker left (cancelled) while the call ran, to release what it holds.
    """

    def __init__(
        self,
        call: Callable[[list[Ask]], list[Answer | Exception]],
        *,
        max_batch: int,
        abandoned: Callable[[Answer], None] | None = None,
    ) -> None:
        self._call = call
        self._max_batch = max_batch
        self._abandoned = abandoned
        self._waiting: list[_Waiting[Ask, Answer]] = []
        self._draining: asyncio.Task[None] | None = None

    async def ask(self, ask: Ask) -> Answer:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Answer] = loop.create_future()
        self._waiting.append(_Waiting(ask, future, call_priority.get()))
        if self._draining is None or self._draining.done():
            self._draining = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._waiting:
            batch = self._waiting[: self._max_batch]
            del self._waiting[: self._max_batch]
            batch = [waiting for waiting in batch if not waiting.future.done()]
            if not batch:
                continue
            call_priority.set(min(waiting.priority for waiting in batch))
            try:
                answers = await db(self._call)([waiting.ask for waiting in batch])
            except Exception as exc:
                for waiting in batch:
                    if not waiting.future.done():
                        waiting.future.set_exception(exc)
                continue
            settle_spread(list(zip(batch, answers, strict=True)), self._settle)

    def _settle(self, answered: tuple[_Waiting[Ask, Answer], Answer | Exception]) -> None:
        waiting, answer = answered
        if waiting.future.done():
            if self._abandoned is not None and not isinstance(answer, Exception):
                self._abandoned(answer)
        elif isinstance(answer, Exception):
            waiting.future.set_exception(answer)
        else:
            waiting.future.set_result(answer)


class PerLoop(Generic[Ask, Answer]):
    """A `Gatherer` for each event loop that asks (futures must not cross loops), made by
    `make()` on the loop's first ask: `PerLoop(make)()` is the running loop's."""

    def __init__(self, make: Callable[[], Gatherer[Ask, Answer]]) -> None:
        self._make = make
        self._gatherers: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, Gatherer[Ask, Answer]
        ] = weakref.WeakKeyDictionary()

    def __call__(self) -> Gatherer[Ask, Answer]:
        loop = asyncio.get_running_loop()
        found = self._gatherers.get(loop)
        if found is None:
            found = self._gatherers[loop] = self._make()
        return found
