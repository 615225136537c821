"""A thread pool that runs the oldest turn's database calls first.

A worker's turns share one or two database threads (openworker/dbcall.py). Each turn makes
a chain of calls before its first token (claim, router, history, settings, compaction
state), and with a first-in-first-out queue a burst of new turns interleaves them: every
turn waits behind every other turn's next call, so they all finish starting at about the
same moment, and their streams begin in one clump that stalls the streams already running
(bench/stream_path.py: 130 turns starting within half a second). Ordered by when each turn
arrived, the calls let turn 1 reach its first token, then turn 2, and so on: the starts
spread out, and the first turns wait less.

The order is a context variable (`call_priority`): `run_turn` sets it once, every call the
turn makes carries it, and a call from anywhere else runs first (priority 0). A turn's
title, made after it gave its place back, queues behind every turn (`AFTER_EVERY_TURN`).
"""

from __future__ import annotations

import contextvars
import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

call_priority: contextvars.ContextVar[int] = contextvars.ContextVar("call_priority", default=0)
_arrivals = itertools.count(1)


# Work that holds up nobody (a new session's title, saved after its turn gave its place
# back) queues behind every turn's calls: past any arrival number.
AFTER_EVERY_TURN = 1 << 62


def next_arrival() -> int:
    """A priority for a turn that arrives now: after every turn that arrived before."""
    return next(_arrivals)


class PriorityThreadPool(Executor):
    """`concurrent.futures` executor whose queue is ordered by (`call_priority` at submit
    time, submit order)."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        self._max_workers = max_workers
        self._prefix = thread_name_prefix
        self._queue: queue.PriorityQueue[tuple[int, int, Any]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new calls after shutdown")
            self._queue.put((call_priority.get(), next(self._order), (future, fn, args, kwargs)))
            if len(self._threads) < self._max_workers:
                thread = threading.Thread(
                    target=self._work,
                    name=f"{self._prefix}_{len(self._threads)}",
                    daemon=True,
                )
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while True:
            _, _, item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    _, _, item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            # After every queued call (their priorities are all lower than this).
            self._queue.put((2**63, next(self._order), None))
        if wait:
            for thread in threads:
                thread.join()
