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
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from openworker.runtime.store import turn_state
from openworker.runtime.store.dbcall import db, db_blocking

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
    """Beats for every lease of one event loop.

    The beats are timed by a thread of their own, not by the loop: a loop running seconds
    late under load (200 streams in embedded Daphne, a burst of turn starts) would let the
    leases of turns it is still streaming expire, and the sweeper would interrupt them
    (seen in bench/stream_path.py: 1-4 turns of 200 "lease lost" while tokens came seconds
    late). The ticker reads the partials (plain strings) and writes them on the
    "lease-db" thread; what a reply says is told to each turn on its loop."""

    def __init__(self, interval: float = HEARTBEAT_SECONDS) -> None:
        self.interval = interval
        self._leases: dict[str, Lease] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ticker: threading.Thread | None = None
        self._lock = threading.Lock()

    def hold(self, lease: Lease) -> None:
        """Beat for `lease` from now on (the first beat within `interval`)."""
        self._loop = asyncio.get_running_loop()
        self._leases[lease.turn_id] = lease
        with self._lock:
            if self._ticker is None:
                self._ticker = threading.Thread(target=self._tick, name="lease-ticker", daemon=True)
                self._ticker.start()

    def release(self, turn_id: str) -> None:
        self._leases.pop(turn_id, None)

    def _tick(self) -> None:
        while True:
            time.sleep(self.interval)
            with self._lock:
                if not self._leases:
                    self._ticker = None  # the next hold() starts another
                    return
            try:
                leases, beats = self._collect()
                # A turn that ended since it was collected is not beaten: its engine has
                # released it, and a late write would only race its last commit.
                held = [lease for lease in leases if self._leases.get(lease.turn_id) is lease]
                if not held:
                    continue
                if len(held) < len(leases):
                    ids = {lease.turn_id for lease in held}
                    leases, beats = held, [beat for beat in beats if beat.turn_id in ids]
                try:
                    replies = db_blocking(turn_state.turns_heartbeat, pool="lease-db", beats=beats)
                except BaseException:
                    self._unsent(leases)
                    raise
                loop = self._loop
                if loop is not None:
                    loop.call_soon_threadsafe(self._apply, leases, replies)
            except RuntimeError:
                # The loop (or the database pool) is closed: its turns are gone with it.
                with self._lock:
                    self._ticker = None
                return
            except Exception:
                # The database is away: the leases run on, and the next beat retries.
                logger.warning("heartbeat of %d turns failed", len(self._leases), exc_info=True)

    async def beat(self) -> None:
        """One beat now, from the loop (what the ticker does each interval)."""
        leases, beats = self._collect()
        try:
            replies = await db(turn_state.turns_heartbeat, pool="lease-db")(beats=beats)
        except BaseException:
            self._unsent(leases)
            raise
        self._apply(leases, replies)

    def _collect(self) -> tuple[list[Lease], list[turn_state.LeaseBeat]]:
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
        return leases, beats

    @staticmethod
    def _unsent(leases: list[Lease]) -> None:
        for lease in leases:
            lease.sent = None  # not written: send it again next time

    def _apply(self, leases: list[Lease], replies: dict[str, turn_state.HeartbeatReply]) -> None:
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
