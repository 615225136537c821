"""Writes of chat sessions, messages and turns (HackSoft style: `<entity>_<action>`).

Views, consumers, tasks and the engine call these; none of them writes models directly.
Every function is synchronous ORM code; async callers wrap it with `sync_to_async`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q, Sum
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
    # No savepoint when nested (turn_start): any error fails the caller's transaction too.
    with transaction.atomic(savepoint=False):
        message, _ = _message_insert(
            session_id=session_id,
            fields={
                "turn_id": turn_id,
                "role": role,
                "content": content,
                "tool_calls": tool_calls or None,
                "tool_call_id": tool_call_id,
                "reasoning": reasoning,
                "extras": extras or None,
                "usage": usage,
                "model": model,
                "finish_reason": finish_reason,
            },
            dedupe_key=dedupe_key,
        )
    return message


def _message_insert(
    *,
    session_id: uuid.UUID | str,
    fields: dict[str, Any],
    dedupe_key: str | None,
    context_tokens: int | None = None,
    new_key: bool = False,
) -> tuple[Message, bool]:
    """Insert a message inside the caller's transaction: (message, created). Three
    statements: take the next sequence number (which locks the session row, so appends
    to one session serialise across processes), look for the dedupe key (unless the
    caller made the key in this transaction: `new_key`), insert."""
    seq = _session_take_seq(session_id, context_tokens=context_tokens)
    if dedupe_key is not None and not new_key:
        existing = Message.objects.filter(session_id=session_id, dedupe_key=dedupe_key).first()
        if existing is not None:
            # Under the row lock: give the number back, so a replay leaves no gap.
            Session.objects.filter(pk=session_id).update(next_seq=F("next_seq") - 1)
            return existing, False
    message = Message.objects.create(
        session_id=session_id, seq=seq, dedupe_key=dedupe_key, **fields
    )
    return message, True


def _session_take_seq(session_id: uuid.UUID | str, *, context_tokens: int | None) -> int:
    """The session's next message number, counted up in one `UPDATE ... RETURNING`
    (PostgreSQL, and SQLite since 3.35) that also takes the row lock and touches
    `updated_at` (and the context size, when a model call reported one)."""
    table = connection.ops.quote_name(Session._meta.db_table)
    column = connection.ops.quote_name
    sets = [f"{column('next_seq')} = {column('next_seq')} + 1", f"{column('updated_at')} = %s"]
    params: list[Any] = [
        Session._meta.get_field("updated_at").get_db_prep_value(timezone.now(), connection)
    ]
    if context_tokens is not None:
        sets.append(f"{column('last_context_tokens')} = %s")
        params.append(context_tokens)
    pk = Session._meta.pk
    assert pk is not None
    params.append(pk.get_db_prep_value(_as_uuid(session_id), connection))
    with connection.cursor() as cursor:
        # Only quoted identifiers are interpolated; every value is a parameter.
        cursor.execute(
            f"UPDATE {table} SET {', '.join(sets)} WHERE {column(pk.column)} = %s "  # noqa: S608
            f"RETURNING {column('next_seq')} - 1",
            params,
        )
        row = cursor.fetchone()
    if row is None:
        raise Session.DoesNotExist(f"no session {session_id}")
    return int(row[0])


def _as_uuid(value: uuid.UUID | str) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


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
    return _turn_start(session=session, text=text, attachments=attachments, model=model)[0]


def _turn_start(
    *,
    session: Session,
    text: str,
    attachments: list[dict[str, Any]] | None,
    model: str | None,
) -> tuple[Turn, Message]:
    from openworker.runner import turn_enqueue

    text = (text or "").strip()
    if not text and not attachments:
        raise TurnRefused("Type a message or attach a file.")
    limit, budget = _user_limits(session.owner_id)
    # One query answers both checks: the sessions of the user's active turns.
    active = list(
        Turn.objects.filter(session__owner_id=session.owner_id, status__in=Turn.ACTIVE).values_list(
            "session_id", flat=True
        )
    )
    if session.pk in active:
        raise TurnRefused("This session is still working on the previous message.")
    if len(active) >= limit:
        raise TurnRefused(f"You already have {limit} replies running; wait for one to finish.")
    if budget is not None and user_month_spend(user_id=session.owner_id) >= budget:
        raise TurnRefused("You have reached this month's spending limit; ask an admin to raise it.")
    model = (model or session.model or settings.DEFAULT_MODEL).strip()
    content: Any = text
    if attachments:
        content = ([{"type": "text", "text": text}] if text else []) + list(attachments)
    with transaction.atomic():
        if model != session.model:
            Session.objects.filter(pk=session.pk).update(model=model)
        turn = Turn.objects.create(session=session, model=model)
        message, _ = _message_insert(
            session_id=session.pk,
            fields={"turn_id": turn.pk, "role": "user", "content": content},
            dedupe_key=f"{turn.pk}:user",
            new_key=True,
        )
        turn_enqueue(turn.pk)
    return turn, message


def _user_limits(user_id: int) -> tuple[int, Decimal | None]:
    """(concurrent turns allowed, monthly budget or None): the user's limits row, else the
    site default for concurrency and no budget."""
    from sessions.models import UserLimits

    row = UserLimits.objects.filter(user_id=user_id).first()
    concurrent = settings.MAX_CONCURRENT_TURNS_PER_USER
    if row is not None and row.max_concurrent_turns:
        concurrent = row.max_concurrent_turns
    return concurrent, (row.monthly_budget if row is not None else None)


def user_month_spend(*, user_id: int) -> Decimal:
    """What the user's turns have cost since the start of this calendar month (local time).

    Turns with unknown cost (unpriced models) count as nothing: a budget cannot guess.
    """
    start = timezone.localtime().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    total = Turn.objects.filter(session__owner_id=user_id, created_at__gte=start).aggregate(
        total=Sum("cost")
    )["total"]
    return total or Decimal(0)


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
    parts = attachment_parts(user=user, attachment_ids=attachment_ids) if attachment_ids else []
    turn, message = _turn_start(session=session, text=text, attachments=parts, model=model)
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


@dataclass(frozen=True)
class LeaseBeat:
    """One running turn's heartbeat: its lease holder, and its partial reply (text and
    reasoning together) when it changed since the last beat (None: leave it alone)."""

    turn_id: str
    worker: str
    partial_text: str | None = None
    partial_reasoning: str | None = None


def turns_heartbeat(*, beats: list[LeaseBeat]) -> dict[str, HeartbeatReply]:
    """Renew the leases of many turns in one batched UPDATE and one SELECT: a worker
    process beats for all its turns at once. (One ORM update per turn per second, then
    the ORM's CASE-per-row `bulk_update`, made the worker's database thread the limit
    at 200 turns: bench/stream_path.py.)

    A turn is still ours when it is running under our lease; for each turn the reply
    says so, and whether Stop was asked for.
    """
    if not beats:
        return {}
    meta = Turn._meta
    quote = connection.ops.quote_name
    column = {name: quote(meta.get_field(name).column) for name in _HEARTBEAT_FIELDS}
    pk = meta.pk
    now = meta.get_field("heartbeat_at").get_db_prep_value(timezone.now(), connection)
    running = Turn.Status.RUNNING.value
    # The partials only when they changed (NULL keeps the stored one). Identifiers come
    # from the model's metadata; every value is bound.
    table, key = quote(meta.db_table), quote(pk.column)
    text, reasoning = column["partial_text"], column["partial_reasoning"]
    sql = (
        f"UPDATE {table} SET {column['heartbeat_at']} = %s, "  # noqa: S608
        f"{text} = COALESCE(%s, {text}), {reasoning} = COALESCE(%s, {reasoning}) "
        f"WHERE {key} = %s AND {column['lease_owner']} = %s AND {column['status']} = %s"
    )
    rows = [
        (
            now,
            beat.partial_text,
            beat.partial_reasoning,
            pk.get_db_prep_value(uuid.UUID(beat.turn_id), connection),
            beat.worker,
            running,
        )
        for beat in beats
    ]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.executemany(sql, rows)
    state = {
        str(turn_id): (owner, status, cancel)
        for turn_id, owner, status, cancel in Turn.objects.filter(
            pk__in=[beat.turn_id for beat in beats]
        ).values_list("pk", "lease_owner", "status", "cancel_requested")
    }
    replies = {}
    for beat in beats:
        owner, status, cancel = state.get(beat.turn_id, ("", "", False))
        owned = owner == beat.worker and status == running
        replies[beat.turn_id] = HeartbeatReply(owned=owned, cancel_requested=owned and cancel)
    return replies


_HEARTBEAT_FIELDS = ("heartbeat_at", "partial_text", "partial_reasoning", "lease_owner", "status")


@dataclass(frozen=True)
class StepTotals:
    """A turn's running totals after one more model call. The engine holds the lease,
    so it is the only writer of these and keeps them in memory."""

    usage: dict[str, int] | None
    steps: int
    cost: Decimal | None


@dataclass(frozen=True)
class StepSaved:
    message: Message
    counted: bool  # False: a replayed step, whose message and totals were already saved
    ours: bool  # False: the lease was lost meanwhile (the message is kept all the same)


def turn_step_commit(
    *,
    turn_id: uuid.UUID | str,
    worker: str,
    session_id: uuid.UUID | str,
    message: dict[str, Any],
    dedupe_key: str,
    totals: StepTotals,
    context_tokens: int | None,
    finish: str | None = None,
) -> StepSaved:
    """One model call's outcome in one transaction: its assistant message, the turn's new
    totals, the session's context size, and for the last call of a turn its final
    status. A lost lease keeps the message, as a stop keeps what was streamed.

    Six statements (with BEGIN and COMMIT) where the separate writes took fourteen and
    three thread hops: 200 turns ending together made that difference the streams'
    latency (bench/stream_path.py)."""
    with transaction.atomic():
        saved, created = _message_insert(
            session_id=session_id,
            fields={"turn_id": turn_id, "role": "assistant", **message},
            dedupe_key=dedupe_key,
            context_tokens=context_tokens,
        )
        fields: dict[str, Any] = {}
        if created:  # a replayed step was counted the first time
            fields.update(
                usage=totals.usage or None,
                steps=totals.steps,
                cost=totals.cost,
                partial_text="",
                partial_reasoning="",
            )
        if finish is not None:
            fields.update(
                status=finish,
                error_kind="",
                error="",
                lease_owner="",
                finished_at=timezone.now() if finish in Turn.TERMINAL else None,
            )
        owned = Turn.objects.filter(pk=turn_id, lease_owner=worker, status=Turn.Status.RUNNING)
        ours = bool(owned.update(**fields)) if fields else owned.exists()
    return StepSaved(message=saved, counted=created, ours=ours)


def context_tokens_of(usage: dict[str, Any] | None) -> int | None:
    """The prompt's size as the provider counted it: input plus cached tokens."""
    if not usage:
        return None
    return (
        int(usage.get("input", 0))
        + int(usage.get("cache_read", 0))
        + int(usage.get("cache_write", 0))
    )


def usage_add(total: dict[str, Any] | None, more: dict[str, Any] | None) -> dict[str, int]:
    """Token buckets added up, key by key."""
    out = {key: int(value or 0) for key, value in (total or {}).items()}
    for key, value in (more or {}).items():
        out[key] = out.get(key, 0) + int(value or 0)
    return out


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


# --- the web app: session management ---------------------------------------------------

# Titles are a line in a list: long enough to recognise a conversation, short enough to fit.
TITLE_MAX_CHARS = 80
# The fallback title: the first words of the user's first message.
TITLE_FALLBACK_WORDS = 8
# The titling call is tiny on purpose: a few words out, a clipped exchange in.
TITLE_MAX_TOKENS = 40
TITLE_EXCHANGE_CHARS = 2_000
# Quotes (straight and curly) and Markdown emphasis models like to wrap a title in.
TITLE_STRIP_CHARS = "\"'\u201c\u201d\u2018\u2019*#"
TITLE_PROMPT = (
    "Write a short title (at most 8 words) for the conversation below. "
    "Reply with the title only: no quotes, no punctuation at the end."
)


def session_rename(*, session: Session, title: str) -> Session:
    session.title = " ".join(title.split())[:TITLE_MAX_CHARS]
    session.save(update_fields=["title"])
    return session


def session_archive(*, session: Session, archived: bool = True) -> Session:
    session.archived = archived
    session.save(update_fields=["archived"])
    return session


def session_delete(*, session: Session) -> None:
    """Delete a session and its transcript, turns and workspace files.

    Its uploads are detached rather than deleted: uploads are deduplicated per owner, so the
    same file may be referenced from another session's messages.
    """
    import shutil

    from sessions.models import Attachment
    from sessions.selectors import workspace_root

    if Turn.objects.filter(session=session, status__in=Turn.ACTIVE).exists():
        raise TurnRefused("Stop the running reply before deleting this session.")
    root = workspace_root(session.pk)
    with transaction.atomic():
        Attachment.objects.filter(session=session).update(session=None)
        session.delete()
        transaction.on_commit(lambda: shutil.rmtree(root, ignore_errors=True))


def session_set_model(*, session: Session, model: str) -> Session:
    """Switch the model the next turn uses (the transcript is unchanged: degradation acts
    on the outbound copy of each request)."""
    model = model.strip()
    if not model:
        raise TurnRefused("Choose a model.")
    if len(model) > Session._meta.get_field("model").max_length:
        raise TurnRefused("That model name is too long.")
    session.model = model
    session.save(update_fields=["model"])
    return session


def user_set_default_model(*, user: Any, model: str) -> str:
    from sessions.models import UserPreferences

    model = model.strip()[:200]
    UserPreferences.objects.update_or_create(user=user, defaults={"default_model": model})
    return model


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def title_fallback(text: str) -> str:
    words = text.split()
    title = " ".join(words[:TITLE_FALLBACK_WORDS])
    if len(words) > TITLE_FALLBACK_WORDS:
        title += "…"
    return title[:TITLE_MAX_CHARS]


def _clean_title(raw: str) -> str:
    lines = [line.strip() for line in (raw or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    title = lines[0].strip().strip(TITLE_STRIP_CHARS).strip()
    if title.lower().startswith("title:"):
        title = title[len("title:") :].strip()
    return title.rstrip(".").strip()[:TITLE_MAX_CHARS]


@dataclass(frozen=True)
class TitleRequest:
    """What titling needs, read from the database up front so the model call can run
    on a thread that never touches the database."""

    session_id: str
    owner_id: int
    model: str
    messages: list[dict[str, Any]]
    fallback: str


def title_request(*, session_id: uuid.UUID | str) -> TitleRequest | None:
    """None when the session is gone, already titled, or has nothing to title from."""
    session = Session.objects.filter(pk=session_id).first()
    if session is None or session.title:
        return None
    first = list(
        Message.objects.filter(session=session, role__in=["user", "assistant"]).order_by("seq")[:6]
    )
    return title_request_for(session, first)


def title_request_for(session: Session, messages: list[Message]) -> TitleRequest | None:
    """What titling needs from the session's first messages (in order), without a query:
    the engine has them in memory when a turn completes."""
    if session.title:
        return None
    user_text = next((_text_of(m.content) for m in messages if m.role == "user"), "").strip()
    reply_text = next((_text_of(m.content) for m in messages if m.role == "assistant"), "").strip()
    if not user_text and not reply_text:
        return None
    exchange = f"User: {user_text}\n\nAssistant: {reply_text}"[:TITLE_EXCHANGE_CHARS]
    return TitleRequest(
        session_id=str(session.pk),
        owner_id=session.owner_id,
        model=settings.TITLE_MODEL or session.model or settings.DEFAULT_MODEL,
        messages=[
            {"role": "system", "content": TITLE_PROMPT},
            {"role": "user", "content": exchange},
        ],
        fallback=title_fallback(user_text or reply_text),
    )


def title_from_model(request: TitleRequest, provider: Any) -> str:
    """A few words from the model, or "" (any failure only costs the nicer title).
    No database access: safe on a provider thread."""
    import logging

    try:
        turn = provider.complete(
            model=request.model, messages=request.messages, max_tokens=TITLE_MAX_TOKENS
        )
    except Exception:
        logging.getLogger(__name__).info(
            "titling session %s failed", request.session_id, exc_info=True
        )
        return ""
    return _clean_title(turn.text or "")


async def atitle_from_model(request: TitleRequest, provider: Any) -> str:
    """`title_from_model` for the engine's event loop: the same request, streamed through
    `astream` (a blocking call per titled session put hundreds of threads back beside
    the streams when many turns ended at once: bench/stream_path.py)."""
    import logging

    final = None
    try:
        async for chunk in provider.astream(
            model=request.model, messages=request.messages, max_tokens=TITLE_MAX_TOKENS
        ):
            if chunk.turn is not None:
                final = chunk.turn
    except Exception:
        logging.getLogger(__name__).info(
            "titling session %s failed", request.session_id, exc_info=True
        )
        return ""
    return _clean_title(final.text or "") if final is not None else ""


def session_title_save(*, session_id: uuid.UUID | str, title: str) -> str:
    """Store the title unless the user set one meanwhile; returns the session's title."""
    if Session.objects.filter(pk=session_id, title="").update(title=title):
        return title
    return Session.objects.filter(pk=session_id).values_list("title", flat=True).first() or ""


def session_title_from_first_exchange(
    *, session_id: uuid.UUID | str, provider: Any = None, use_model: bool | None = None
) -> str:
    """Title an untitled session from its first exchange; returns the title ("" if none).

    Asks `settings.TITLE_MODEL` (empty: the session's model) through the owner's router
    for a few words when titling by model is on (`settings.AUTO_TITLE`), and falls back to
    the first words of the user's message. A title the user set is never overwritten.
    (The engine runs the same three steps with the model call on a provider thread.)
    """
    request = title_request(session_id=session_id)
    if request is None:
        session = Session.objects.filter(pk=session_id).first()
        return session.title if session is not None else ""
    if use_model is None:
        use_model = settings.AUTO_TITLE
    title = ""
    if use_model:
        owned = provider is None
        if provider is None:
            from openworker.llm import router_for_user

            provider = router_for_user(request.owner_id)
        try:
            title = title_from_model(request, provider)
        finally:
            if owned:
                provider.close()
    return session_title_save(session_id=session_id, title=title or request.fallback)


def session_import(
    *, owner: Any, title: str, model: str, messages: list[dict[str, Any]]
) -> Session:
    """A new session of `owner` holding `messages` (already validated canonical dicts, in
    order). Turn links are not imported: the new session has no turns of its own yet."""
    with transaction.atomic():
        session = Session.objects.create(
            owner=owner,
            title=" ".join(title.split())[:TITLE_MAX_CHARS],
            model=model or settings.DEFAULT_MODEL,
        )
        batch: list[Message] = []
        seq = 0
        for seq, message in enumerate(messages, start=1):
            batch.append(
                Message(
                    session=session,
                    seq=seq,
                    role=message["role"],
                    content=message.get("content", ""),
                    tool_calls=message.get("tool_calls") or None,
                    tool_call_id=message.get("tool_call_id", ""),
                    reasoning=message.get("reasoning", ""),
                    extras=message.get("extras") or None,
                    usage=message.get("usage"),
                    model=message.get("model", ""),
                    finish_reason=message.get("finish_reason", ""),
                )
            )
            if len(batch) >= 500:
                Message.objects.bulk_create(batch)
                batch = []
        Message.objects.bulk_create(batch)
        Session.objects.filter(pk=session.pk).update(next_seq=seq + 1)
    session.refresh_from_db()
    return session
