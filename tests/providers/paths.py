"""Drive one wire client's reply down either streaming path, for tests that must hold on
both: `stream` (blocking, a worker thread's) and `astream` (the event loop's). Both feed
the same parser, so a shape handled in one is handled in the other; these helpers make a
test say so by running it twice."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from providers.types import StreamChunk

STREAM_PATHS = ("stream", "astream")


def streamed(make_client: Callable[[], Any], path: str, **call: Any) -> list[StreamChunk]:
    """Every chunk of one streamed reply read through `path` ("stream" or "astream") by a
    fresh client from `make_client`, closed afterwards (the async one on its own loop)."""
    client = make_client()
    if path == "stream":
        try:
            return list(client.stream(**call))
        finally:
            client.close()

    async def read() -> list[StreamChunk]:
        try:
            return [chunk async for chunk in client.astream(**call)]
        finally:
            await client.aclose()

    return asyncio.run(read())


def tool_deltas(chunks: list[StreamChunk]) -> list[dict[str, Any]]:
    return [chunk.tool_call_delta for chunk in chunks if chunk.tool_call_delta]
