"""Writes of chat sessions, messages and turns (HackSoft style: `<entity>_<action>`).

Views, consumers, tasks and the engine call these; none of them writes models directly.
Every function is synchronous ORM code; async callers wrap it with `sync_to_async`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from sessions.models import Message, Session, Turn

# A running turn whose heartbeat is older than this is considered dead. The engine beats
# every second; six missed beats is a dead worker, not a slow database.
LEASE_SECONDS = 6.0


class TurnRefused(Exception):
    """A turn cannot be started or changed now; the message is for the user."""


@dataclass(frozen=True)
class HeartbeatReply:
    owned: bool
    cancel_requested: bool


# --- sessions --------------------------------------------------------------------------


def session_create(*, owner: Any, model: str = "", title: str = "") -> Session:
    return Session.objects.create(owner=owner, model=model or settings.DEFAULT_MODEL, title=title)


# --- messages --------------------------------------------------------------------------


def message_append(
    *,
    session_id: uuid.UUID | str,
    role: str,
    content: Any = "",
    turn_id: uuid.UUID | str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    tool_call_id: str = "",
    reasoning: str = "",
    extras: dict[str, Any] | None = None,
    usage: dict[str, Any] | None = None,
    model: str = "",
    finish_reason: str = "",
    dedupe_key: str | None = None,
) -> Message:
    """Append one canonical message; idempotent on `dedupe_key` (a replayed step returns
    the message it wrote the first time instead of writing it again)."""
    with transaction.atomic():
        if dedupe_key is not None:
            existing = Message.objects.filter(session_id=session_id, dedupe_key=dedupe_key).first()
            if existing is not None:
                return existing
        # The row lock serialises sequence numbers per session across processes.
        session = Session.objects.select_for_update().get(pk=session_id)
        seq = session.next_seq
        Session.objects.filter(pk=session.pk).update(next_seq=seq + 1, updated_at=timezone.now())
        try:
            with transaction.atomic():
                return Message.objects.create(
                    session_id=session.pk,
                    seq=seq,
                    turn_id=turn_id,
                    role=role,
                    content=content,
                    tool_calls=tool_calls or None,
                    tool_call_id=tool_call_id,
                    reasoning=reasoning,
                    extras=extras or None,
                    usage=usage,
                    model=model,
                    finish_reason=finish_reason,
                    dedupe_key=dedupe_key,
                )
        except IntegrityError:
            if dedupe_key is None:
                raise
    return Message.objects.get(session_id=session_id, dedupe_key=dedupe_key)


# --- turns -----------------------------------------------------------------------------


def turn_start(
    *,
    session: Session,
    text: str,
    attachments: list[dict[str, Any]] | None = None,
    model: str | None = None,
) -> Turn:
    """Record the user's message and a queued turn, and hand the turn to the runner once
    the transaction commits."""
    from openworker.runner import turn_enqueue

    text = (text or "").strip()
    if not text and not attachments:
        raise TurnRefused("Type a message or attach a file.")
    limit = settings.MAX_CONCURRENT_TURNS_PER_USER
    active = Turn.objects.filter(session__owner_id=session.owner_id, status__in=Turn.ACTIVE)
    if active.filter(session=session).exists():
        raise TurnRefused("This session is still working on the previous message.")
    if active.count() >= limit:
        raise TurnRefused(f"You already have {limit} replies running; wait for one to finish.")
    model = (model or session.model or settings.DEFAULT_MODEL).strip()
    content: Any = text
    if attachments:
        content = ([{"type": "text", "text": text}] if text else []) + list(attachments)
    with transaction.atomic():
        if model != session.model:
            Session.objects.filter(pk=session.pk).update(model=model)
        turn = Turn.objects.create(session=session, model=model)
        message_append(
            session_id=session.pk,
            role="user",
            content=content,
            turn_id=turn.pk,
            dedupe_key=f"{turn.pk}:user",
        )
        turn_enqueue(turn.pk)
    return turn


def attachment_parts(*, user: Any, attachment_ids: list[str]) -> list[dict[str, Any]]:
    """Canonical content parts referencing the user's own uploads (by id, never inline)."""
    from sessions.models import Attachment

    if len(attachment_ids) > settings.MAX_ATTACHMENTS_PER_MESSAGE:
        raise TurnRefused(f"Attach at most {settings.MAX_ATTACHMENTS_PER_MESSAGE} files.")
    valid = []
    for value in attachment_ids:
        try:
            valid.append(uuid.UUID(value))
        except ValueError:
            raise TurnRefused("Unknown attachment.") from None
    found = {a.pk: a for a in Attachment.objects.filter(owner=user, pk__in=valid)}
    parts = []
    for key in valid:
        attachment = found.get(key)
        if attachment is None:
            raise TurnRefused("Unknown attachment.")
        meta = {
            "id": str(attachment.pk),
            "name": attachment.name,
            "mime": attachment.mime,
            "size": attachment.size,
        }
        if attachment.mime.startswith("image/"):
            part = {"type": "image_url", "image_url": {"url": f"attachment:{attachment.pk}"}}
        else:
            part = {
                "type": "file",
                "file": {"filename": attachment.name, "file_data": f"attachment:{attachment.pk}"},
            }
        parts.append({**part, "attachment": meta})
    return parts


def turn_send(
    *,
    session: Session,
    user: Any,
    text: str,
    attachment_ids: list[str] | None = None,
    model: str | None = None,
) -> Turn:
    """The user sends a message: validate, start the turn, tell the session's sockets."""
    from sessions import events, selectors

    if session.owner_id != user.pk:
        raise TurnRefused("Unknown session.")
    if len(text) > settings.MAX_MESSAGE_CHARS:
        raise TurnRefused(f"Messages are limited to {settings.MAX_MESSAGE_CHARS} characters.")
    parts = attachment_parts(user=user, attachment_ids=attachment_ids or [])
    turn = turn_start(session=session, text=text, attachments=parts, model=model)
    message = Message.objects.filter(turn=turn, role=Message.Role.USER).first()
    if message is not None:
        payload = selectors.message_payload(message)
        transaction.on_commit(
            lambda: events.publish(session.pk, {"type": "message.user", "message": payload})
        )
    return turn


def turn_claim(*, turn_id: uuid.UUID | str, worker: str) -> Turn | None:
    """Take the lease on a queued turn. None when someone else has it or it is finished
    (a redelivered task after the turn was interrupted or completed does nothing)."""
    now = timezone.now()
    updated = Turn.objects.filter(pk=turn_id, status=Turn.Status.QUEUED).update(
        status=Turn.Status.RUNNING,
        lease_owner=worker,
        heartbeat_at=now,
        started_at=now,
        attempts=F("attempts") + 1,
        partial_text="",
        partial_reasoning="",
    )
    if not updated:
        return None
    return Turn.objects.select_related("session").get(pk=turn_id)


def turn_heartbeat(
    *, turn_id: uuid.UUID | str, worker: str, partial_text: str, partial_reasoning: str
) -> HeartbeatReply:
    owned = Turn.objects.filter(pk=turn_id, lease_owner=worker, status=Turn.Status.RUNNING).update(
        heartbeat_at=timezone.now(),
        partial_text=partial_text,
        partial_reasoning=partial_reasoning,
    )
    if not owned:
        return HeartbeatReply(owned=False, cancel_requested=False)
    cancel = Turn.objects.filter(pk=turn_id).values_list("cancel_requested", flat=True).first()
    return HeartbeatReply(owned=True, cancel_requested=bool(cancel))


def turn_step_done(*, turn_id: uuid.UUID | str, usage: dict[str, int] | None, cost: Any) -> None:
    """Count a finished model call and add its usage and cost to the turn's totals."""
    with transaction.atomic():
        turn = Turn.objects.select_for_update().get(pk=turn_id)
        totals = dict(turn.usage or {})
        for key, value in (usage or {}).items():
            totals[key] = totals.get(key, 0) + int(value or 0)
        turn.usage = totals or None
        turn.steps += 1
        if cost is not None:
            turn.cost = (turn.cost or 0) + cost
        turn.partial_text = ""
        turn.partial_reasoning = ""
        turn.save(update_fields=["usage", "steps", "cost", "partial_text", "partial_reasoning"])
        if usage:
            context = (
                int(usage.get("input", 0))
                + int(usage.get("cache_read", 0))
                + int(usage.get("cache_write", 0))
            )
            Session.objects.filter(pk=turn.session_id).update(last_context_tokens=context)


def turn_finish(
    *,
    turn_id: uuid.UUID | str,
    worker: str,
    status: str,
    error_kind: str = "",
    error: str = "",
    partial_text: str | None = None,
    partial_reasoning: str | None = None,
) -> bool:
    """Move a turn we hold to a terminal state (or awaiting approval). False when the
    lease was lost meanwhile (the sweeper or a stop got there first)."""
    fields: dict[str, Any] = {
        "status": status,
        "error_kind": error_kind,
        "error": error,
        "lease_owner": "",
        "finished_at": timezone.now() if status in Turn.TERMINAL else None,
    }
    if partial_text is not None:
        fields["partial_text"] = partial_text
    if partial_reasoning is not None:
        fields["partial_reasoning"] = partial_reasoning
    return bool(
        Turn.objects.filter(pk=turn_id, lease_owner=worker, status=Turn.Status.RUNNING).update(
            **fields
        )
    )


def turn_request_stop(*, turn: Turn) -> Turn:
    """Stop: a running turn's worker sees the flag at its next heartbeat (and at once when
    it runs in this process); a queued or waiting turn is cancelled here."""
    from openworker.runner import turn_cancel_local

    Turn.objects.filter(pk=turn.pk, status=Turn.Status.RUNNING).update(cancel_requested=True)
    Turn.objects.filter(
        pk=turn.pk, status__in=[Turn.Status.QUEUED, Turn.Status.AWAITING_APPROVAL]
    ).update(status=Turn.Status.CANCELLED, finished_at=timezone.now())
    turn_cancel_local(turn.pk)
    turn.refresh_from_db()
    return turn


def turn_decide_tool(*, turn: Turn, call_id: str, approved: bool) -> Turn:
    """Record an approval decision; once every waiting call is decided, queue the turn
    again (a new task picks it up where it paused)."""
    from openworker.runner import turn_enqueue

    with transaction.atomic():
        turn = Turn.objects.select_for_update().get(pk=turn.pk)
        if turn.status != Turn.Status.AWAITING_APPROVAL:
            raise TurnRefused("This reply is not waiting for an approval.")
        pending = turn_pending_calls(turn=turn)
        if call_id not in {call["id"] for call in pending}:
            raise TurnRefused("Unknown tool call.")
        turn.approvals = {**turn.approvals, call_id: "approved" if approved else "denied"}
        undecided = [call for call in pending if call["id"] not in turn.approvals]
        fields = ["approvals"]
        if not undecided:
            turn.status = Turn.Status.QUEUED
            fields.append("status")
        turn.save(update_fields=fields)
        if not undecided:
            turn_enqueue(turn.pk)
    return turn


def turn_pending_calls(*, turn: Turn) -> list[dict[str, Any]]:
    """Tool calls of the turn's latest assistant message that have no result yet."""
    last = Message.objects.filter(turn=turn, role=Message.Role.ASSISTANT).order_by("-seq").first()
    if last is None or not last.tool_calls:
        return []
    answered = set(
        Message.objects.filter(turn=turn, role=Message.Role.TOOL, seq__gt=last.seq).values_list(
            "tool_call_id", flat=True
        )
    )
    return [call for call in last.tool_calls if call["id"] not in answered]


def turn_retry(*, turn: Turn) -> Turn:
    """Run a failed or interrupted turn again from its last committed message."""
    from openworker.runner import turn_enqueue

    retryable = [Turn.Status.FAILED, Turn.Status.INTERRUPTED]
    with transaction.atomic():
        updated = Turn.objects.filter(pk=turn.pk, status__in=retryable).update(
            status=Turn.Status.QUEUED,
            error="",
            error_kind="",
            cancel_requested=False,
            finished_at=None,
        )
        if not updated:
            raise TurnRefused("Only a failed or interrupted reply can be retried.")
        turn_enqueue(turn.pk)
    turn.refresh_from_db()
    return turn


def turns_expire_leases(*, now: Any = None) -> list[Turn]:
    """Mark running turns whose worker stopped beating as interrupted (their partial
    text stays on the row). Returns the turns it changed."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=LEASE_SECONDS)
    stale = list(
        Turn.objects.filter(status=Turn.Status.RUNNING)
        .filter(Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True))
        .values_list("pk", flat=True)
    )
    changed = []
    for pk in stale:
        updated = Turn.objects.filter(
            pk=pk, status=Turn.Status.RUNNING, heartbeat_at__lt=cutoff
        ).update(
            status=Turn.Status.INTERRUPTED,
            lease_owner="",
            error_kind="interrupted",
            error="The worker running this reply stopped. Retry to continue.",
            finished_at=now,
        )
        if updated:
            changed.append(Turn.objects.get(pk=pk))
    return changed
