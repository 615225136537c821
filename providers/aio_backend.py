"""An httpcore network backend on plain asyncio streams, for the event-loop transport.

httpcore's default async backend goes through anyio, whose socket stream pauses the
asyncio transport after every chunk and resumes it on the next read: two `epoll_ctl`
calls per read. A provider stream is one small read per token, and a worker reads
hundreds of them at once from one loop; those syscalls were the largest single cost of
the worker in bench/stream_path.py. An `asyncio.StreamReader` keeps reading into its
buffer (flow control only past its limit), so a read is a buffer slice.

Errors and timeouts are httpcore's own exceptions, which httpx maps as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore

# Read buffer before the transport is paused (asyncio's flow control).
STREAM_LIMIT = 256 * 1024


class AsyncioStream(httpcore.AsyncNetworkStream):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            if getattr(self._reader, "_buffer", None):
                # Bytes already buffered: the read returns without waiting, so no
                # timeout needs arming (a timer scheduled and cancelled per read was a
                # visible share of a token-sized read's cost).
                return await self._reader.read(max_bytes)
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError:
            raise httpcore.ReadTimeout("timed out reading") from None
        except OSError as exc:
            # StreamReader raises a reset before handing over what had already arrived;
            # the blocking backend returns those bytes first (the partial reply keeps
            # them), and so does this one: the error comes on the next read.
            pending = _take_buffered(self._reader, max_bytes)
            if pending:
                return pending
            raise httpcore.ReadError(str(exc) or type(exc).__name__) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            async with asyncio.timeout(timeout):
                self._writer.write(buffer)
                await self._writer.drain()
        except TimeoutError:
            raise httpcore.WriteTimeout("timed out writing") from None
        except OSError as exc:
            raise httpcore.WriteError(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            async with asyncio.timeout(1.0):  # a TLS close_notify the peer never answers
                await self._writer.wait_closed()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except TimeoutError:
            await self.aclose()
            raise httpcore.ConnectTimeout("timed out in the TLS handshake") from None
        except (OSError, ssl.SSLError) as exc:
            await self.aclose()
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        return self

    def get_extra_info(self, info: str) -> Any:
        transport = self._writer.transport
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
            # the server: httpcore then opens a new one instead of reusing it.
            return self._reader.at_eof() or _fd_readable(transport.get_extra_info("socket"))
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
                reader, writer = await asyncio.open_connection(
                    host,
                    port,
                    limit=STREAM_LIMIT,
                    local_addr=(local_address, 0) if local_address else None,
                )
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"timed out connecting to {host}") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        sock = writer.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return AsyncioStream(reader, writer)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not used for provider requests")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def _take_buffered(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    buffer = getattr(reader, "_buffer", None)  # CPython's StreamReader keeps a bytearray
    if not buffer:
        return b""
    data = bytes(buffer[:max_bytes])
    del buffer[:max_bytes]
    return data


def _fd_readable(sock: Any) -> bool:
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True  # closed under us
    return bool(readable)
