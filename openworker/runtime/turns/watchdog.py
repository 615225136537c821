"""The lease sweeper: a running turn whose worker stopped beating becomes interrupted
within seconds (not after the broker's visibility timeout), and every open socket of
its session is told.

Runs in every Daphne process (started by the ASGI app) and in every Celery worker (a
thread started when the worker is ready), so a dead worker is noticed as long as any
process of the deployment lives.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from asgiref.sync import async_to_sync, sync_to_async
from django.db import close_old_connections

from openworker.runtime.live.emitter import TurnEmitter
from openworker.runtime.live.replay import get_replay_buffer
from openworker.runtime.store import turn_state

logger = logging.getLogger(__name__)

SWEEP_INTERVAL_SECONDS = 2.0

_started_loops: set[int] = set()


async def sweep_once() -> int:
    changed = await sync_to_async(turn_state.turns_expire_leases)()
    buffer = get_replay_buffer()
    for turn in changed:
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
    return len(changed)


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
