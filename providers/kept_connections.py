"""Idle HTTP/1.1 connections kept across turns, one keeper per event loop.

A turn builds its own router and `Transport`, and each used to open a connection for
its reply and close it at the end: a TCP connect (and on a real provider a TLS
handshake) per turn, with httpx's client, transport and pool built around it. The
engine's loop runs hundreds of turns, so a finished turn's connection is kept here and
the next turn to the same address takes it. Over TLS that halves the CPU of a request
(`bench/http_requests.py`).

httpcore's `AsyncConnectionPool` cannot be the shared place: each request and each
response's close walks every connection it holds (is it closed, expired, idle, of this
origin). One pool shared by 50 concurrent turns cost 1,054-1,208 µs of CPU per request
against 647-748 with a pool per turn (loopback, two-token streams), and more with more
streams. Here a connection is in the keeper only while idle, filed under what it was
opened for (scheme, the vetted address it is pinned to, port, TLS name and context),
and taken back in O(1): the most recently used first (warm), the oldest dropped once
past `KEEPALIVE_SECONDS`.

The keeper is httpcore's pool interface (`handle_async_request`, `aclose`) for
`outbound.AsyncGuardedTransport`, which still checks and pins every request before it
gets here. A kept connection carries no credentials of its own: a request's headers are
its own, so sharing connections between users shares nothing but the socket, as every
provider SDK's client does.
"""

from __future__ import annotations

import asyncio
import collections
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any

import httpcore

from . import outbound
from .aio_backend import AsyncioBackend

# How long an idle connection is kept (httpx's own default keep-alive expiry). A server
# closes idle connections on its own clock; one it closed is seen readable (EOF) and
# dropped when taken, so this only bounds how long unused sockets stay open.
KEEPALIVE_SECONDS = 5.0
# Idle connections kept per address: a burst's worth of turns ending together.
MAX_IDLE_PER_TARGET = 512

# (scheme, pinned address, port, TLS name, TLS context): what a connection was opened
# for, all of which a request must share to use it.
Target = tuple[bytes, bytes, int | None, Any, Any]


def _target(request: httpcore.Request, ssl_context: Any) -> Target:
    url = request.url
    sni = request.extensions.get("sni_hostname")
    return (url.scheme, url.host, url.port, sni, ssl_context if url.scheme == b"https" else None)


class KeptConnections:
    """httpcore's pool interface over idle HTTP/1.1 connections kept per target."""

    def __init__(
        self,
        *,
        network_backend: httpcore.AsyncNetworkBackend | None = None,
        keepalive_seconds: float = KEEPALIVE_SECONDS,
        max_idle_per_target: int = MAX_IDLE_PER_TARGET,
    ) -> None:
        self._backend = network_backend or AsyncioBackend()
        self._keepalive = keepalive_seconds
        self._max_idle = max_idle_per_target
        # target -> (time it became idle, connection), oldest first.
        self._idle: dict[Target, collections.deque[tuple[float, httpcore.AsyncHTTPConnection]]]
        self._idle = {}
        self._closed = False

    def idle_count(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        ssl_context = outbound.default_ssl_context()
        target = _target(request, ssl_context)
        connection = await self._take(target)
        reused = connection is not None
        while True:
            if connection is None:
                connection = httpcore.AsyncHTTPConnection(
                    origin=request.url.origin,
                    ssl_context=ssl_context,
                    keepalive_expiry=self._keepalive,
                    http1=True,
                    http2=False,
                    network_backend=self._backend,
                )
            try:
                response = await connection.handle_async_request(request)
            except (httpcore.NetworkError, httpcore.RemoteProtocolError):
                await connection.aclose()
                if not reused:
                    raise
                # A kept connection the server closed as the request went out (its idle
                # timeout raced this request): nothing was answered, so the request goes
                # once more on a connection of its own, as a fresh one would have.
                connection, reused = None, False
                continue
            except BaseException:
                await connection.aclose()
                raise
            break
        response.stream = _KeptStream(response.stream, self, target, connection)
        return response

    async def _take(self, target: Target) -> httpcore.AsyncHTTPConnection | None:
        idle = self._idle.get(target)
        now = time.monotonic()
        while idle:
            since, connection = idle.pop()
            # Expired: EOF or junk from the server, or idle too long; not reusable.
            fresh = now - since <= self._keepalive and connection.is_idle()
            if fresh and not connection.has_expired():
                return connection
            await connection.aclose()
        return None

    async def _give_back(self, target: Target, connection: httpcore.AsyncHTTPConnection) -> None:
        """A response was closed: keep its connection when its exchange ended cleanly."""
        if self._closed or not connection.is_idle() or connection.has_expired():
            await connection.aclose()
            return
        idle = self._idle.get(target)
        if idle is None:
            idle = self._idle[target] = collections.deque()
        now = time.monotonic()
        stale: list[httpcore.AsyncHTTPConnection] = []
        while idle and (now - idle[0][0] > self._keepalive or len(idle) >= self._max_idle):
            stale.append(idle.popleft()[1])
        idle.append((now, connection))
        for old in stale:
            await old.aclose()

    async def aclose(self) -> None:
        """Close every idle connection; connections in use close with their response."""
        self._closed = True
        idle, self._idle = self._idle, {}
        for entries in idle.values():
            for _since, connection in entries:
                await connection.aclose()

    async def __aenter__(self) -> KeptConnections:
        return self

    async def __aexit__(self, *args: Any) -> None:
        return None


class _KeptStream:
    """A response body that gives its connection back once closed. Named as httpcore's
    `PoolByteStream` is (`_stream`, `_closed`): `transport._http11_body` reads through
    both to the connection's h11 state."""

    def __init__(
        self,
        stream: Any,
        keeper: KeptConnections,
        target: Target,
        connection: httpcore.AsyncHTTPConnection,
    ) -> None:
        self._stream = stream
        self._keeper = keeper
        self._target = target
        self._connection = connection
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._stream:
            yield part

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._stream.aclose()
        finally:
            await self._keeper._give_back(self._target, self._connection)


_keepers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, KeptConnections]
_keepers = weakref.WeakKeyDictionary()


def loop_keeper() -> KeptConnections:
    """The running event loop's keeper (connections belong to the loop they were opened
    on), made on first use."""
    loop = asyncio.get_running_loop()
    keeper = _keepers.get(loop)
    if keeper is None or keeper._closed:
        keeper = _keepers[loop] = KeptConnections()
    return keeper


async def aclose_loop_keeper() -> None:
    """Close the running loop's kept connections (a serving loop's shutdown)."""
    keeper = _keepers.pop(asyncio.get_running_loop(), None)
    if keeper is not None:
        await keeper.aclose()
