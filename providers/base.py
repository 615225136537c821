"""The `ProviderClient` contract (seed 000)."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .errors import StreamError
from .types import AssistantTurn, ModelCapabilities, StreamChunk


class ProviderClient(ABC):
    """Single-shot, provider-agnostic completion interface.

    Deliberately blocking and deliberately without a `max_turns` loop: the runtime owns
    the agent loop. `astream` is the event-loop entry the runtime uses: HTTP clients
    read their stream on the loop itself (and derive their blocking `stream` from it,
    `providers.blocking`); any other client runs its `stream` in a thread.

    `messages` are canonical messages (DESIGN.md); `tools` are
    `{"name", "description", "parameters"}` dicts. Settings every client understands:
    `max_tokens`, `temperature`, `reasoning_effort` (off/low/medium/high), `cancel`
    (a `providers.cancel.CancelToken` that aborts the upstream request), and
    `cache_key` (a stable per-session key for providers with automatic caching).
    """

    @abstractmethod
    def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **settings: Any,
    ) -> AssistantTurn: ...

    @abstractmethod
    def capabilities(self, model: str) -> ModelCapabilities: ...

    def stream(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **settings: Any,
    ) -> Iterator[StreamChunk]:
        """Yield StreamChunks. Default: no token streaming, one final chunk with the full
        turn. Providers that support streaming override this with real deltas."""
        yield StreamChunk(
            turn=self.complete(model=model, messages=messages, tools=tools, **settings)
        )

    def close(self) -> None:  # noqa: B027 - optional hook, most clients hold nothing
        """Release pooled connections. Called when the router drops a cached client."""

    async def astream(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **settings: Any,
    ) -> AsyncIterator[StreamChunk]:
        """`stream` for a caller on an event loop. Default: `stream` in a thread of
        `STREAM_THREADS`, its chunks handed to the loop as they come."""
        async for chunk in stream_in_thread(
            lambda: self.stream(model=model, messages=messages, tools=tools, **settings)
        ):
            yield chunk

    async def acomplete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **settings: Any,
    ) -> AssistantTurn:
        """`complete` for a caller on an event loop. Default: the final turn of `astream`
        (HTTP clients post and read the whole reply on the loop instead)."""
        final: AssistantTurn | None = None
        async for chunk in self.astream(model=model, messages=messages, tools=tools, **settings):
            if chunk.turn is not None:
                final = chunk.turn
        if final is None:
            raise StreamError("The provider's stream ended without a final reply.")
        return final

    async def aclose(self) -> None:
        """`close` for a caller on an event loop."""
        await asyncio.to_thread(self.close)


# Threads for blocking streams driven from an event loop (clients without a native
# `astream`): sized for many concurrent turns, not CPU.
STREAM_THREADS = ThreadPoolExecutor(max_workers=256, thread_name_prefix="provider-stream")


async def stream_in_thread(start: Any) -> AsyncIterator[Any]:
    """Iterate the blocking iterator `start()` in a thread and yield its items here.
    Leaving early closes the iterator in its thread (for a stream: the upstream request)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    stop = False

    def pump() -> None:
        iterator = start()
        try:
            for item in iterator:
                loop.call_soon_threadsafe(queue.put_nowait, ("item", item))
                if stop:
                    break
        except BaseException as exc:
            loop.call_soon_threadsafe(queue.put_nowait, ("error", exc))
        else:
            loop.call_soon_threadsafe(queue.put_nowait, ("end", None))
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    future = loop.run_in_executor(STREAM_THREADS, pump)
    try:
        while True:
            kind, value = await queue.get()
            if kind == "error":
                raise value
            if kind == "end":
                return
            yield value
    finally:
        stop = True
        if not future.done():
            future.cancel()
