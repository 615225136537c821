"""TurnRunner: where `run_turn` runs.

- Distributed: a Celery task on the `turns` queue, enqueued once the transaction that
  queued the turn commits; the task runs the coroutine to completion on the worker
  process's one turn loop (`worker_loop`), blocking its Celery thread meanwhile.
- Embedded: an asyncio task on Daphne's own event loop (the in-memory channel layer is
  bound to that loop; threads talking to it stall). Tasks are cancelled, and their turns
  marked interrupted, when Daphne shuts down.

Same coroutine, same events, either way.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import uuid
from typing import Any

from django.conf import settings
from django.db import transaction

from providers.cancel import CancelToken

logger = logging.getLogger(__name__)

# Cancel tokens of the turns running in this process: Stop reaches them at once (and
# other processes' turns through the database flag the heartbeat reads).
_local_tokens: dict[str, CancelToken] = {}
_local_lock = threading.Lock()


def register_local(turn_id: str, token: CancelToken) -> None:
    with _local_lock:
        _local_tokens[turn_id] = token


def unregister_local(turn_id: str) -> None:
    with _local_lock:
        _local_tokens.pop(turn_id, None)


def turn_cancel_local(turn_id: uuid.UUID | str) -> bool:
    with _local_lock:
        token = _local_tokens.get(str(turn_id))
    if token is None:
        return False
    token.cancel()
    return True


def turn_enqueue(turn_id: uuid.UUID | str) -> None:
    """Start the turn after the current transaction commits (never before: the worker
    must find the rows)."""
    turn_id = str(turn_id)
    transaction.on_commit(lambda: _dispatch(turn_id))


def _dispatch(turn_id: str) -> None:
    if settings.DISTRIBUTED:
        from sessions.tasks import run_turn_task

        run_turn_task.delay(turn_id)
    else:
        embedded_runner.schedule(turn_id)


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
        from openworker.engine import run_turn

        task = asyncio.ensure_future(run_turn(turn_id))
        self._tasks[turn_id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(turn_id, None))

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


class WorkerLoop:
    """One event loop per worker process, in its own thread, for every turn the process
    runs.

    `async_to_sync` per Celery thread would give each turn its own loop and two threads:
    at 200 concurrent turns that is hundreds of threads contending for the GIL, each
    with its own Redis pools, and latency grows with the number of runnable threads
    (measured by bench/stream_path.py). One loop keeps one set of connections and lets
    the turns interleave at their await points.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="turn-loop", daemon=True)
                thread.start()
                self._loop = loop
            return self._loop

    def run(self, coro: Any) -> Any:
        """Run `coro` on the process's turn loop and wait for its result."""
        loop = self._ensure()
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        return future.result()


worker_loop = WorkerLoop()
