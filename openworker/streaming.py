"""The turn's outgoing event stream: sequence numbers, coalescing, replay, publishing.

Every event carries the turn id and a per-turn `seq`. Text and reasoning deltas are
coalesced for `STREAM_COALESCE_SECONDS` (tens of ms) into one event rather than one
frame per token. Each event goes to the replay buffer first, then to the session's
channel-layer group; neither failing stops the turn (the transcript in the database is
the source of truth, and a client resumes from the buffer).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from openworker.replay import ReplayBuffer
from sessions import events

logger = logging.getLogger(__name__)


class TurnEmitter:
    def __init__(
        self,
        *,
        session_id: str,
        turn_id: str,
        buffer: ReplayBuffer,
        start_seq: int = 0,
        coalesce_seconds: float = 0.04,
    ) -> None:
        self.session_id = session_id
        self.turn_id = turn_id
        self.buffer = buffer
        self.seq = start_seq
        self.coalesce_seconds = coalesce_seconds
        self._lock = asyncio.Lock()
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._flush_handle: asyncio.TimerHandle | None = None
        self._last_flush = float("-inf")
        self._flush_tasks: set[asyncio.Task[None]] = set()

    async def emit(self, type_: str, **fields: Any) -> dict[str, Any]:
        async with self._lock:
            await self._flush_locked()
            return await self._publish_locked(type_, fields)

    def delta(self, *, text: str | None = None, reasoning: str | None = None) -> None:
        """Buffer a delta. After a quiet spell it goes out at once; during a burst, at most
        one frame per `coalesce_seconds` (a flush is scheduled for the end of the window)."""
        if text:
            self._text.append(text)
        if reasoning:
            self._reasoning.append(reasoning)
        if self._flush_handle is not None or not (self._text or self._reasoning):
            return
        loop = asyncio.get_running_loop()
        wait = self._last_flush + self.coalesce_seconds - loop.time()
        self._flush_handle = loop.call_later(max(wait, 0.0), self._schedule_flush)

    def _schedule_flush(self) -> None:
        task = asyncio.ensure_future(self.flush())
        self._flush_tasks.add(task)
        task.add_done_callback(self._flush_tasks.discard)

    async def flush(self) -> None:
        async with self._lock:
            await self._flush_locked()

    async def close(self) -> None:
        await self.flush()
        if self._flush_tasks:
            await asyncio.gather(*self._flush_tasks, return_exceptions=True)

    async def _flush_locked(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if not (self._text or self._reasoning):
            return
        fields: dict[str, Any] = {}
        if self._text:
            fields["text"] = "".join(self._text)
        if self._reasoning:
            fields["reasoning"] = "".join(self._reasoning)
        self._text.clear()
        self._reasoning.clear()
        self._last_flush = asyncio.get_running_loop().time()
        await self._publish_locked("delta", fields)

    async def _publish_locked(self, type_: str, fields: dict[str, Any]) -> dict[str, Any]:
        self.seq += 1
        event = {"type": type_, "turn": self.turn_id, "seq": self.seq, **fields}
        try:
            await self.buffer.append(self.turn_id, self.seq, event)
        except Exception:
            logger.warning("replay buffer append failed for turn %s", self.turn_id, exc_info=True)
        try:
            await events.apublish(self.session_id, event)
        except Exception:
            logger.warning("channel layer publish failed for turn %s", self.turn_id, exc_info=True)
        return event
