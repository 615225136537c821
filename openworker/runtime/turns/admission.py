"""Admission control: a process runs at most `TURNS_PER_PROCESS` turns at once; the rest
wait their turn, first come first served, and their pages are told where they stand.

Why: past what one process's CPU streams in real time, every extra turn made every
stream slower, until at K = 1000 on one worker turns ran past any timeout and their
tokens never reached the page (issue 26, docs/PERFORMANCE.md). A turn that waits keeps
its place and starts at full speed; the turns already streaming keep theirs.

A waiting turn stays `queued` in the database (nothing is claimed until it is admitted,
so Stop cancels it as any queued turn). This process renews its `heartbeat_at` (for a
queued turn: when it was last handed over) every `HOLD_SECONDS`, so the sweeper does not
hand it to a runner again (`turn_state.turns_take_stranded`); a process that dies stops
renewing, and its waiting turns are handed over again within seconds of the redispatch
delay. The same hold says which waiting turns were stopped meanwhile: they leave the
queue without running.

Turns also start at a pace (`ADMITS_PER_SECOND` after a burst of `ADMIT_BURST`): turns
started together end together, and a burst's or a wave's starts all in one instant
slowed every stream already running. Past the pace a turn waits in the same queue.
While the loop runs late (`LoopLoad.lag` past `ADMIT_LAG_LIMIT_SECONDS`: its streams'
tokens are already late), the pace drops to a `LAGGING_PACE` share of it until the
loop catches up: a turn's start and end cost a worker about as much CPU as fifty of its
tokens, and at K = 1000 the tail was the seconds when a wave's turns ended and the next
ones started together (docs/PERFORMANCE.md, session 24). The pace only slows, never
stops: a loop late for good still starts its turns.

While waiting, the turn's page gets `turn.queued {turn, seq, position}` (1 = next), once
on arrival and then at most every `HOLD_SECONDS` when the position changed: through the
turn's replay buffer like every turn event, so a page that reloads sees it too.

Both run modes go through here: the Celery task on the worker's turn loop, and the
embedded runner's tasks on Daphne's loop. State is per event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from openworker.runtime.agent.engine import run_turn
from openworker.runtime.live.emitter import TurnEmitter, loop_load
from openworker.runtime.live.replay import get_replay_buffer
from openworker.runtime.store import turn_state
from openworker.runtime.store.dbcall import db

logger = logging.getLogger(__name__)

# Renew waiting turns' hand-over time and announce changed positions this often: well
# under turn_state.REDISPATCH_AFTER_SECONDS, so a waiting turn is never handed over twice
# while this process lives, and rare enough that 1,000 waiting turns cost ~500 small
# events a second at most.
HOLD_SECONDS = 2.0
# Arrivals within this of each other are held and announced in one database call.
ARRIVAL_BATCH_SECONDS = 0.1
# The share of ADMITS_PER_SECOND turns start at while the loop runs late.
LAGGING_PACE = 0.25


@dataclass
class _Waiter:
    turn_id: str
    admitted: asyncio.Future[None]
    emitter: TurnEmitter | None = None
    announced: int | None = None
    # Stopped while it waited: it leaves the queue without running.
    cancelled: bool = False
    # Held while an announcement is written: the engine numbers its events after it.
    writing: asyncio.Lock = field(default_factory=asyncio.Lock)


class Admission:
    """One event loop's running turns and FIFO queue of waiting ones."""

    def __init__(self, capacity: int | None = None) -> None:
        # None: settings.TURNS_PER_PROCESS, read at each decision (tests override it).
        self._capacity = capacity
        self.running: set[str] = set()
        self.waiting: OrderedDict[str, _Waiter] = OrderedDict()
        self._holder: asyncio.Task[None] | None = None
        self._arrived: asyncio.Event | None = None
        # The pace of starts (a generic cell rate: the loop time the next start is due
        # at, and the wake-up set for it when one is not yet due).
        self._due = 0.0
        self._paced: asyncio.TimerHandle | None = None
        # While the loop runs late: the loop time the next start may come at.
        self._lagging_due = 0.0

    @property
    def capacity(self) -> int:
        return self._capacity if self._capacity is not None else settings.TURNS_PER_PROCESS

    def positions(self) -> dict[str, int]:
        """Each waiting turn's place: 1 for the next to run."""
        return {turn_id: index + 1 for index, turn_id in enumerate(self.waiting)}

    async def run(
        self, turn_id: str, start: Callable[[str, Callable[[], None]], Awaitable[Any]]
    ) -> None:
        """Run `start(turn_id, release)` once a place is free (at once when one is and
        nobody waits); `release()` gives the place back before `start` returns (the turn's
        reply is final, and what remains, its title, need not hold up a waiting turn). A
        turn already running or waiting here (a duplicate delivery) returns at once: the
        first one runs it."""
        turn_id = str(turn_id)
        if turn_id in self.running or turn_id in self.waiting:
            logger.info("turn %s is already here; duplicate delivery ignored", turn_id)
            return
        self._ensure_holder()
        if self.waiting or len(self.running) >= self.capacity or not self._may_admit_now():
            if not await self._wait(turn_id):
                return
        else:
            self.running.add(turn_id)
        try:
            await start(turn_id, functools.partial(self._release, turn_id))
        finally:
            self._release(turn_id)

    def _release(self, turn_id: str) -> None:
        self.running.discard(turn_id)
        self._admit_next()

    async def _wait(self, turn_id: str) -> bool:
        """Wait for a place; False when the turn was stopped meanwhile."""
        waiter = _Waiter(turn_id=turn_id, admitted=asyncio.get_running_loop().create_future())
        self.waiting[turn_id] = waiter
        self._wake_holder()
        try:
            await waiter.admitted
        except BaseException:
            # Cancelled from outside (shutdown): give the place, or the queue slot, back.
            if self.waiting.pop(turn_id, None) is None and not waiter.cancelled:
                self.running.discard(turn_id)
            self._admit_next()
            raise
        finally:
            async with waiter.writing:
                if waiter.emitter is not None:
                    # Its events are in the buffer before the engine numbers its own after
                    # them (the engine starts from the buffer's last seq).
                    with contextlib.suppress(Exception):
                        await waiter.emitter.close()
        return not waiter.cancelled

    def _admit_next(self) -> None:
        while self.waiting and len(self.running) < self.capacity:
            turn_id, waiter = next(iter(self.waiting.items()))
            if waiter.admitted.done():  # stopped while it waited: it takes no place
                del self.waiting[turn_id]
                continue
            if not self._may_admit_now():
                return
            del self.waiting[turn_id]
            self.running.add(turn_id)
            waiter.admitted.set_result(None)

    def _may_admit_now(self) -> bool:
        """Whether the pace (settings.ADMITS_PER_SECOND, ADMIT_BURST at once) allows one
        more turn to start now; when it does not, `_admit_next` runs again once it will.
        A burst of sends, and the places a wave frees at once (turns started together end
        together), start over a second or two instead of landing on the streams already
        running all in the same instant."""
        rate = settings.ADMITS_PER_SECOND
        if rate <= 0:
            return True
        loop = asyncio.get_running_loop()
        now, spacing = loop.time(), 1.0 / rate
        lagging = self._lagging()
        if lagging and now < self._lagging_due:
            self._admit_at(loop, self._lagging_due)
            return False
        early = settings.ADMIT_BURST * spacing  # how far ahead of its due time one may go
        if self._due - now > early - spacing:
            self._admit_at(loop, self._due - early + spacing)
            return False
        self._due = max(self._due, now) + spacing
        if lagging:
            self._lagging_due = now + spacing / LAGGING_PACE
        return True

    def _lagging(self) -> bool:
        """Whether the loop runs late enough that starts slow down (`LAGGING_PACE`):
        only with turns running here, whose tokens the lateness delays."""
        limit = settings.ADMIT_LAG_LIMIT_SECONDS
        return limit > 0 and bool(self.running) and loop_load().lag > limit

    def _admit_at(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._paced is None:
            self._paced = loop.call_at(when, self._paced_admit)

    def _paced_admit(self) -> None:
        self._paced = None
        self._admit_next()

    # --- holding the waiting turns, telling their pages --------------------------------

    def _ensure_holder(self) -> None:
        if self._arrived is None:
            self._arrived = asyncio.Event()
        if self._holder is None or self._holder.done():
            self._holder = asyncio.get_running_loop().create_task(self._hold_forever())

    def _wake_holder(self) -> None:
        self._ensure_holder()
        assert self._arrived is not None
        self._arrived.set()

    async def _hold_forever(self) -> None:
        assert self._arrived is not None
        while self.waiting or self.running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), HOLD_SECONDS)
            # A burst of arrivals is held and announced together, a beat after it began.
            await asyncio.sleep(ARRIVAL_BATCH_SECONDS)
            self._arrived.clear()
            try:
                await self.hold_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("holding %d waiting turns failed", len(self.waiting), exc_info=True)

    async def hold_once(self) -> None:
        """Renew the hand-over time of the turns here that are still queued (one UPDATE
        for all): the waiting ones, and the admitted ones whose claim is still queued
        behind other database calls; let waiting ones no longer queued (stopped
        meanwhile) go; tell the others' pages their position when it changed."""
        ids = list(self.waiting)
        if not ids and not self.running:
            return
        queued = await db(turn_state.turns_hold_queued, pool="lease-db")(
            turn_ids=[*ids, *self.running]
        )
        for turn_id in ids:
            if turn_id in queued:
                continue
            waiter = self.waiting.pop(turn_id, None)
            if waiter is not None and not waiter.admitted.done():
                waiter.cancelled = True
                waiter.admitted.set_result(None)
        self._admit_next()
        positions = self.positions()
        announce = [
            (waiter, positions[turn_id], queued[turn_id])
            for turn_id, waiter in self.waiting.items()
            if waiter.announced != positions[turn_id] and turn_id in queued
        ]
        # Concurrently: the emitters' writes share the loop's Redis pipelines.
        await asyncio.gather(*(self._announce(*one) for one in announce))

    async def _announce(self, waiter: _Waiter, position: int, session_id: str) -> None:
        async with waiter.writing:
            await self._announce_locked(waiter, position, session_id)

    async def _announce_locked(self, waiter: _Waiter, position: int, session_id: str) -> None:
        try:
            if waiter.emitter is None:
                buffer = get_replay_buffer()
                start = await buffer.last_seq(waiter.turn_id)
                if waiter.admitted.done():
                    return  # started meanwhile: the engine numbers its events from here
                waiter.emitter = TurnEmitter(
                    session_id=session_id, turn_id=waiter.turn_id, buffer=buffer, start_seq=start
                )
            if waiter.admitted.done():
                return
            waiter.announced = position
            await waiter.emitter.emit("turn.queued", position=position)
        except Exception:
            # The page learns of the turn when it starts: waiting stays correct.
            logger.warning("could not announce turn %s's place", waiter.turn_id, exc_info=True)


_admissions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Admission] = (
    weakref.WeakKeyDictionary()
)


def admission() -> Admission:
    """The running event loop's admission control."""
    loop = asyncio.get_running_loop()
    found = _admissions.get(loop)
    if found is None:
        found = _admissions[loop] = Admission()
    return found


async def run_admitted(turn_id: str) -> None:
    """Run the turn once this process has a place for it: what the runner starts."""
    await admission().run(turn_id, lambda turn_id, release: run_turn(turn_id, on_final=release))
