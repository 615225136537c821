"""The blocking face of the event-loop provider path (the seed's `complete()`/`stream()`).

Every provider rule (retries, error translation, timeouts, the SSRF-checked connect,
cancel, SSE and byte streaming) is written once, as coroutines on an event loop, and the
blocking calls are derived from them here, not the reverse. The engine streams hundreds
of turns from one event loop, where a thread per stream made the threads' hand-offs of
the GIL, not the work, the limit (docs/PERFORMANCE.md); the blocking callers (the
settings page's "test connection", the compactor's summary call in a worker thread,
benches and scripts) are few and not hot. So the hot path keeps its speed and the cold
one pays a hand-off between threads, never the other way round.

A blocking call runs its coroutine on ONE private event loop, in a daemon thread started
on first use (and again in a forked child, where the parent's thread does not exist),
rather than on a loop per calling thread: it works from any thread, even one that runs an
event loop of its own (`asyncio.run` refuses there); the connections a transport pools
for blocking callers live on one loop, so calls from different threads reuse them; and a
`CancelToken` fired from any thread reaches the awaited read on that loop exactly as it
does on the engine's.

Hand-written rather than taken from `asgiref.sync.async_to_sync` (a new loop per call
outside a running loop, so nothing pooled survives a call, and no async generators) or
`anyio.from_thread.BlockingPortal` (it wraps tasks in anyio cancel scopes, which the
cancel token's own `Task.cancel()`/`uncancel()` would have to cross, and does not iterate
async generators either).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

# How long a consumer that leaves a stream early waits for its upstream to be closed: the
# close is a socket shutdown (milliseconds); this only bounds a loop that is stuck.
CLOSE_WAIT_SECONDS = 5.0

_ITEMS, _END, _ERROR = 0, 1, 2

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_pid: int | None = None


def background_loop() -> asyncio.AbstractEventLoop:
    """The private loop blocking calls run on, started on first use (per process)."""
    global _loop, _thread, _pid
    with _lock:
        if _loop is None or _pid != os.getpid() or not _loop.is_running():
            ready = threading.Event()
            loop = asyncio.new_event_loop()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            thread = threading.Thread(target=run, name="provider-blocking-loop", daemon=True)
            thread.start()
            ready.wait()
            _loop, _thread, _pid = loop, thread, os.getpid()
        return _loop


def running_loop_if_started() -> asyncio.AbstractEventLoop | None:
    """The private loop when it runs in this process, else None (nothing is started)."""
    with _lock:
        if _loop is not None and _pid == os.getpid() and _loop.is_running():
            return _loop
        return None


def _check_caller() -> None:
    if threading.current_thread() is _thread:
        raise RuntimeError("a blocking provider call was made on the provider loop itself")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on the private loop and return its result (or raise its error).
    Interrupting the wait (KeyboardInterrupt) cancels the coroutine."""
    loop = background_loop()
    _check_caller()
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result()
    finally:
        if not future.done():
            future.cancel()
            concurrent.futures.wait([future], timeout=CLOSE_WAIT_SECONDS)


def iterate(stream: AsyncIterator[T]) -> Iterator[T]:
    """Iterate the async iterator `stream` on the private loop and yield its items here.

    One task reads the whole stream (a `CancelToken`'s guard cancels the task it was
    created in, so the reads must not hop between tasks) and hands items over as they
    come: each as soon as the task waits again, so what one read completed (a burst of
    events) crosses in one hand-off. Nothing starts before the
    first `next()`. Leaving early (`close()`, a break, an error in the consumer) cancels
    that task and waits until the stream is closed: the upstream socket is released
    before `close()` returns.
    """
    loop = background_loop()
    _check_caller()
    items: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
    batch: list[T] = []

    def hand_over() -> None:
        # Runs when the pump next waits (a `call_soon` callback): everything one read
        # completed crosses to the consumer in one put, one wake-up of its thread.
        if batch:
            items.put((_ITEMS, batch.copy()))
            batch.clear()

    async def pump() -> None:
        outcome: tuple[int, Any] = (_END, None)
        try:
            async for item in stream:
                if not batch:
                    loop.call_soon(hand_over)
                batch.append(item)
        except BaseException as exc:  # the consumer's own cancel too: nobody reads it then
            outcome = (_ERROR, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            try:
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()
            finally:
                hand_over()
                items.put(outcome)  # after the close: the consumer never waits for it

    tasks: list[asyncio.Task[None]] = []
    finished = threading.Event()

    def start() -> None:
        task = loop.create_task(pump())
        task.add_done_callback(lambda _task: finished.set())
        tasks.append(task)

    def stop() -> None:  # runs after `start` (the loop's callbacks are FIFO)
        tasks[0].cancel()

    loop.call_soon_threadsafe(start)
    ended = False
    try:
        while True:
            kind, value = items.get()
            if kind == _ITEMS:
                yield from value
                continue
            ended = True
            if kind == _ERROR:
                raise value
            return
    finally:
        if not ended:
            loop.call_soon_threadsafe(stop)
            finished.wait(CLOSE_WAIT_SECONDS)
