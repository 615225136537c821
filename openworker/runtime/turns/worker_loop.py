"""One event loop per Celery worker process, shared by every turn the process runs."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from openworker.event_loop import new_event_loop


class WorkerLoop:
    """One event loop per worker process, in its own thread, for every turn the process
    runs.

    `async_to_sync` per Celery thread would give each turn its own loop and two threads:
    at 200 concurrent turns that is hundreds of threads contending for the GIL, each
    with its own Redis pools, and latency grows with the number of runnable threads
    (measured by bench/stream_path.py). One loop keeps one set of connections and lets
    the turns interleave at their await points. It is uvloop's where installed
    (`openworker.event_loop`).
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="turn-loop", daemon=True)
                thread.start()
                self._loop = loop
            return self._loop

    @property
    def started(self) -> bool:
        return self._loop is not None and not self._loop.is_closed()

    def run(self, coro: Any) -> Any:
        """Run `coro` on the process's turn loop and wait for its result."""
        loop = self._ensure()
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        return future.result()


worker_loop = WorkerLoop()
