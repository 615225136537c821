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
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

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


@dataclass
class _Asked:
    # The asker's place in the database threads' queue (priority_pool): the batch goes
    # at its oldest turn's.
    priority: int
    futures: list[asyncio.Future[Claim | None]] = field(default_factory=list)


class Claimer:
    """One event loop's turn claims, gathered into batches while a claim call runs."""

    def __init__(self) -> None:
        self._asked: dict[str, _Asked] = {}
        self._draining: asyncio.Task[None] | None = None

    async def claim(self, turn_id: str) -> Claim | None:
        """Claim the queued turn `turn_id` for this process: None when it is not queued
        (someone else has it, or it is finished)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Claim | None] = loop.create_future()
        asked = self._asked.setdefault(str(turn_id), _Asked(priority=call_priority.get()))
        asked.futures.append(future)
        if self._draining is None or self._draining.done():
            self._draining = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._asked:
            ids = list(self._asked)[:MAX_BATCH]
            batch = {turn_id: self._asked.pop(turn_id) for turn_id in ids}
            call_priority.set(min(asked.priority for asked in batch.values()))
            worker = worker_id()
            try:
                claimed = await db(turn_state.turns_claim)(turn_ids=ids, worker=worker)
            except Exception as exc:  # each asker's turn start fails as its own claim would
                for asked in batch.values():
                    for future in asked.futures:
                        if not future.done():
                            future.set_exception(exc)
                continue
            answered = [(asked, claimed.get(turn_id), worker) for turn_id, asked in batch.items()]
            settle_spread(answered, _settle)


def _settle(answered: tuple[_Asked, Turn | None, str]) -> None:
    asked, turn, worker = answered
    first, *others = asked.futures
    if not first.done():
        first.set_result(Claim(turn, worker) if turn is not None else None)
    elif turn is not None:
        # Its asker left while the claim ran (cancelled): the lease expires and the
        # sweeper marks the turn interrupted, as before batching.
        logger.info("turn %s was claimed after its start was cancelled", turn.pk)
    for future in others:  # a duplicate start of the same turn
        if not future.done():
            future.set_result(None)


_claimers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Claimer] = (
    weakref.WeakKeyDictionary()
)


def claimer() -> Claimer:
    """The running event loop's claimer."""
    loop = asyncio.get_running_loop()
    found = _claimers.get(loop)
    if found is None:
        found = _claimers[loop] = Claimer()
    return found
