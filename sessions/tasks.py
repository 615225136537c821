"""Celery tasks of the product: load ids, call a service, declare the retry policy.

The turn task lives with the turn runtime (`openworker.runtime.turns.tasks`)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from openworker.runtime.live import events
from sessions.bulk_export import export_job_run


@shared_task(name="sessions.tasks.publish_session_event", acks_late=True, ignore_result=True)
def publish_session_event(session_id: str, event: dict[str, Any]) -> None:
    """Deliver a small notice to the session's open sockets. Ids and display data only."""
    events.publish(session_id, event)


# One attempt: a failed export is marked failed with its reason and the admin starts a
# new one; acks_late redelivers it if the worker died, and a completed job is a no-op.
@shared_task(
    name="sessions.tasks.export_job_task", acks_late=True, ignore_result=True, max_retries=0
)
def export_job_task(job_id: str) -> None:
    export_job_run(job_id=job_id)
