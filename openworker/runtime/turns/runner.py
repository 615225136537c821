"""TurnRunner: where `run_turn` runs.

- Distributed: a Celery task on the `turns` queue, enqueued once the transaction that
  queued the turn commits; the task runs the coroutine to completion on the worker
  process's one turn loop (`worker_loop`), blocking its Celery thread meanwhile. The
  turns one transaction queued (a burst's sends, written together) share a message, at
  most TURNS_PER_MESSAGE to one.
- Embedded: an asyncio task on Daphne's own event loop (the in-memory channel layer is
  bound to that loop; threads talking to it stall). Tasks are cancelled, and their turns
  marked interrupted, when Daphne shuts down.

A turn's cancel token lives in `runtime.store.local_cancel` (the engine registers it;
Stop reaches it through `runtime.turns.commands`).

Same coroutine, same events, either way.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import uuid
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db import transaction

from openworker.runtime.agent.tools import mcp_pool
from openworker.runtime.turns.admission import run_admitted
from openworker.runtime.turns.tasks import run_turn_task, run_turns_task
from providers.kept_connections import aclose_loop_keeper

logger = logging.getLogger(__name__)

# The most turns one Celery message carries. A message costs the sender about 1.5 ms of
# CPU (kombu's envelope, its encoding, the LPUSH) and the worker's Celery thread a
# receive, a hand-off to a pool thread and an ack: per turn, that was most of what a
# batched send still cost Daphne (bench/turn_start.py). Small enough that a burst is
# still spread over several workers, each message going to whichever fetches it.
TURNS_PER_MESSAGE = 20


def turn_enqueue(turn_id: uuid.UUID | str) -> None:
    """Start the turn after the current transaction commits (never before: the worker
    must find the rows)."""
    turns_enqueue([turn_id])


def turns_enqueue(turn_ids: Iterable[uuid.UUID | str]) -> None:
    """Start these turns after the current transaction commits, in this order."""
    ids = [str(turn_id) for turn_id in turn_ids]
    if ids:
        transaction.on_commit(lambda: _dispatch(ids))


def _dispatch(turn_ids: list[str]) -> None:
    if not settings.DISTRIBUTED:
        for turn_id in turn_ids:
            embedded_runner.schedule(turn_id)
        return
    if len(turn_ids) == 1:
        run_turn_task.delay(turn_ids[0])
        return
    for start in range(0, len(turn_ids), TURNS_PER_MESSAGE):
        run_turns_task.delay(turn_ids[start : start + TURNS_PER_MESSAGE])


class EmbeddedRunner:
    """Runs turns as tasks on the bound event loop (Daphne's, bound by the ASGI app)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._shutdown_hooked = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        if not self._shutdown_hooked:
            self._shutdown_hooked = _hook_reactor_shutdown(self.shutdown)

    def schedule(self, turn_id: str) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            raise RuntimeError("embedded runner has no event loop (is Daphne serving?)")
        # A fresh context: the caller may be inside a `sync_to_async` call, and a task that
        # inherited that context would see asgiref's "already in the sync thread" marker.
        loop.call_soon_threadsafe(self._start, turn_id, context=contextvars.Context())

    def _start(self, turn_id: str) -> None:
        task = asyncio.ensure_future(run_admitted(turn_id))
        self._tasks[turn_id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(turn_id, None))

    def running_ids(self) -> frozenset[str]:
        """Turns with a live task in this process (the sweeper leaves them alone)."""
        return frozenset(self._tasks)

    async def wait(self, turn_id: str) -> None:
        """Wait for a running turn's task (tests)."""
        task = self._tasks.get(turn_id)
        if task is not None:
            await asyncio.shield(task)

    async def shutdown(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        # Then the loop's open MCP sessions (stdio processes included) end cleanly, and
        # its kept provider connections close.
        await mcp_pool.aclose_running_loop_pool()
        await aclose_loop_keeper()


def _hook_reactor_shutdown(callback: Any) -> bool:
    """Under Daphne (Twisted's asyncio reactor) cancel running turns before shutdown."""
    try:
        from twisted.internet import defer, reactor
    except ImportError:  # pragma: no cover - twisted comes with daphne
        return False
    if not getattr(reactor, "running", False):
        return False

    def before_shutdown() -> Any:
        return defer.Deferred.fromFuture(asyncio.ensure_future(callback()))

    reactor.addSystemEventTrigger("before", "shutdown", before_shutdown)
    return True


embedded_runner = EmbeddedRunner()
