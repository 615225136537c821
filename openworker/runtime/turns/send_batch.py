"""A burst of sends on one Daphne is written together: one database call for the lot.

Each `send` was its own call on the sockets' one database thread: about ten round trips
(the checks, BEGIN, the turn, the message, the session's sequence and leaf, COMMIT), each
waiting for PostgreSQL and then for the GIL on a process busy relaying streams. A burst
of 500 sends took 14 s on a slow 2-core machine, and every turn of it started only after
its send was written (bench/stream_path.py, docs/PERFORMANCE.md). Each event loop has
one `SendBatcher`: while one call runs, the sends that arrive gather and go in the next
call together (`commands.turns_send`: a query per send for the model policy, and for the
lot two for the limits and one transaction of four statements). Nothing waits on a
timer: a lone send is written at once, as before.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass

from openworker.runtime.turns import commands
from openworker.runtime.turns.socket_db import socket_db
from sessions.models import Turn

# Sends per call: the statements' IN lists and VALUES stay a reasonable size, and a
# failed batch (each then written alone) stays small.
MAX_BATCH = 100


@dataclass
class _Waiting:
    request: commands.SendRequest
    future: asyncio.Future[Turn]


class SendBatcher:
    """One event loop's sends, gathered into batches while a call runs."""

    def __init__(self) -> None:
        self._waiting: list[_Waiting] = []
        self._draining: asyncio.Task[None] | None = None

    async def send(self, request: commands.SendRequest) -> Turn:
        """Write `request` as `commands.turn_send` would: its turn, or its TurnRefused."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Turn] = loop.create_future()
        self._waiting.append(_Waiting(request, future))
        if self._draining is None or self._draining.done():
            self._draining = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
            try:
                results = await socket_db(commands.turns_send)(
                    sends=[waiting.request for waiting in batch]
                )
            except Exception as exc:  # the call itself failed: each send fails with it
                for waiting in batch:
                    if not waiting.future.done():
                        waiting.future.set_exception(exc)
                continue
            for waiting, result in zip(batch, results, strict=True):
                if waiting.future.done():
                    continue  # its socket went away meanwhile; the turn runs as sent
                if isinstance(result, Exception):
                    waiting.future.set_exception(result)
                else:
                    waiting.future.set_result(result)


_batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SendBatcher] = (
    weakref.WeakKeyDictionary()
)


def send_batcher() -> SendBatcher:
    """The running event loop's send batcher."""
    loop = asyncio.get_running_loop()
    found = _batchers.get(loop)
    if found is None:
        found = _batchers[loop] = SendBatcher()
    return found
