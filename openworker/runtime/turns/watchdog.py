"""The lease sweeper: a running turn whose worker stopped beating becomes interrupted
within seconds (not after the broker's visibility timeout), and every open socket of
its session is told; a queued turn whose task is gone (a Redis restart empties the
broker) is handed to the runner again within seconds (`turn_state.turns_take_stranded`).

Runs in every Daphne process (started by the ASGI app) and in every Celery worker (a
thread started when the worker is ready), so a dead worker is noticed as long as any
process of the deployment lives.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from celery.signals import worker_ready
from django.db import close_old_connections, connection

from openworker.runtime.live.emitter import TurnEmitter
from openworker.runtime.live.replay import get_replay_buffer
from openworker.runtime.store import turn_state
from openworker.runtime.turns import runner

logger = logging.getLogger(__name__)

SWEEP_INTERVAL_SECONDS = 2.0

_started_loops: set[int] = set()


async def sweep_once() -> int:
    """One sweep: expire dead leases (and tell the pages), then hand stranded queued
    turns to the runner again. Returns how many turns it changed."""
    changed = await sync_to_async(_expire_leases)()
    for turn in changed:
        await announce_status(turn)
    # Read on the loop that owns the embedded runner's tasks (Daphne's).
    redispatched = await sync_to_async(_redispatch)(runner.embedded_runner.running_ids())
    return len(changed) + len(redispatched)


def _expire_leases() -> list[Any]:
    try:
        return turn_state.turns_expire_leases()
    finally:
        _release()


def _redispatch(skip: frozenset[str]) -> list[str]:
    try:
        taken = turn_state.turns_take_stranded(skip=skip)
        runner.turns_enqueue(taken)
        return taken
    finally:
        _release()


def _release() -> None:
    """Give the connection back to the pool (Daphne's sync thread would keep it between
    sweeps), unless a caller's transaction is open (a test's)."""
    if not connection.in_atomic_block:
        close_old_connections()


async def announce_status(turn: Any) -> None:
    """Send a turn's status, as its next event, to every open page of its session and end
    its replay buffer: for a turn that ended without an engine to say so (lease expired,
    stopped before it started)."""
    buffer = get_replay_buffer()
    try:
        start = await buffer.last_seq(str(turn.pk))
    except Exception:
        start = 0
    emitter = TurnEmitter(
        session_id=str(turn.session_id), turn_id=str(turn.pk), buffer=buffer, start_seq=start
    )
    await emitter.emit(
        "turn.status", status=turn.status, error_kind=turn.error_kind, error=turn.error
    )
    try:
        await buffer.finish(str(turn.pk))
    except Exception:
        logger.warning("replay buffer finish failed", exc_info=True)


def announce_status_sync(turn: Any) -> None:
    """`announce_status` from synchronous code (a command, after commit)."""
    try:
        async_to_sync(announce_status)(turn)
    except Exception:
        logger.warning("could not announce turn %s's status", turn.pk, exc_info=True)


async def _sweep_forever() -> None:
    while True:
        try:
            await sweep_once()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.warning("lease sweep failed", exc_info=True)
        await asyncio.sleep(SWEEP_INTERVAL_SECONDS)


def start_in_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Start the sweeper once per event loop (Daphne's)."""
    if id(loop) in _started_loops:
        return
    _started_loops.add(id(loop))
    loop.create_task(_sweep_forever())


def start_thread() -> threading.Thread:
    """Start the sweeper in a daemon thread (Celery workers)."""

    def run() -> None:
        while True:
            try:
                async_to_sync(sweep_once)()
            except Exception:
                logger.warning("lease sweep failed", exc_info=True)
            finally:
                close_old_connections()
            time.sleep(SWEEP_INTERVAL_SECONDS)

    thread = threading.Thread(target=run, name="lease-sweeper", daemon=True)
    thread.start()
    return thread


# Here rather than in `tasks`: the sweeper hands turns to the runner, which sends the
# task (tasks -> watchdog -> runner -> tasks would be a cycle). CELERY_IMPORTS loads it.
@worker_ready.connect
def _start_lease_sweeper(**_: Any) -> None:
    start_thread()
