"""A burst of turn starts claims its turns together: one database call for the lot.

Every turn start used to claim its turn on its own (an UPDATE and a read-back) on the
worker's one database thread, where a burst of starts waits in line: at K = 200 the last
turn was claimed a second and a half after the last send was committed, and that wait was
the burst's first-token p99 (bench/stream_path.py, docs/PERFORMANCE.md). Each event loop
has one `Claimer`: a turn asks it for its claim; while one claim call is in flight the
next asks gather, and go in the next call together (one UPDATE, one SELECT however many).
Nothing waits on a timer: a lone turn is claimed at once, as before.

A batch's turns share one lease owner (`worker_id()`, unique per batch): the heartbeat and
every conditional write compare it per turn, and a turn is in a batch at most once (a
duplicate request in the same batch gets None, as a second claim of one turn always has).

A claimer may also start what it claimed in the same call (`start`: the engine's reads
before a turn's first model call, `agent.starts`). Claimed, then started in a call of
its own, a turn of a wave waited in the database thread's queue twice: at K = 1000 with
500 places the start's wait alone was 317 ms at p50 (964 at p99), with the turn holding
its place all along (bench/stream_path.py, docs/PERFORMANCE.md session 19). In one call
nothing queues between the claim, which starts the lease's clock, and the reads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from openworker.runtime.store import turn_state
from openworker.runtime.store.dbcall import db
from openworker.runtime.store.gather import settle_spread
from openworker.runtime.store.priority_pool import call_priority

if TYPE_CHECKING:
    from sessions.models import Turn

logger = logging.getLogger(__name__)

# Turns per claim call: the UPDATE's IN list and the read-back stay small statements.
MAX_BATCH = 100

_HOSTNAME = socket.gethostname()


def worker_id() -> str:
    """A lease owner's name: this host and process, and a part unique to the claim."""
    return f"{_HOSTNAME}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Claim:
    turn: Turn
    # The lease owner the turn was claimed under: its heartbeats and writes name it.
    worker: str
    # What the claimer's `start` made of the turn in the same call (an exception: its
    # start failed); None from a claimer without one.
    started: Any = None


@dataclass
class _Asked:
    # The asker's place in the database threads' queue (priority_pool): the batch goes
    # at its oldest turn's.
    priority: int
    futures: list[asyncio.Future[Claim | None]] = field(default_factory=list)
    # What the first asker gave for its turn's start (the claimer's `start` reads it).
    start_with: Any = None


# Starts a batch's claimed turns on the database thread: one answer per (turn, what its
# asker gave), in order; an answer that is an exception fails that turn's start alone.
StartClaimed = Callable[[list[tuple["Turn", Any]]], list[Any]]


class Claimer:
    """One event loop's turn claims, gathered into batches while a claim call runs;
    with `start`, the claimed turns are started in the same call, and `abandoned` is told
    of a start whose asker left meanwhile (to release what it holds)."""

    def __init__(
        self,
        *,
        start: StartClaimed | None = None,
        abandoned: Callable[[Any], None] | None = None,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self._asked: dict[str, _Asked] = {}
        self._draining: asyncio.Task[None] | None = None
        self._start = start
        self._abandoned = abandoned
        self._max_batch = max_batch

    async def claim(self, turn_id: str, start_with: Any = None) -> Claim | None:
        """Claim the queued turn `turn_id` for this process: None when it is not queued
        (someone else has it, or it is finished). `start_with` goes to the claimer's
        `start` with the claimed turn."""
        if (self._start is None) != (start_with is None):
            # One asker's missing start would fail its whole batch's starts.
            raise ValueError("a starting claimer needs start_with, and only it takes one")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Claim | None] = loop.create_future()
        asked = self._asked.setdefault(
            str(turn_id), _Asked(priority=call_priority.get(), start_with=start_with)
        )
        asked.futures.append(future)
        if self._draining is None or self._draining.done():
            self._draining = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._asked:
            ids = list(self._asked)[: self._max_batch]
            batch = {turn_id: self._asked.pop(turn_id) for turn_id in ids}
            call_priority.set(min(asked.priority for asked in batch.values()))
            worker = worker_id()
            try:
                if self._start is None:
                    claimed = await db(turn_state.turns_claim)(turn_ids=ids, worker=worker)
                    started: dict[str, Any] = {}
                else:
                    claimed, started = await db(turns_claim_and_start)(
                        turn_ids=ids,
                        worker=worker,
                        start=self._start,
                        start_with={turn_id: asked.start_with for turn_id, asked in batch.items()},
                    )
            except Exception as exc:  # each asker's turn start fails as its own claim would
                for asked in batch.values():
                    for future in asked.futures:
                        if not future.done():
                            future.set_exception(exc)
                continue
            answered = [
                (asked, claimed.get(turn_id), worker, started.get(turn_id))
                for turn_id, asked in batch.items()
            ]
            settle_spread(answered, self._settle)

    def _settle(self, answered: tuple[_Asked, Turn | None, str, Any]) -> None:
        asked, turn, worker, started = answered
        first, *others = asked.futures
        if not first.done():
            first.set_result(Claim(turn, worker, started) if turn is not None else None)
        elif turn is not None:
            # Its asker left while the claim ran (cancelled): the lease expires and the
            # sweeper marks the turn interrupted, as before batching.
            logger.info("turn %s was claimed after its start was cancelled", turn.pk)
            # A start made for it holds a provider: closed.
            if self._abandoned is not None and not isinstance(started, (Exception, type(None))):
                self._abandoned(started)
        for future in others:  # a duplicate start of the same turn
            if not future.done():
                future.set_result(None)


def turns_claim_and_start(
    *,
    turn_ids: list[str],
    worker: str,
    start: StartClaimed,
    start_with: dict[str, Any],
) -> tuple[dict[str, Turn], dict[str, Any]]:
    """`turns_claim`, then `start` of the turns taken, on the database thread: ({turn id:
    turn}, {turn id: its start}). A `start` that fails as a whole fails each claimed
    turn's start (its run reports it), never the claims, which are made."""
    claimed = turn_state.turns_claim(turn_ids=turn_ids, worker=worker)
    taken = [turn_id for turn_id in turn_ids if turn_id in claimed]
    if not taken:
        return claimed, {}
    try:
        answers = start([(claimed[turn_id], start_with.get(turn_id)) for turn_id in taken])
    except Exception as exc:
        logger.warning("starting %d claimed turns failed", len(taken), exc_info=True)
        answers = [exc] * len(taken)
    return claimed, dict(zip(taken, answers, strict=True))


def loop_claimers(make: Callable[[], Claimer]) -> Callable[[], Claimer]:
    """A getter of the running event loop's claimer (futures must not cross loops), made
    by `make()` on the loop's first claim."""
    made: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Claimer] = (
        weakref.WeakKeyDictionary()
    )

    def get() -> Claimer:
        loop = asyncio.get_running_loop()
        found = made.get(loop)
        if found is None:
            found = made[loop] = make()
        return found

    return get
