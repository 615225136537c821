"""Heartbeats of every turn a process runs, in one database call per beat.

A running turn holds a lease the sweeper (`openworker.runtime.turns.watchdog`) expires when its
heartbeat stops, and carries its partial reply so a dead worker's text survives. Each
turn beating on its own meant one UPDATE (and a connection health check) per turn per
second: at 200 concurrent turns the database threads' GIL hand-offs starved the event
loop that streams them. The keeper of an event loop beats for all its turns at once
(`sessions.turn_state.turns_heartbeat`) and tells each turn what the reply says.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from openworker.runtime.store import turn_state
from openworker.runtime.store.dbcall import db

logger = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 1.0


@dataclass
class Lease:
    turn_id: str
    worker: str
    # () → (partial text, partial reasoning) now.
    partials: Callable[[], tuple[str, str]]
    # Called when the turn is no longer ours, and when Stop was asked for.
    on_lost: Callable[[], None]
    on_cancel: Callable[[], None]
    sent: tuple[str, str] | None = None


class LeaseKeeper:
    def __init__(self, interval: float = HEARTBEAT_SECONDS) -> None:
        self.interval = interval
        self._leases: dict[str, Lease] = {}
        self._task: asyncio.Task[None] | None = None

    def hold(self, lease: Lease) -> None:
        """Beat for `lease` from now on (the first beat within `interval`)."""
        self._leases[lease.turn_id] = lease
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def release(self, turn_id: str) -> None:
        self._leases.pop(turn_id, None)

    async def _run(self) -> None:
        while self._leases:
            await asyncio.sleep(self.interval)
            try:
                await self.beat()
            except asyncio.CancelledError:
                raise
            except Exception:
                # The database is away: the leases run on, and the next beat retries.
                logger.warning("heartbeat of %d turns failed", len(self._leases), exc_info=True)

    async def beat(self) -> None:
        leases = list(self._leases.values())
        beats = []
        for lease in leases:
            partials = lease.partials()
            changed = partials != lease.sent
            beats.append(
                turn_state.LeaseBeat(
                    turn_id=lease.turn_id,
                    worker=lease.worker,
                    partial_text=partials[0] if changed else None,
                    partial_reasoning=partials[1] if changed else None,
                )
            )
            lease.sent = partials
        try:
            replies = await db(turn_state.turns_heartbeat, pool="lease-db")(beats=beats)
        except BaseException:
            for lease in leases:
                lease.sent = None  # not written: send it again next time
            raise
        for lease in leases:
            reply = replies.get(lease.turn_id)
            if reply is None or self._leases.get(lease.turn_id) is not lease:
                continue  # released meanwhile: its turn has ended
            if not reply.owned:
                self.release(lease.turn_id)
                lease.on_lost()
            elif reply.cancel_requested:
                lease.on_cancel()


_keepers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LeaseKeeper] = (
    weakref.WeakKeyDictionary()
)


def lease_keeper() -> LeaseKeeper:
    """The running event loop's keeper."""
    loop = asyncio.get_running_loop()
    keeper = _keepers.get(loop)
    if keeper is None:
        keeper = _keepers[loop] = LeaseKeeper()
    return keeper
