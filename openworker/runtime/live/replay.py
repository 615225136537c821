"""Per-turn replay buffers: what a turn has emitted so far, by sequence number.

The channel layer is at-most-once (channels_redis drops on capacity) and a reloading
browser misses everything sent while it was away, so every event is also appended here
and a client resumes with "everything after seq N". After a turn ends its buffer expires;
the transcript in the database is authoritative from then on.

Distributed mode: one Redis Stream per turn whose entry ids are `<seq>-0`, so "after N"
is a single XRANGE. Embedded mode: a dict in the Daphne process.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from typing import Any, Protocol

from django.conf import settings

from openworker.compact_json import dumps
from openworker.runtime.live.redis_batch import OnError, batcher_for, client_for

# Long enough for a user to come back to a tab after the turn ended; the transcript
# takes over after that.
FINISHED_TTL_SECONDS = 600
# A turn still running keeps its buffer this long past its last event (a stalled turn
# is swept as interrupted long before).
RUNNING_TTL_SECONDS = 6 * 3600
# A running turn's buffer TTL is renewed with every status event and every this many
# deltas (not with each: one command fewer per token).
REFRESH_TTL_EVERY = 32
# Bound one turn's buffer: a runaway turn cannot fill Redis.
MAX_EVENTS_PER_TURN = 50_000

# Embedded mode: expired buffers are looked for at most this often, not on every append
# (a walk over every turn's buffer, finished ones kept FINISHED_TTL_SECONDS, per event:
# with 200 turns streaming, a few per cent of Daphne's loop; a second late is nothing
# against TTLs of minutes).
SWEEP_SECONDS = 1.0


class ReplayBuffer(Protocol):
    async def append(self, turn_id: str, seq: int, event: dict[str, Any]) -> None: ...
    def append_soon(self, turn_id: str, seq: int, event: dict[str, Any]) -> Awaitable[Any]:
        """Queue the append now (in call order); await the result for its outcome."""
        ...

    def append_nowait(
        self, turn_id: str, seq: int, event: dict[str, Any], on_error: OnError
    ) -> None:
        """Queue the append now (in call order); `on_error(error)` if it fails."""
        ...

    async def settled(self) -> None:
        """Return once every append queued before has its outcome."""
        ...

    async def read_after(self, turn_id: str, after: int) -> list[dict[str, Any]]: ...
    async def last_seq(self, turn_id: str) -> int: ...
    async def finish(self, turn_id: str) -> None: ...
    async def rewrite(self, turn_id: str, events: list[dict[str, Any]], *, finished: bool) -> None:
        """Replace the turn's buffer with `events` (in seq order) at once: the repair
        after a failed append (a restarted Redis lost what it had)."""
        ...


class MemoryReplayBuffer:
    def __init__(self) -> None:
        self._events: dict[str, list[dict[str, Any]]] = {}
        self._expires: dict[str, float] = {}
        self._next_sweep = 0.0

    def _sweep(self) -> None:
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_SECONDS
        for turn_id in [t for t, at in self._expires.items() if at < now]:
            self._events.pop(turn_id, None)
            self._expires.pop(turn_id, None)

    def append_soon(self, turn_id: str, seq: int, event: dict[str, Any]) -> Awaitable[Any]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._append(turn_id, event)
        done.set_result(None)
        return done

    def append_nowait(
        self, turn_id: str, seq: int, event: dict[str, Any], on_error: OnError
    ) -> None:
        self._append(turn_id, event)

    async def settled(self) -> None:
        return  # every append is done when it returns

    async def append(self, turn_id: str, seq: int, event: dict[str, Any]) -> None:
        self._append(turn_id, event)

    def _append(self, turn_id: str, event: dict[str, Any]) -> None:
        self._sweep()
        events = self._events.setdefault(turn_id, [])
        events.append(event)
        if len(events) > MAX_EVENTS_PER_TURN:
            del events[: len(events) - MAX_EVENTS_PER_TURN]
        self._expires[turn_id] = time.monotonic() + RUNNING_TTL_SECONDS

    async def read_after(self, turn_id: str, after: int) -> list[dict[str, Any]]:
        return [e for e in self._events.get(turn_id, ()) if e["seq"] > after]

    async def last_seq(self, turn_id: str) -> int:
        events = self._events.get(turn_id)
        return events[-1]["seq"] if events else 0

    async def rewrite(self, turn_id: str, events: list[dict[str, Any]], *, finished: bool) -> None:
        self._events[turn_id] = list(events)[-MAX_EVENTS_PER_TURN:]
        ttl = FINISHED_TTL_SECONDS if finished else RUNNING_TTL_SECONDS
        self._expires[turn_id] = time.monotonic() + ttl

    async def finish(self, turn_id: str) -> None:
        if turn_id in self._events:
            self._expires[turn_id] = time.monotonic() + FINISHED_TTL_SECONDS


class RedisReplayBuffer:
    """Redis Streams, through the event loop's shared client and batcher
    (`openworker.runtime.live.redis_batch`: an asyncio connection must not cross loops)."""

    def __init__(self, url: str, *, prefix: str = "openworker") -> None:
        self.url = url
        self.prefix = prefix

    def _client(self) -> Any:
        return client_for(self.url)

    def _key(self, turn_id: str) -> str:
        return f"{self.prefix}:turn:{turn_id}:events"

    def _commands(self, turn_id: str, seq: int, event: dict[str, Any]) -> list[tuple[Any, ...]]:
        key = self._key(turn_id)
        added = ("XADD", key, "MAXLEN", "~", MAX_EVENTS_PER_TURN, f"{seq}-0", "e", dumps(event))
        if event.get("type") == "delta" and seq % REFRESH_TTL_EVERY != 1:
            return [added]  # the TTL set a few events ago still has hours to run
        return [added, ("EXPIRE", key, RUNNING_TTL_SECONDS)]

    def append_soon(self, turn_id: str, seq: int, event: dict[str, Any]) -> Awaitable[Any]:
        # Through the loop's batcher: hundreds of turns' appends share round trips, and
        # an append queued before a publish reaches Redis first.
        batcher = batcher_for(self.url)
        sent = [batcher.submit(*command) for command in self._commands(turn_id, seq, event)]
        return sent[0] if len(sent) == 1 else asyncio.gather(*sent)

    def append_nowait(
        self, turn_id: str, seq: int, event: dict[str, Any], on_error: OnError
    ) -> None:
        batcher = batcher_for(self.url)
        for command in self._commands(turn_id, seq, event):
            batcher.submit_nowait(on_error, *command)

    async def settled(self) -> None:
        await batcher_for(self.url).settled()

    async def append(self, turn_id: str, seq: int, event: dict[str, Any]) -> None:
        await self.append_soon(turn_id, seq, event)

    async def read_after(self, turn_id: str, after: int) -> list[dict[str, Any]]:
        entries = await self._client().xrange(self._key(turn_id), min=f"{after + 1}-0", max="+")
        return [json.loads(fields[b"e"]) for _, fields in entries]

    async def last_seq(self, turn_id: str) -> int:
        # Through the batcher, like the appends: a burst of turn starts asks in the same
        # round trips as the streams' writes, where redis-py's pool opened a connection
        # per concurrent ask and took a dozen loop hops each (half a second of a turn's
        # start at K = 1000, bench/stream_path.py's phases). After this loop's appends,
        # so it counts them.
        entries = await batcher_for(self.url).call(
            "XREVRANGE", self._key(turn_id), "+", "-", "COUNT", 1
        )
        if not entries:
            return 0
        entry_id = entries[0][0]
        entry_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        return int(entry_id.split("-")[0])

    async def finish(self, turn_id: str) -> None:
        await batcher_for(self.url).call("EXPIRE", self._key(turn_id), FINISHED_TTL_SECONDS)

    async def rewrite(self, turn_id: str, events: list[dict[str, Any]], *, finished: bool) -> None:
        # One MULTI: a reader sees the old stream or the whole new one, never half.
        key = self._key(turn_id)
        pipe = self._client().pipeline(transaction=True)
        pipe.delete(key)
        for event in events:
            payload = dumps(event)
            pipe.xadd(key, {"e": payload}, id=f"{event['seq']}-0")
        pipe.expire(key, FINISHED_TTL_SECONDS if finished else RUNNING_TTL_SECONDS)
        await pipe.execute()


_buffer: ReplayBuffer | None = None


def get_replay_buffer() -> ReplayBuffer:
    """The process's buffer for the configured run mode."""
    global _buffer
    if _buffer is None:
        if settings.DISTRIBUTED:
            _buffer = RedisReplayBuffer(settings.REDIS_URL)
        else:
            _buffer = MemoryReplayBuffer()
    return _buffer
