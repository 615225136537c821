"""The turn's outgoing event stream: sequence numbers, coalescing, replay, publishing.

Every event carries the turn id and a per-turn `seq`. Text and reasoning deltas are
coalesced for `STREAM_COALESCE_SECONDS` (tens of ms) into one event rather than one
frame per token. Each event goes to the replay buffer first, then to the session's
channel-layer group; neither failing stops the turn (the transcript in the database is
the source of truth, and a client resumes from the buffer).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from openworker.runtime.live import events
from openworker.runtime.live.replay import ReplayBuffer

logger = logging.getLogger(__name__)

_WHAT = ("replay buffer append", "channel layer publish")


class TurnEmitter:
    """Numbers, coalesces and sends one turn's events.

    Sending is synchronous queueing: each event is queued on the replay buffer and then
    on the channel layer in one step, in `seq` order, with nothing awaited in between, so
    no lock or task is needed per event and order holds by construction. Deltas are not
    awaited at all (a failure is logged; the socket recovers from the buffer); `emit`
    awaits its event's outcome, so a status is sent before the turn's buffer expires.
    """

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
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._flush_handle: asyncio.TimerHandle | None = None
        self._last_flush = float("-inf")
        # Outcomes of deltas not yet known: `close` waits for them.
        self._in_flight: set[asyncio.Future[Any]] = set()

    async def emit(self, type_: str, **fields: Any) -> dict[str, Any]:
        self.flush_now()
        event, stored, published = self._send(type_, fields)
        results = await asyncio.gather(stored, published, return_exceptions=True)
        for what, result in zip(_WHAT, results, strict=True):
            if isinstance(result, BaseException):
                self._log_failure(what, result)
        return event

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
        if wait <= 0:
            self.flush_now()
        else:
            self._flush_handle = loop.call_later(wait, self.flush_now)

    def flush_now(self) -> None:
        """Send the buffered deltas as one event (without waiting for its outcome)."""
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
        _, stored, published = self._send("delta", fields)
        for what, future in zip(_WHAT, (stored, published), strict=True):
            self._in_flight.add(future)
            future.add_done_callback(functools.partial(self._delta_done, what))

    def _delta_done(self, what: str, future: asyncio.Future[Any]) -> None:
        self._in_flight.discard(future)
        if not future.cancelled() and future.exception() is not None:
            self._log_failure(what, future.exception())

    async def flush(self) -> None:
        self.flush_now()

    async def close(self) -> None:
        self.flush_now()
        if self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)

    def _send(self, type_: str, fields: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
        self.seq += 1
        event = {"type": type_, "turn": self.turn_id, "seq": self.seq, **fields}
        # The append is queued before the publish. They travel on separate connections, so
        # a publish may still overtake an append: a socket that sees a gap waits for the
        # buffer to catch up (`SessionConsumer._fill_gap`).
        stored = self._queue(self.buffer.append_soon, self.turn_id, self.seq, event)
        published = self._queue(events.publish_soon, self.session_id, event)
        return event, stored, published

    def _queue(self, send: Any, *args: Any) -> asyncio.Future[Any]:
        try:
            return asyncio.ensure_future(send(*args))
        except Exception as exc:  # e.g. no running Redis client could be made
            failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed

    def _log_failure(self, what: str, error: BaseException) -> None:
        logger.warning("%s failed for turn %s", what, self.turn_id, exc_info=error)
