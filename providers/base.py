"""The `ProviderClient` contract (seed 000)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

from .types import AssistantTurn, ModelCapabilities, StreamChunk


class ProviderClient(ABC):
    """Single-shot, provider-agnostic completion interface.

    Deliberately blocking (the turn engine wraps it in `asyncio.to_thread`) and
    deliberately without a `max_turns` loop: the runtime owns the agent loop.

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
