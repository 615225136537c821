"""Twisted's asyncio reactor for the web process, with writes flushed without epoll.

Twisted never writes a socket from `transport.write`: it buffers the bytes and registers
the socket for writability (`addWriter`: an `epoll_ctl`), the loop reports it writable on
its next turn, `doWrite` sends, and with the buffer empty the socket is unregistered
(`removeWriter`: another `epoll_ctl`). For a websocket frame a token, that is three
system calls and a loop turn per frame where one `send` would do: in py-spy profiles of
Daphne under `bench/stream_path.py` (K = 1000), `addWriter` and `removeWriter` alone were
11 % of its samples, and `doWrite`'s dispatch as much again.

`FlushingReactor` keeps Twisted's buffering and its write path, and changes only when
`doWrite` runs: a socket that starts writing is queued, and the queue is flushed by one
`call_soon` callback, on the loop's next turn (what Twisted waited for epoll to say). The
writes a turn made to a socket still go out as one `send`. A socket that took only part
of its buffer is registered with epoll as before, and from then on Twisted's own path
runs until its buffer empties; a failed `send` or a finished `loseConnection` goes
through the reactor's own `_readOrWrite`, so a connection is lost exactly as before.
This is what asyncio's own transports do (`write` sends at once while nothing waits).

`install()` is called by `openworker.web_server` before Daphne is imported: Daphne keeps
an asyncio reactor it finds installed, and reads its loop from the reactor.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from twisted.internet.asyncioreactor import AsyncioSelectorReactor
from twisted.python.log import callWithLogger


class FlushingReactor(AsyncioSelectorReactor):
    """`AsyncioSelectorReactor` whose writers are flushed on the loop's next turn, and
    registered with the selector only when the socket would block (see the module)."""

    def __init__(self, eventloop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(eventloop)
        # Writers to flush, in the order they started writing (a dict: an ordered set).
        self._to_flush: dict[Any, None] = {}
        self._flush_scheduled = False

    def addWriter(self, writer: Any) -> None:
        if (
            writer in self._to_flush
            or writer in self._writers
            or writer in self._continuousPolling._writers
        ):
            return
        self._to_flush[writer] = None
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._asyncioEventloop.call_soon(self._flush)

    def removeWriter(self, writer: Any) -> None:
        # `doWrite` calls this (`stopWriting`) once the buffer is empty; so does a lost
        # connection. Either way the writer leaves the queue.
        self._to_flush.pop(writer, None)
        super().removeWriter(writer)

    def getWriters(self) -> list[Any]:
        return super().getWriters() + list(self._to_flush)

    def removeAll(self) -> list[Any]:
        # A queued writer is a connection, so also a reader: the readers' list has it.
        self._to_flush.clear()
        return super().removeAll()

    def _flush(self) -> None:
        self._flush_scheduled = False
        for writer in list(self._to_flush):
            if writer not in self._to_flush:
                continue  # stopped writing (its connection was lost) since it was queued
            callWithLogger(writer, self._readOrWrite, writer, False)
            if writer in self._to_flush:
                # Still writing: the socket took only part of the buffer. Wait for epoll
                # to say it takes more, as Twisted always does.
                del self._to_flush[writer]
                if writer.fileno() != -1:
                    super().addWriter(writer)


def install() -> FlushingReactor:
    """Install a `FlushingReactor` on a new event loop of the current policy, as Daphne
    would have built its own (with its `ASGI_THREADS` executor)."""
    from twisted.internet.main import installReactor

    loop = asyncio.new_event_loop()
    if "ASGI_THREADS" in os.environ:
        loop.set_default_executor(ThreadPoolExecutor(max_workers=int(os.environ["ASGI_THREADS"])))
    reactor = FlushingReactor(loop)
    installReactor(reactor)
    return reactor
