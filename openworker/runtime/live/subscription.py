"""One Redis pub/sub connection per event loop, read with hiredis.

The channel layer's receiving side: a Daphne process streaming to a thousand sockets reads
thousands of messages a second here. redis-py's `PubSub` made a dict per message through
several layers of calls, and sent each SUBSCRIBE behind a lock; reading and subscribing
were about a tenth of Daphne's CPU at K = 1000 (py-spy of bench/stream_path.py,
docs/PERFORMANCE.md session 23). Here the replies are parsed by hiredis as they arrive
and each message goes straight to `deliver(channel, data)`. SUBSCRIBE and UNSUBSCRIBE
are written at once, without a lock or a round trip between them (Redis applies them in
the order written); a caller who is about to publish to the channel, from this process or
another, waits for `confirmed(channel)`: until Redis has applied the SUBSCRIBE, a PUBLISH
on another connection can overtake it and is lost (/healthz's round trip failed about once
in a thousand with Redis busy; CI saw two 503s out of 120 under load).

A lost connection (Redis restarting) is made again, every channel subscribed again, after
a back-off; what was published meanwhile is lost. Delivery is at most once, as with
every channel layer: the streaming path recovers from the replay buffer.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable, Iterable

from openworker.runtime.live.redis_batch import READ_BYTES, RespPipe, pack

logger = logging.getLogger(__name__)

# After a lost connection, wait this long before connecting again.
RECONNECT_SECONDS = 0.5
# Channels per SUBSCRIBE written when (re)connecting.
SUBSCRIBE_CHUNK = 500
# `confirmed` waits this long at most (Redis down and not back yet): then the caller goes
# on, as it did before confirmations were awaited, and delivery stays at most once.
CONFIRM_SECONDS = 5.0

_MESSAGE = b"message"
# The replies to SUBSCRIBE and UNSUBSCRIBE: one per channel named, in the order written.
_CONFIRMATIONS = (b"subscribe", b"unsubscribe")

# One reply awaited on the connection: the channel it names, and the future of the
# SUBSCRIBE it confirms (None for an UNSUBSCRIBE).
_Awaited = tuple[str, asyncio.Future[None] | None]


class Subscription:
    """The channels this loop listens to, on one connection read by one task."""

    def __init__(self, url: str, deliver: Callable[[bytes, bytes], None]) -> None:
        self.pipe = RespPipe(url)
        self.deliver = deliver
        self.channels: set[str] = set()
        self._writer: asyncio.StreamWriter | None = None
        self._connecting: asyncio.Future[None] | None = None
        self._reader_task: asyncio.Task[None] | None = None
        # The (un)subscribe replies awaited on this connection, in the order written, one
        # per channel; per channel, the future of its latest SUBSCRIBE not yet confirmed;
        # and the channels whose SUBSCRIBE was lost with a connection (the one written
        # again on the next connection confirms the same future).
        self._awaited: collections.deque[_Awaited] = collections.deque()
        self._unconfirmed: dict[str, asyncio.Future[None]] = {}
        self._orphaned: set[str] = set()

    async def subscribe(self, channel: str) -> None:
        """Listen to `channel` from now on: SUBSCRIBE written (connecting first if need
        be; `RedisConnectionError` if Redis cannot be reached). `confirmed(channel)` says
        when Redis has applied it."""
        if channel in self.channels:
            return
        self.channels.add(channel)
        if self._writer is not None:
            self._write("SUBSCRIBE", [channel])
            return
        try:
            await self._connected()  # subscribes to every channel wanted, this one too
        except BaseException:
            self.channels.discard(channel)
            self._unconfirmed.pop(channel, None)
            raise

    async def confirmed(self, channel: str) -> None:
        """Return once Redis has applied this loop's latest SUBSCRIBE of `channel` (at
        once if it has), or after `CONFIRM_SECONDS`."""
        pending = self._unconfirmed.get(channel)
        if pending is None or pending.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(pending), CONFIRM_SECONDS)
        except TimeoutError:
            logger.warning("Redis has not confirmed a subscription yet; going on")

    def unsubscribe(self, channel: str) -> None:
        if channel not in self.channels:
            return
        self.channels.discard(channel)
        if self._writer is not None:
            self._write("UNSUBSCRIBE", [channel])

    def _write(self, command: str, channels: list[str]) -> None:
        """Write one (UN)SUBSCRIBE, and await its replies, one per channel."""
        assert self._writer is not None
        loop = asyncio.get_running_loop()
        for channel in channels:
            if command == "UNSUBSCRIBE":
                self._awaited.append((channel, None))
                continue
            pending = self._unconfirmed.get(channel)
            if pending is None or channel not in self._orphaned:
                pending = self._unconfirmed[channel] = loop.create_future()
            self._orphaned.discard(channel)
            self._awaited.append((channel, pending))
        self._writer.write(pack((command, *channels)))

    def _confirm(self) -> None:
        """One (un)subscribe reply came: the oldest awaited."""
        channel, future = self._awaited.popleft()
        if future is None:
            return
        if not future.done():
            future.set_result(None)
        if self._unconfirmed.get(channel) is future:
            del self._unconfirmed[channel]

    def _forget_confirmations(self) -> None:
        """The connection is gone, and the replies awaited on it will not come: the
        SUBSCRIBEs written again on the next one confirm what is still wanted."""
        self._awaited.clear()
        for channel in [c for c in self._unconfirmed if c not in self.channels]:
            future = self._unconfirmed.pop(channel)
            if not future.done():
                future.set_result(None)  # unsubscribed meanwhile: nobody needs it
        self._orphaned = set(self._unconfirmed)

    async def _connected(self) -> None:
        """Connect (once, whoever asks), subscribe to every channel wanted, start the
        reader."""
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        connecting = self._connecting
        try:
            await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None

    async def _connect(self) -> None:
        reader, writer, parser = await self.pipe.opened()
        self._writer = writer
        self._write_subscribes(self.channels)
        if self._reader_task is None:
            self._reader_task = asyncio.ensure_future(self._read(reader, parser))

    def _write_subscribes(self, channels: Iterable[str]) -> None:
        pending = list(channels)
        for start in range(0, len(pending), SUBSCRIBE_CHUNK):
            self._write("SUBSCRIBE", pending[start : start + SUBSCRIBE_CHUNK])

    async def _read(self, reader: asyncio.StreamReader, parser: object) -> None:
        """Hand every message to `deliver` until cancelled; on a lost connection, connect
        again after RECONNECT_SECONDS and go on."""
        deliver = self.deliver
        while True:
            try:
                while True:
                    data = await reader.read(READ_BYTES)
                    if not data:
                        raise EOFError("Redis closed the connection")
                    parser.feed(data)  # type: ignore[attr-defined]
                    while (reply := parser.gets()) is not False:  # type: ignore[attr-defined]
                        if reply[0] == _MESSAGE:
                            deliver(reply[1], reply[2])
                        elif reply[0] in _CONFIRMATIONS:
                            self._confirm()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("channel layer reader failed; reconnecting", exc_info=True)
            self._writer = None
            self.pipe.drop()
            self._forget_confirmations()
            while True:
                await asyncio.sleep(RECONNECT_SECONDS)
                try:
                    reader, writer, parser = await self.pipe.opened()
                except Exception:
                    logger.warning("channel layer reader cannot reconnect yet", exc_info=True)
                    continue
                self._writer = writer
                self._write_subscribes(self.channels)
                break

    async def aclose(self) -> None:
        task, self._reader_task = self._reader_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._connecting is not None:
            self._connecting.cancel()
            self._connecting = None
        self._writer = None
        self._awaited.clear()
        for future in self._unconfirmed.values():
            future.cancel()
        self._unconfirmed.clear()
        self._orphaned.clear()
        await self.pipe.aclose()
