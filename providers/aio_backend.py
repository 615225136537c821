"""An httpcore network backend on plain asyncio transports, for the event-loop transport.

httpcore's default async backend goes through anyio, whose socket stream pauses the
asyncio transport after every chunk and resumes it on the next read: two `epoll_ctl`
calls per read. A provider stream is one small read per token, and a worker reads
hundreds of them at once from one loop; those syscalls were the largest single cost of
the worker in bench/stream_path.py. Here the transport keeps reading into the
connection's own buffer (flow control only past its limit), so a read is a hand-over of
what arrived.

The receive side is a protocol of its own, not `asyncio.StreamReader`: a read that has
to wait awaits one future, and its timeout is a deadline the connection's single timer
checks, not a timer scheduled and cancelled per read. `StreamReader.read` under
`asyncio.timeout` cost a heap push, a cancel and two context managers per token (about
a tenth of reading one, py-spy of bench/stream_path.py --mode embedded).

Errors and timeouts are httpcore's own exceptions, which httpx maps as usual.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore

# Read buffer before the transport is paused (asyncio's flow control).
STREAM_LIMIT = 256 * 1024
# Writes held back until the stream reads (or this much is held): httpcore writes a
# request's head and its body separately, two sends a request where one does.
CORK_LIMIT = 64 * 1024


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection's receive buffer and write flow control.

    What arrives is kept in order until read; bytes that came before a reset are handed
    over before the error (the blocking backend does the same: the partial reply keeps
    them). A read waits on one future at a time; `arm` keeps one timer per connection
    for the reads' deadlines."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self.eof = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._reading_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._writing_paused = False
        self.closed: asyncio.Future[None] = loop.create_future()
        # Written, not yet handed to the transport (`AsyncioStream.write`).
        self.held: list[bytes] = []
        self.held_size = 0

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Any loop's transport (uvloop's are not `asyncio.Transport` subclasses).
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        self._wake()
        if self._size > STREAM_LIMIT and not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # nothing more is written on an HTTP connection the peer ended

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            self.eof = True
        else:
            self.error = exc
        self._wake()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # -- reading

    def take(self, max_bytes: int) -> bytes:
        chunk = self._chunks.popleft()
        if len(chunk) > max_bytes:
            self._chunks.appendleft(chunk[max_bytes:])
            chunk = chunk[:max_bytes]
        self._size -= len(chunk)
        if self._reading_paused and self._size <= STREAM_LIMIT // 2 and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        return chunk

    @property
    def buffered(self) -> bool:
        return bool(self._chunks)

    def arm(self, timeout: float) -> None:
        """The waiting read times out `timeout` seconds from now."""
        self._deadline = self.loop.time() + timeout
        if self._timer is not None and self._timer.when() > self._deadline:
            self._timer.cancel()  # a shorter timeout than the last request's
            self._timer = None
        if self._timer is None:
            self._timer = self.loop.call_at(self._deadline, self._expire)

    def _expire(self) -> None:
        self._timer = None
        waiter = self.waiter
        if waiter is None or waiter.done():
            return  # no read waits: the next one arms again
        if self.loop.time() < self._deadline:
            self._timer = self.loop.call_at(self._deadline, self._expire)
            return
        self.waiter = None
        waiter.set_exception(httpcore.ReadTimeout("timed out reading"))

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # -- writing

    def must_wait_to_write(self) -> bool:
        """Whether `drain` would wait or raise: the transport's buffer is full, or the
        connection is gone. Checked first so that a write the socket takes at once (every
        request of a turn) arms no timeout: `asyncio.timeout` per write was a timer
        scheduled and cancelled twice per provider request."""
        return self._writing_paused or self.error is not None or self.closed.done()

    async def drain(self) -> None:
        """Wait while the transport's write buffer is full; raise if the connection is
        gone (as `StreamWriter.drain`)."""
        if self._writing_paused and not self.closed.done():
            self._drain = self.loop.create_future()
            await self._drain
        if self.error is not None:
            raise ConnectionResetError(str(self.error)) from self.error
        if self.closed.done():
            raise ConnectionResetError("Connection lost")


class AsyncioStream(httpcore.AsyncNetworkStream):
    def __init__(self, connection: _Connection) -> None:
        self._connection = connection

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        connection = self._connection
        if connection.held:
            self._send_held()  # the request is whole: it goes out before its reply is read
        while True:
            if connection.buffered:
                return connection.take(max_bytes)
            if connection.error is not None:
                error = connection.error
                raise httpcore.ReadError(str(error) or type(error).__name__) from error
            if connection.eof:
                return b""
            waiter = connection.waiter = connection.loop.create_future()
            if timeout is not None:
                connection.arm(timeout)
            try:
                await waiter
            finally:
                if connection.waiter is waiter:
                    connection.waiter = None

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        """Hold `buffer` until the stream reads, the loop's next turn or CORK_LIMIT bytes
        held, then send what is held in one write: a request's head and body (httpcore
        writes them separately, then reads) leave in one send, not two system calls."""
        if not buffer:
            return
        connection = self._connection
        if not connection.held:
            connection.loop.call_soon(self._send_held_soon)
        connection.held.append(buffer)
        connection.held_size += len(buffer)
        if connection.held_size < CORK_LIMIT:
            return
        try:
            self._send_held()
            if not connection.must_wait_to_write():
                return  # the socket took it: no timer to set
            async with asyncio.timeout(timeout):
                await connection.drain()
        except TimeoutError:
            raise httpcore.WriteTimeout("timed out writing") from None
        except OSError as exc:
            raise httpcore.WriteError(str(exc) or type(exc).__name__) from exc

    def _send_held_soon(self) -> None:
        """What is still held on the loop's next turn (a write no read followed yet)."""
        if self._connection.held:
            with contextlib.suppress(httpcore.WriteError):  # the next read says it
                self._send_held()

    def _send_held(self) -> None:
        connection = self._connection
        held = connection.held
        data = held[0] if len(held) == 1 else b"".join(held)
        held.clear()
        connection.held_size = 0
        transport = connection.transport
        assert transport is not None
        try:
            transport.write(data)
        except OSError as exc:
            raise httpcore.WriteError(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        connection = self._connection
        connection.held.clear()  # a request never read for: nothing waits on it
        connection.held_size = 0
        if connection.transport is not None:
            connection.transport.close()
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            async with asyncio.timeout(1.0):  # a TLS close_notify the peer never answers
                await asyncio.shield(connection.closed)

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        connection = self._connection
        assert connection.transport is not None
        try:
            async with asyncio.timeout(timeout):
                tls = await connection.loop.start_tls(
                    connection.transport, connection, ssl_context,
                    server_hostname=server_hostname,
                )  # fmt: skip
        except TimeoutError:
            await self.aclose()
            raise httpcore.ConnectTimeout("timed out in the TLS handshake") from None
        except (OSError, ssl.SSLError) as exc:
            await self.aclose()
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        connection.transport = tls  # type: ignore[assignment]
        return self

    def get_extra_info(self, info: str) -> Any:
        transport = self._connection.transport
        assert transport is not None
        if info == "ssl_object":
            return transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return transport.get_extra_info("sockname")
        if info == "server_addr":
            return transport.get_extra_info("peername")
        if info == "socket":
            return transport.get_extra_info("socket")
        if info == "is_readable":
            # An idle pooled connection that is readable was closed (or sent junk) by
            # the server: httpcore then opens a new one instead of reusing it. The
            # protocol reads all the time (paused only with bytes held), so what the
            # socket had is already here: its end, its error or its bytes. No `select`
            # per check: that was a system call per request taken and given back (a
            # twentieth of the worker's loop at K = 1000), and over TLS a readable
            # socket may hold only a session ticket. A close that races the check is
            # the keeper's retry (`kept_connections`), as it was with `select`.
            connection = self._connection
            return connection.eof or connection.error is not None or connection.buffered
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                loop = asyncio.get_running_loop()
                transport, connection = await loop.create_connection(
                    lambda: _Connection(loop),
                    host,
                    port,
                    local_addr=(local_address, 0) if local_address else None,
                )
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"timed out connecting to {host}") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        sock = transport.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return AsyncioStream(connection)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not used for provider requests")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
