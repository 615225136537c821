"""Many small Redis writes from one event loop, sent as one pipeline per round trip.

A worker process streams hundreds of turns from one event loop, and each coalesced delta
is a replay-buffer append and a publish. One round trip per command made Redis latency,
not CPU, the limit (bench/stream_path.py: seconds of added latency at 200 turns). Here
every command queued while a pipeline is in flight goes out in the next one: nothing
waits for a timer, and under load each round trip carries the whole backlog.

Commands keep the order they were queued in, within a batch and across batches (one
pipeline at a time per batcher). Two batchers (the replay buffer's and the channel
layer's) run side by side, on their own connections, with no order between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import types
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

# Bound one pipeline: a burst after a stall goes out in several round trips rather than
# one huge reply buffer.
MAX_BATCH = 512


class CommandBatcher:
    def __init__(self, client: Any) -> None:
        self.client = client
        self._pending: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        self._drain_task: asyncio.Task[None] | None = None

    def submit(self, *args: Any) -> asyncio.Future[Any]:
        """Queue one command now (synchronously, so callers' order is Redis's order);
        the future resolves with its reply or its error."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((args, future))
        if self._drain_task is None:
            self._drain_task = loop.create_task(self._drain())
        return future

    async def call(self, *args: Any) -> Any:
        return await self.submit(*args)

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch = self._pending[:MAX_BATCH]
                del self._pending[:MAX_BATCH]
                await self._send(batch)
        finally:
            self._drain_task = None

    async def _send(self, batch: list[tuple[tuple[Any, ...], asyncio.Future[Any]]]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for args, _ in batch:
            pipe.execute_command(*args)
        try:
            replies = await pipe.execute(raise_on_error=False)
        except asyncio.CancelledError:
            for _, future in batch:
                if not future.done():
                    future.cancel()
            raise
        except Exception as exc:  # connection lost: every command of the batch failed
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), reply in zip(batch, replies, strict=True):
            if future.done():  # its caller gave up waiting
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)


_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, CommandBatcher]] = (
    weakref.WeakKeyDictionary()
)


def batcher_for(url: str) -> CommandBatcher:
    """This event loop's batcher for `url` (an asyncio connection must not cross loops);
    its connections close with the loop."""
    import redis.asyncio as aioredis

    loop = asyncio.get_running_loop()
    per_loop = _clients.get(loop)
    if per_loop is None:
        per_loop = _clients[loop] = {}
        on_loop_close(loop, lambda: _close_all(per_loop))
    batcher = per_loop.get(url)
    if batcher is None:
        batcher = per_loop[url] = CommandBatcher(aioredis.Redis.from_url(url))
    return batcher


async def _close_all(per_loop: dict[str, CommandBatcher]) -> None:
    for batcher in per_loop.values():
        with contextlib.suppress(Exception):
            await batcher.client.aclose()
    per_loop.clear()


def on_loop_close(loop: asyncio.AbstractEventLoop, cleanup: Callable[[], Awaitable[Any]]) -> None:
    """Run `cleanup()` on `loop` just before it closes (`async_to_sync` makes and closes
    loops): connections are closed by their loop, not left to the garbage collector and
    its "unclosed" warnings."""
    original = loop.close

    def close(self: asyncio.AbstractEventLoop) -> None:
        if not self.is_running() and not self.is_closed():
            with contextlib.suppress(Exception):
                self.run_until_complete(cleanup())
        original()

    loop.close = types.MethodType(close, loop)  # type: ignore[method-assign]
