"""The Celery side of turns: the task a worker runs, and what a worker starts when it is
ready (GC tuning; the lease sweeper starts from `watchdog`). Tasks load ids and call
the runtime; nothing else.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from celery import shared_task
from celery.signals import worker_ready, worker_shutdown

from openworker import thread_switching
from openworker.gc_tuning import tune_for_serving
from openworker.runtime.agent.llm import warm_for_serving
from openworker.runtime.agent.tools import mcp_pool
from openworker.runtime.turns.admission import run_admitted
from openworker.runtime.turns.worker_loop import worker_loop
from providers.kept_connections import aclose_loop_keeper

logger = logging.getLogger(__name__)

# The registered name predates this module's move out of `sessions.tasks`: messages queued
# by an older deploy still find their task after an upgrade.
RUN_TURN_TASK = "sessions.tasks.run_turn_task"
RUN_TURNS_TASK = "openworker.run_turns"


# No automatic retries: a turn is retried by its user (or resumed after approval) as a new
# task. acks_late + reject_on_worker_lost redeliver a task whose worker died; the engine's
# lease makes that redelivery a no-op once the sweeper marked the turn interrupted.
@shared_task(name=RUN_TURN_TASK, acks_late=True, ignore_result=True, max_retries=0)
def run_turn_task(turn_id: str) -> None:
    worker_loop.run(run_admitted(turn_id))


@shared_task(name=RUN_TURNS_TASK, acks_late=True, ignore_result=True, max_retries=0)
def run_turns_task(turn_ids: list[str]) -> None:
    """Several turns of one burst from one message (`runner.TURNS_PER_MESSAGE`): each is
    admitted in order and runs on the turn loop as if it came alone; the message is
    acknowledged once all have ended."""
    worker_loop.run(_run_each(turn_ids))


async def _run_each(turn_ids: list[str]) -> None:
    # Started in order (admission is first come first served); one turn's failure is
    # logged as a task of its own would be, and ends none of the others.
    outcomes = await asyncio.gather(
        *(run_admitted(turn_id) for turn_id in turn_ids), return_exceptions=True
    )
    for turn_id, outcome in zip(turn_ids, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            logger.error("turn %s failed", turn_id, exc_info=outcome)


@worker_ready.connect
def _ready_to_serve(**_: Any) -> None:
    warm_for_serving()
    tune_for_serving()  # after the warm-up: what it built is frozen too
    thread_switching.tune_for_serving()


@worker_shutdown.connect
def _close_pooled_sessions(**_: Any) -> None:
    """The turn loop's open MCP sessions end cleanly (HTTP sessions deleted, stdio
    processes stopped) when the worker stops, and its kept provider connections close."""
    if worker_loop.started:
        worker_loop.run(mcp_pool.aclose_running_loop_pool())
        worker_loop.run(aclose_loop_keeper())
