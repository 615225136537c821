"""One Redis pub/sub connection per event loop, read with hiredis.

The channel layer's receiving side: a Daphne process streaming to a thousand sockets reads
thousands of messages a second here. redis-py's `PubSub` made a dict per message through
several layers of calls, and sent each SUBSCRIBE behind a lock; reading and subscribing
were about a tenth of Daphne's CPU at K = 1000 (py-spy of bench/stream_path.py,
docs/PERFORMANCE.md session 23). Here the replies are parsed by hiredis as they arrive
and each message goes straight to `deliver(channel, data)`; SUBSCRIBE and UNSUBSCRIBE
are written at once, without waiting for Redis to confirm them (Redis applies them in the
order written, as redis-py's did).

A lost connection (Redis restarting) is made again, every channel subscribed again, after
a back-off; what was published meanwhile is lost. Delivery is at most once, as with
every channel layer: the streaming path recovers from the replay buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from openworker.runtime.live.redis_batch import READ_BYTES, RespPipe, pack

logger = logging.getLogger(__name__)

# After a lost connection, wait this long before connecting again.
RECONNECT_SECONDS = 0.5
# Channels per SUBSCRIBE written when (re)connecting.
SUBSCRIBE_CHUNK = 500

_MESSAGE = b"message"


class Subscription:
    """The channels this loop listens to, on one connection read by one task."""

    def __init__(self, url: str, deliver: Callable[[bytes, bytes], None]) -> None:
        self.pipe = RespPipe(url)
        self.deliver = deliver
        self.channels: set[str] = set()
        self._writer: asyncio.StreamWriter | None = None
        self._connecting: asyncio.Future[None] | None = None
        self._reader_task: asyncio.Task[None] | None = None

    async def subscribe(self, channel: str) -> None:
        """Listen to `channel` from now on: SUBSCRIBE written (connecting first if need
        be; `RedisConnectionError` if Redis cannot be reached)."""
        if channel in self.channels:
            return
        self.channels.add(channel)
        if self._writer is not None:
            self._writer.write(pack(("SUBSCRIBE", channel)))
            return
        try:
            await self._connected()  # subscribes to every channel wanted, this one too
        except BaseException:
            self.channels.discard(channel)
            raise

    def unsubscribe(self, channel: str) -> None:
        if channel not in self.channels:
            return
        self.channels.discard(channel)
        if self._writer is not None:
            self._writer.write(pack(("UNSUBSCRIBE", channel)))

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
        assert self._writer is not None
        pending = list(channels)
        for start in range(0, len(pending), SUBSCRIBE_CHUNK):
            self._writer.write(pack(("SUBSCRIBE", *pending[start : start + SUBSCRIBE_CHUNK])))

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
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("channel layer reader failed; reconnecting", exc_info=True)
            self._writer = None
            self.pipe.drop()
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
        await self.pipe.aclose()
