"""Celery tasks: load ids, call a service, declare the retry policy. Nothing else."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.signals import worker_ready

from sessions import events


@shared_task(name="sessions.tasks.publish_session_event", acks_late=True, ignore_result=True)
def publish_session_event(session_id: str, event: dict[str, Any]) -> None:
    """Deliver a small notice to the session's open sockets. Ids and display data only."""
    events.publish(session_id, event)


# No automatic retries: a turn is retried by its user (or resumed after approval) as a new
# task. acks_late + reject_on_worker_lost redeliver a task whose worker died; the engine's
# lease makes that redelivery a no-op once the sweeper marked the turn interrupted.
@shared_task(name="sessions.tasks.run_turn_task", acks_late=True, ignore_result=True, max_retries=0)
def run_turn_task(turn_id: str) -> None:
    from openworker.engine import run_turn
    from openworker.runner import worker_loop

    worker_loop.run(run_turn(turn_id))


@worker_ready.connect
def _start_lease_sweeper(**_: Any) -> None:
    from openworker.watchdog import start_thread

    start_thread()


@worker_ready.connect
def _tune_gc(**_: Any) -> None:
    from openworker.gc_tuning import tune_for_serving

    tune_for_serving()


# One attempt: a failed export is marked failed with its reason and the admin starts a
# new one; acks_late redelivers it if the worker died, and a completed job is a no-op.
@shared_task(
    name="sessions.tasks.export_job_task", acks_late=True, ignore_result=True, max_retries=0
)
def export_job_task(job_id: str) -> None:
    from sessions.bulk_export import export_job_run

    export_job_run(job_id=job_id)
