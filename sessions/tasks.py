"""Celery tasks: load ids, call a service, declare the retry policy. Nothing else."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from sessions import events


@shared_task(name="sessions.tasks.publish_session_event", acks_late=True, ignore_result=True)
def publish_session_event(session_id: str, event: dict[str, Any]) -> None:
    """Deliver a small notice (e.g. a session renamed by a background job) to the
    session's open sockets. Carries ids and display data only, never secrets."""
    events.publish(session_id, event)
