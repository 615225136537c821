"""The turn's outgoing event stream: sequence numbers, coalescing, replay, publishing.

Every event carries the turn id and a per-turn `seq`. Text and reasoning deltas are
coalesced into one event per window rather than one frame per token. The window adapts
to load (`LoopLoad`): `STREAM_COALESCE_SECONDS` (tens of ms; with the leading edge, a
frame per token at a model's usual 20-80 tokens/s) while there is room, widening up to
`MAX_COALESCE_SECONDS` when the event loop runs late or the Redis pipelines fall behind,
so a loaded process sends fewer, bigger frames (each costs about the same in the worker
and in Daphne whatever it carries) instead of falling further behind. Each event goes
to the replay buffer first, then to the session's channel-layer group; neither failing
stops the turn (the transcript in the database is the source of truth, and a client
resumes from the buffer).

A failed append (Redis down or restarted empty) starts a repair: the emitter holds new
events back, and once Redis answers again it rewrites the turn's whole buffer from the
events it kept (`MAX_HISTORY_EVENTS`) and publishes again what the pages may have
missed, in order. A page waits at a gap rather than showing later text across it
(`SessionConsumer`), so a Redis restart costs the page a pause, never a token.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import weakref
from collections import deque
from typing import Any

from openworker.runtime.live import events, redis_batch
from openworker.runtime.live.replay import ReplayBuffer

logger = logging.getLogger(__name__)

_WHAT = ("replay buffer append", "channel layer publish")

# Events of one turn kept in memory to rewrite its replay buffer after a Redis failure
# (a restarted Redis holds none of them): a long reply's deltas at one per coalescing
# window. Past it the oldest go, and a page that reloads then shows the transcript.
MAX_HISTORY_EVENTS = 20_000
# Repair attempts back off between these (seconds) and stop after REPAIR_GIVE_UP_SECONDS
# (the transcript in the database stays authoritative).
REPAIR_BACKOFF_SECONDS = (0.05, 1.0)
REPAIR_GIVE_UP_SECONDS = 300.0
# `emit` waits at most this long for a repair: a turn's final save and status must not
# hang on Redis (the repair carries on in the background).
EMIT_REPAIR_WAIT_SECONDS = 5.0
# Repairs outliving their turn's emitter (a task needs a strong reference).
_REPAIRS: set[asyncio.Task[Any]] = set()
# Not yet looked up (`TurnEmitter._quiet`).
_UNKNOWN = object()
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled", "interrupted"})

# Adaptive coalescing. The widest window: two tokens a frame at 20 tokens/s, and at most
# a tenth of a second added to a token. A quarter second (five tokens a frame) saved
# frames but added up to 200 ms to tokens of a loaded loop: p99 327 against 176 ms at
# K = 1000 with 500 places (bench/stream_path.py, docs/PERFORMANCE.md session 15).
MAX_COALESCE_SECONDS = 0.1
# The loop's lateness is probed this often while turns stream (20 wake-ups a second).
LOAD_PROBE_SECONDS = 0.05
# A loop running late widens the window to LAG_WIDENING times its lateness: a loop 25 ms
# behind sends a frame per 50 ms, 50 ms behind the widest. At four times, a loop 25 ms
# behind already held every token up to 100 ms: at K = 1000 with 500 places, two times
# sent about a tenth more frames and gave p99 151 against 177 ms, lower in five paired
# runs of six (docs/PERFORMANCE.md, session 20).
LAG_WIDENING = 2.0
# Commands waiting behind a Redis round trip before the window widens, and how much per
# as many again: a few hundred is one pipeline's worth (redis_batch.MAX_BATCH).
BACKLOG_ROOM = 256
# The probe stops when no emitter asked for the window this long (an idle process).
LOAD_IDLE_SECONDS = 2.0


class LoopLoad:
    """How loaded this event loop is, for the coalescing window: how late a timer fires
    (every LOAD_PROBE_SECONDS; up at once, down over about a second) and the Redis
    batchers' backlog. Probes only while emitters ask."""

    def __init__(self) -> None:
        self.lag = 0.0
        # The Redis batchers' backlog, sampled with the lateness: walking every batcher
        # on each delta was 3% of an embedded Daphne's loop at K = 200.
        self.backlog = 0
        self._due = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._asked = 0.0

    def window(self, floor: float) -> float:
        """The coalescing window now: `floor` with room, wider under load."""
        loop = asyncio.get_running_loop()
        self._asked = loop.time()
        if self._handle is None:
            self._due = self._asked + LOAD_PROBE_SECONDS
            self._handle = loop.call_later(LOAD_PROBE_SECONDS, self._tick)
        wanted = LAG_WIDENING * self.lag
        waiting = self.backlog
        if waiting > BACKLOG_ROOM:
            wanted = max(wanted, floor * waiting / BACKLOG_ROOM)
        return max(floor, min(MAX_COALESCE_SECONDS, wanted))

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        late = max(0.0, now - self._due)
        self.lag = late if late > self.lag else 0.8 * self.lag + 0.2 * late
        self.backlog = redis_batch.backlog()
        if now - self._asked > LOAD_IDLE_SECONDS:
            self._handle = None
            self.lag = 0.0
            return
        self._due = now + LOAD_PROBE_SECONDS
        self._handle = loop.call_later(LOAD_PROBE_SECONDS, self._tick)


_loads: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopLoad] = weakref.WeakKeyDictionary()


def loop_load() -> LoopLoad:
    """The running event loop's load probe."""
    loop = asyncio.get_running_loop()
    load = _loads.get(loop)
    if load is None:
        load = _loads[loop] = LoopLoad()
    return load


class TurnEmitter:
    """Numbers, coalesces and sends one turn's events.

    Sending is synchronous queueing: each event is queued on the replay buffer and then
    on the channel layer in one step, in `seq` order, with nothing awaited in between, so
    no lock or task is needed per event and order holds by construction. Deltas are not
    awaited at all (a failure is logged; the socket recovers from the buffer); `emit`
    awaits its event's outcome, so a status is sent before the turn's buffer expires.

    Where the buffer and the layer can queue a command with no outcome to await (Redis:
    `append_nowait`, `events.quiet_publisher`), deltas go out without a future each, and
    a failure calls back (`_append_failed`, `_publish_failed`); `close` then waits until
    Redis has answered everything queued before it (`settled`).
    """

    def __init__(
        self,
        *,
        session_id: str,
        turn_id: str,
        buffer: ReplayBuffer,
        start_seq: int = 0,
        coalesce_seconds: float = 0.04,
        load: LoopLoad | None = None,
    ) -> None:
        self.session_id = session_id
        self.turn_id = turn_id
        self.buffer = buffer
        self.seq = start_seq
        self.coalesce_seconds = coalesce_seconds
        # None: the running loop's (`loop_load()`), taken at the first delta.
        self._load = load
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._flush_handle: asyncio.TimerHandle | None = None
        self._last_flush = float("-inf")
        # Outcomes of deltas not yet known: `close` waits for them.
        self._in_flight: set[asyncio.Future[Any]] = set()
        # Every event so far (bounded), appends whose outcome is unknown, and the repair
        # under way with the first seq the pages may have missed.
        self._history: deque[dict[str, Any]] = deque(maxlen=MAX_HISTORY_EVENTS)
        self._appends: set[asyncio.Future[Any]] = set()
        self._repair: asyncio.Task[Any] | None = None
        self._missed_from: int | None = None
        # The buffer's and the layer's sends without a future, or None where either has
        # none (looked up at the first delta), and how many events went out that way: in
        # all, and before the last awaited event (whose outcome came after theirs).
        self._quiet: Any = _UNKNOWN
        self._quiet_sent = 0
        self._quiet_settled = 0

    async def emit(self, type_: str, **fields: Any) -> dict[str, Any]:
        self.flush_now()
        held = self._repair is not None
        event, stored, published = self._send(type_, fields)
        quiet_before = self._quiet_sent
        results = await asyncio.gather(stored, published, return_exceptions=True)
        for what, result in zip(_WHAT, results, strict=True):
            if isinstance(result, BaseException):
                self._log_failure(what, result)
        if not held:
            # Queued on the same connections after them: the quiet sends before this
            # event have their outcomes too.
            self._quiet_settled = max(self._quiet_settled, quiet_before)
        await self._wait_repair()
        return event

    def emit_soon(self, type_: str, **fields: Any) -> dict[str, Any]:
        """`emit` without waiting for the outcome (logged, and waited for by `close`):
        for an event nothing needs confirmed before going on, as a turn's `running`
        status before its model call. Order is kept all the same: what is sent after
        is numbered and queued after it."""
        self.flush_now()
        event, _stored, _published = self._send(type_, fields, unawaited=True)
        return event

    async def _wait_repair(self) -> None:
        repair = self._repair
        if repair is None:
            return
        with contextlib.suppress(TimeoutError, Exception):
            await asyncio.wait_for(asyncio.shield(repair), EMIT_REPAIR_WAIT_SECONDS)

    def delta(self, *, text: str | None = None, reasoning: str | None = None) -> None:
        """Buffer a delta. After a quiet spell it goes out at once; during a burst, at most
        one frame per window (a flush is scheduled for its end): `coalesce_seconds` with
        room, wider under load (`LoopLoad.window`)."""
        if text:
            self._text.append(text)
        if reasoning:
            self._reasoning.append(reasoning)
        if self._flush_handle is not None or not (self._text or self._reasoning):
            return
        loop = asyncio.get_running_loop()
        if self._load is None:
            self._load = loop_load()
        wait = self._last_flush + self._load.window(self.coalesce_seconds) - loop.time()
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
        self._send("delta", fields, unawaited=True)

    def _published_done(self, future: asyncio.Future[Any]) -> None:
        """An unawaited publish's outcome."""
        self._in_flight.discard(future)
        if not future.cancelled() and future.exception() is not None:
            self._log_failure(_WHAT[1], future.exception())

    async def flush(self) -> None:
        self.flush_now()

    async def close(self) -> None:
        self.flush_now()
        if self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)
        if self._quiet_sent > self._quiet_settled:
            sent = self._quiet_sent
            await asyncio.gather(
                self.buffer.settled(), events.published_settled(), return_exceptions=True
            )
            self._quiet_settled = sent
        await self._wait_repair()

    def _send(
        self, type_: str, fields: dict[str, Any], *, unawaited: bool = False
    ) -> tuple[dict[str, Any], Any, Any]:
        """Number the event, keep it, and queue its append and then its publish. Nobody
        awaits an `unawaited` event's outcome (a delta): it is logged here, and `close`
        waits for it. One callback per outcome, without a `partial` where it can: a
        streaming worker sends thousands of these a second."""
        self.seq += 1
        event = {"type": type_, "turn": self.turn_id, "seq": self.seq, **fields}
        self._history.append(event)
        if self._repair is not None:
            # Held back: the repair writes it, after everything before it.
            held = asyncio.get_running_loop().create_future()
            held.set_result(None)
            return event, held, held
        # The append is queued before the publish. They travel on separate connections, so
        # a publish may still overtake an append: a socket that sees a gap waits for the
        # buffer to catch up (`SessionConsumer._fill_gap`).
        if unawaited and self._send_quietly(event):
            return event, None, None
        stored = self._queue(self.buffer.append_soon, self.turn_id, self.seq, event)
        self._appends.add(stored)
        stored.add_done_callback(functools.partial(self._append_done, self.seq, unawaited))
        published = self._queue(events.publish_soon, self.session_id, event)
        if unawaited:
            self._in_flight.add(stored)
            self._in_flight.add(published)
            published.add_done_callback(self._published_done)
        return event, stored, published

    def _send_quietly(self, event: dict[str, Any]) -> bool:
        """Queue an unawaited event's append and publish with no future each, where the
        buffer and the layer can; False where they cannot."""
        if self._quiet is _UNKNOWN:
            append = getattr(self.buffer, "append_nowait", None)
            publish = events.quiet_publisher()
            self._quiet = None if append is None or publish is None else (append, publish)
        if self._quiet is None:
            return False
        append, publish = self._quiet
        seq = event["seq"]
        self._quiet_sent += 1
        try:
            append(self.turn_id, seq, event, functools.partial(self._append_failed, seq))
        except Exception as exc:  # e.g. no Redis connection could be made
            self._append_failed(seq, exc)
        try:
            publish(self.session_id, event, self._publish_failed)
        except Exception as exc:
            self._publish_failed(exc)
        return True

    def _append_failed(self, seq: int, error: BaseException) -> None:
        self._log_failure(_WHAT[0], error)
        self._start_repair(seq)

    def _publish_failed(self, error: BaseException) -> None:
        self._log_failure(_WHAT[1], error)

    def _append_done(self, seq: int, unawaited: bool, future: asyncio.Future[Any]) -> None:
        self._appends.discard(future)
        if unawaited:
            self._in_flight.discard(future)
        if future.cancelled() or future.exception() is None:
            return
        if unawaited:
            self._log_failure(_WHAT[0], future.exception())
        self._start_repair(seq)

    def _start_repair(self, seq: int) -> None:
        """A failed append of `seq`: repair the buffer from it (or from an earlier failure)."""
        if not hasattr(self.buffer, "rewrite"):
            return  # nothing to repair with: the socket recovers what the buffer has
        self._missed_from = seq if self._missed_from is None else min(self._missed_from, seq)
        if self._repair is None:
            self._repair = asyncio.ensure_future(self._repair_buffer())
            _REPAIRS.add(self._repair)
            self._repair.add_done_callback(_REPAIRS.discard)

    async def _repair_buffer(self) -> None:
        """Until Redis answers: rewrite the turn's buffer from the kept events, append
        what was held meanwhile, then publish again from the first event the pages may
        have missed. New events are held (`_send`) until this returns."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + REPAIR_GIVE_UP_SECONDS
        delay, most = REPAIR_BACKOFF_SECONDS
        try:
            # Appends queued before the failure land (or fail) before the rewrite.
            while self._appends:
                await asyncio.gather(*list(self._appends), return_exceptions=True)
            if self._quiet_sent:
                await self.buffer.settled()  # type: ignore[attr-defined]
            written = 0
            while True:
                todo = [e for e in self._history if e["seq"] > written]
                if not todo:
                    break
                try:
                    if written == 0:
                        last = todo[-1]
                        finished = (
                            last["type"] == "turn.status"
                            and last.get("status") in TERMINAL_STATUSES
                        )
                        await self.buffer.rewrite(self.turn_id, todo, finished=finished)  # type: ignore[attr-defined]
                    else:
                        await asyncio.gather(
                            *[self.buffer.append_soon(self.turn_id, e["seq"], e) for e in todo]
                        )
                    written = todo[-1]["seq"]
                except Exception:
                    written = 0  # Redis may have restarted again: write it all
                    if loop.time() >= give_up:
                        logger.error("replay buffer repair gave up for turn %s", self.turn_id)
                        return
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, most)
            first = self._missed_from or 1
            for event in [e for e in self._history if e["seq"] >= first]:
                with contextlib.suppress(Exception):
                    # Failures here are recovered by the pages from the repaired buffer.
                    events.publish_soon(self.session_id, event)
            logger.info("replay buffer of turn %s repaired from seq %s", self.turn_id, first)
        finally:
            self._missed_from = None
            self._repair = None

    def _queue(self, send: Any, *args: Any) -> asyncio.Future[Any]:
        try:
            return asyncio.ensure_future(send(*args))
        except Exception as exc:  # e.g. no running Redis client could be made
            failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed

    def _log_failure(self, what: str, error: BaseException) -> None:
        logger.warning("%s failed for turn %s", what, self.turn_id, exc_info=error)
