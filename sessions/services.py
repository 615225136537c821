"""Writes of chat sessions and their transcripts (HackSoft style: `<entity>_<action>`).

The product's data layer: views, the turn runtime and imports call these; none of them
writes these models directly. A turn's life (send, claim, heartbeat, commit, stop) lives
in `openworker.runtime`: its commands (`runtime.turns.commands`) and its state machine
(`runtime.store.turn_state`) build on the message writes here. Nothing here imports the
runtime. Every function is synchronous ORM code; async callers go through
`openworker.runtime.store.dbcall`.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.db import connection, transaction
from django.db.models import F, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from openworker.prepared_query import AnyOf, PreparedQuery
from openworker.values_sql import rows_insert, values_rows
from providers.edge.model_policy import ModelRefused, model_require
from sessions.attachments import attachment_meta, attachment_part
from sessions.models import Attachment, Message, Session, Turn, UserPreferences
from sessions.selectors import workspace_root


class TurnRefused(Exception):
    """A turn cannot be started or changed now; the message is for the user."""


# --- sessions --------------------------------------------------------------------------


def session_create(*, owner: Any, model: str = "", title: str = "") -> Session:
    return Session.objects.create(owner=owner, model=model or settings.DEFAULT_MODEL, title=title)


def model_check(*, user: Any, model: str) -> str:
    """`model` (stripped) if the model policy lets `user` run it (providers.edge.model_policy),
    else TurnRefused saying why: every place a user chooses a model calls this."""
    try:
        return model_require(user=user, model=model).model
    except ModelRefused as exc:
        raise TurnRefused(str(exc)) from None


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
    continuation: str = "",
    dedupe_key: str | None = None,
) -> Message:
    """Append one canonical message; idempotent on `dedupe_key` (a replayed step returns
    the message it wrote the first time instead of writing it again)."""
    # No savepoint when nested (turn_start): any error fails the caller's transaction too.
    with transaction.atomic(savepoint=False):
        message, _ = message_insert(
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
                "continuation": continuation,
            },
            dedupe_key=dedupe_key,
        )
    return message


# `message_insert(parent_seq=TIP)`: hang the message under its turn's tip (below).
TIP: Any = object()


def message_insert(
    *,
    session_id: uuid.UUID | str,
    fields: dict[str, Any],
    dedupe_key: str | None,
    context_tokens: int | None = None,
    new_key: bool = False,
    parent_seq: int | None = TIP,
    activate: bool = False,
) -> tuple[Message, bool]:
    """Insert a message inside the caller's transaction: (message, created). Take the
    next sequence number (which locks the session row, so appends to one session
    serialise across processes), look for the dedupe key (unless the caller made the key
    in this transaction: `new_key`), find the parent, insert, move the active leaf.

    The parent (docs/PROTOCOL.md "Branches"), unless the caller names one: the turn's
    newest message, else the message the turn started from (`Turn.base_seq`), else (no
    turn) the session's active leaf. The new message becomes the active leaf when its
    parent was the active leaf (a turn extends the path the page shows), or `activate`."""
    turn_id = fields.get("turn_id")
    if parent_seq is TIP and turn_id is not None and not new_key:
        # Written by the turn's lease holder only: no lock needed to read its tip. (A
        # key made in this transaction is a new turn's first message: it has no tip.)
        parent_seq = _turn_tip(turn_id)
    seq, active = session_take_seq(
        session_id, context_tokens=context_tokens, parent_seq=parent_seq, activate=activate
    )
    if dedupe_key is not None and not new_key:
        written = _DEDUPED.instances(session_id=session_id, dedupe_key=dedupe_key)
        if written:
            existing = written[0]
            # Under the row lock: give the number (and the active leaf) back, so a
            # replay leaves no gap.
            Session.objects.filter(pk=session_id).update(
                next_seq=F("next_seq") - 1, active_seq=parent_seq if active == seq else active
            )
            return existing, False
    extends_active = parent_seq is TIP
    if extends_active:
        # A `send` (or no turn): under the active leaf, which stays ours under the row
        # lock. One more UPDATE moves the leaf: `UPDATE ... RETURNING` gives the new row.
        parent_seq = active
    message = Message.objects.create(
        session_id=session_id, seq=seq, dedupe_key=dedupe_key, parent_seq=parent_seq, **fields
    )
    if extends_active:
        Session.objects.filter(pk=session_id).update(active_seq=seq)
    return message, True


def _turn_tip(turn_id: uuid.UUID | str) -> Any:
    """Where the next message of `turn_id` goes (one query): its newest message, else the
    message it started from, else TIP (a turn from before the tree: the active leaf)."""
    found = _TIP.first(turn_id=turn_id)
    return found[0] if found is not None and found[0] is not None else TIP


def _tip_query(turn_id: uuid.UUID) -> QuerySet:
    newest = Message.objects.filter(turn_id=OuterRef("pk")).order_by("-seq").values("seq")[:1]
    return (
        Turn.objects.filter(pk=turn_id)
        .annotate(tip=Coalesce(Subquery(newest), F("base_seq")))
        .values_list("tip")[:1]
    )


# Both run in every model call's commit: compiled once (openworker.prepared_query).
_TIP = PreparedQuery(_tip_query, turn_id=uuid.UUID)
_DEDUPED = PreparedQuery(
    lambda session_id, dedupe_key: Message.objects.filter(
        session_id=session_id, dedupe_key=dedupe_key
    ).order_by("pk")[:1],
    session_id=uuid.UUID,
    dedupe_key=str,
)


def session_take_seq(
    session_id: uuid.UUID | str,
    *,
    context_tokens: int | None,
    parent_seq: int | None = TIP,
    activate: bool = False,
) -> tuple[int, int | None]:
    """(the session's next message number, its active leaf after this statement),
    counted up in one `UPDATE ... RETURNING` (PostgreSQL, and SQLite since 3.35) that also
    takes the row lock, touches `updated_at` (and the context size, when a model call
    reported one) and moves the active leaf to the new message when `activate` or when
    `parent_seq` (known) is the active leaf: a step's commit costs no extra statement."""
    table = connection.ops.quote_name(Session._meta.db_table)
    column = connection.ops.quote_name
    sets = [f"{column('next_seq')} = {column('next_seq')} + 1", f"{column('updated_at')} = %s"]
    params: list[Any] = [
        Session._meta.get_field("updated_at").get_db_prep_value(timezone.now(), connection)
    ]
    if context_tokens is not None:
        sets.append(f"{column('last_context_tokens')} = %s")
        params.append(context_tokens)
    # Every SET expression reads the row as it was: `next_seq` here is the new seq.
    active = column("active_seq")
    if activate:
        sets.append(f"{active} = {column('next_seq')}")
    elif parent_seq is None:
        sets.append(
            f"{active} = CASE WHEN {active} IS NULL THEN {column('next_seq')} ELSE {active} END"
        )
    elif parent_seq is not TIP:
        sets.append(
            f"{active} = CASE WHEN {active} = %s THEN {column('next_seq')} ELSE {active} END"
        )
        params.append(parent_seq)
    pk = Session._meta.pk
    assert pk is not None
    params.append(pk.get_db_prep_value(_as_uuid(session_id), connection))
    with connection.cursor() as cursor:
        # Only quoted identifiers are interpolated; every value is a parameter.
        cursor.execute(
            f"UPDATE {table} SET {', '.join(sets)} WHERE {column(pk.column)} = %s "  # noqa: S608
            f"RETURNING {column('next_seq')} - 1, {column('active_seq')}",
            params,
        )
        row = cursor.fetchone()
    if row is None:
        raise Session.DoesNotExist(f"no session {session_id}")
    return int(row[0]), (int(row[1]) if row[1] is not None else None)


def turns_first_messages_insert(
    *, turns: list[tuple[Turn, Any]], when: Any = None
) -> list[Message]:
    """New turns and their users' messages, many sessions at once (a burst of sends),
    inside the caller's transaction: what `message_insert` does for a send, in four
    statements however many. Each session at most once (a session runs one turn at a
    time). `turns`: (unsaved turn, its message's content). Each message goes under its
    session's active leaf and becomes the new one, as a send's does.

    Raises `Session.DoesNotExist` when a session is gone (the caller's transaction then
    rolls back: nothing of the batch is written)."""
    if not turns:
        return []
    pk = Session._meta.pk
    assert pk is not None
    session_ids = [_as_uuid(turn.session_id) for turn, _ in turns]
    if len(set(session_ids)) != len(session_ids):
        raise ValueError("one new turn per session in a batch")
    table = connection.ops.quote_name(Session._meta.db_table)
    column = connection.ops.quote_name
    updated = Session._meta.get_field("updated_at")
    now = updated.get_db_prep_value(when or timezone.now(), connection)
    marks = ", ".join(["%s"] * len(session_ids))
    with connection.cursor() as cursor:
        # As `session_take_seq` (one row lock each, `updated_at` touched), for the lot.
        # Only quoted identifiers are interpolated; every value is a parameter.
        cursor.execute(
            f"UPDATE {table} SET {column('next_seq')} = {column('next_seq')} + 1, "  # noqa: S608
            f"{column('updated_at')} = %s WHERE {column(pk.column)} IN ({marks}) "
            f"RETURNING {column(pk.column)}, {column('next_seq')} - 1, {column('active_seq')}",
            [now, *(pk.get_db_prep_value(sid, connection) for sid in session_ids)],
        )
        taken = {_as_uuid(row[0]): (int(row[1]), row[2]) for row in cursor.fetchall()}
    missing = [sid for sid in session_ids if sid not in taken]
    if missing:
        raise Session.DoesNotExist(f"no session {missing[0]}")
    rows_insert([turn for turn, _ in turns])
    messages = [
        Message(
            session_id=turn.session_id,
            seq=taken[sid][0],
            parent_seq=taken[sid][1],
            dedupe_key=f"{turn.pk}:user",
            turn_id=turn.pk,
            role=Message.Role.USER,
            content=content,
        )
        for sid, (turn, content) in zip(session_ids, turns, strict=True)
    ]
    rows_insert(messages)
    if len(session_ids) == 1:  # a lone send: no CASE to build
        Session.objects.filter(pk=session_ids[0]).update(active_seq=messages[0].seq)
    else:
        # Written out (`UPDATE ... FROM (VALUES ...)`): the ORM's CASE with a WHEN per
        # session resolved an expression per row, holding the sync thread's GIL.
        fields = [pk, Session._meta.get_field("active_seq")]
        values, params = values_rows(fields, ((sid, taken[sid][0]) for sid in session_ids))
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} AS s SET {column('active_seq')} = v.column2 "  # noqa: S608
                f"FROM (VALUES {values}) AS v WHERE s.{column(pk.column)} = v.column1",
                params,
            )
    return messages


@dataclass(frozen=True)
class StepMessage:
    """One model call's assistant message for `step_messages_insert`: as `message_insert`
    takes it, with its parent known (the step's path tip)."""

    session_id: uuid.UUID | str
    fields: dict[str, Any]
    dedupe_key: str
    context_tokens: int | None
    parent_seq: int


class AlreadyWritten(Exception):
    """A batch of step messages met a dedupe key already written: a replayed step, which
    `message_insert` (one at a time) answers with the message it finds."""


def step_messages_insert(items: list[StepMessage], *, when: Any = None) -> list[Message]:
    """Model calls' messages, many sessions at once, inside the caller's transaction: what
    `message_insert` does for each, in three statements however many (a wave of turns
    ending together queued one transaction each on the worker's database thread). Each
    session at most once. Each message goes under its `parent_seq`, and becomes the active
    leaf when that was it; the session's context size is set when one is given.

    Raises `Session.DoesNotExist` when a session is gone and `AlreadyWritten` when a key
    is found; the caller's transaction then rolls back, and the caller writes each alone."""
    if not items:
        return []
    pk = Session._meta.pk
    assert pk is not None
    session_ids = [_as_uuid(item.session_id) for item in items]
    if len(set(session_ids)) != len(session_ids):
        raise ValueError("one step per session in a batch")
    prep = [pk.get_db_prep_value(sid, connection) for sid in session_ids]
    table = connection.ops.quote_name(Session._meta.db_table)
    column = connection.ops.quote_name
    key, active, context = column(pk.column), column("active_seq"), column("last_context_tokens")
    updated = Session._meta.get_field("updated_at")
    params: list[Any] = [updated.get_db_prep_value(when or timezone.now(), connection)]
    # As `session_take_seq` for each (every SET expression reads the row as it was, so
    # `next_seq` there is the new message's number), for the lot.
    moves = " ".join(f"WHEN {key} = %s AND {active} = %s THEN {column('next_seq')}" for _ in items)
    for sid, item in zip(prep, items, strict=True):
        params += [sid, item.parent_seq]
    sets = [
        f"{column('next_seq')} = {column('next_seq')} + 1",
        f"{column('updated_at')} = %s",
        f"{active} = CASE {moves} ELSE {active} END",
    ]
    sized = [(sid, item.context_tokens) for sid, item in zip(prep, items, strict=True)]
    sized = [(sid, tokens) for sid, tokens in sized if tokens is not None]
    if sized:
        whens = " ".join(f"WHEN {key} = %s THEN %s" for _ in sized)
        sets.append(f"{context} = CASE {whens} ELSE {context} END")
        params += [value for pair in sized for value in pair]
    marks = ", ".join(["%s"] * len(prep))
    with connection.cursor() as cursor:
        # Only quoted identifiers are interpolated; every value is a parameter.
        cursor.execute(
            f"UPDATE {table} SET {', '.join(sets)} WHERE {key} IN ({marks}) "  # noqa: S608
            f"RETURNING {key}, {column('next_seq')} - 1",
            [*params, *prep],
        )
        taken = {_as_uuid(row[0]): int(row[1]) for row in cursor.fetchall()}
    missing = [sid for sid in session_ids if sid not in taken]
    if missing:
        raise Session.DoesNotExist(f"no session {missing[0]}")
    wanted = {(sid, item.dedupe_key) for sid, item in zip(session_ids, items, strict=True)}
    found = _KEYED.rows(session_ids=session_ids, keys=[item.dedupe_key for item in items])
    if any((_as_uuid(sid), dedupe_key) in wanted for sid, dedupe_key in found):
        raise AlreadyWritten()
    messages = [
        Message(
            session_id=sid,
            seq=taken[sid],
            dedupe_key=item.dedupe_key,
            parent_seq=item.parent_seq,
            **item.fields,
        )
        for sid, item in zip(session_ids, items, strict=True)
    ]
    rows_insert(messages)
    return messages


# Which of a batch's messages were written already: compiled once for any batch size.
_KEYED = PreparedQuery(
    lambda session_ids, keys: Message.objects.filter(
        AnyOf(F("session_id"), session_ids), AnyOf(F("dedupe_key"), keys)
    ).values_list("session_id", "dedupe_key"),
    session_ids=list[uuid.UUID],
    keys=list[str],
)


def _as_uuid(value: uuid.UUID | str) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


# --- turns -----------------------------------------------------------------------------


# --- the web app: session management ---------------------------------------------------

# Titles are a line in a list: long enough to recognise a conversation, short enough to fit.
TITLE_MAX_CHARS = 80


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
    model = model_check(user=session.owner, model=model)
    session.model = model
    session.save(update_fields=["model"])
    return session


def user_set_default_model(*, user: Any, model: str) -> str:
    model = model.strip()
    if model:  # empty resets to the site default
        model = model_check(user=user, model=model)
    UserPreferences.objects.update_or_create(user=user, defaults={"default_model": model})
    return model


def session_title_save(*, session_id: uuid.UUID | str, title: str) -> str:
    """Store the title unless the user set one meanwhile; returns the session's title."""
    if Session.objects.filter(pk=session_id, title="").update(title=title):
        return title
    return Session.objects.filter(pk=session_id).values_list("title", flat=True).first() or ""


def session_titles_save(titles: list[tuple[uuid.UUID | str, str]]) -> list[str]:
    """`session_title_save` for many sessions in two statements (a wave of new sessions'
    turns ends together; the first written out): each title stored unless the session
    has one, and each session's title returned, in order ("" for a session gone). A
    session named twice keeps the first title, as two saves in a row would."""
    if len(titles) == 1:
        session_id, title = titles[0]
        return [session_title_save(session_id=session_id, title=title)]
    ids = [_as_uuid(session_id) for session_id, _ in titles]
    first: dict[uuid.UUID, str] = {}
    for sid, (_, title) in zip(ids, titles, strict=True):
        first.setdefault(sid, title)
    # Written out over a VALUES list: the ORM's CASE of a WHEN per session resolved and
    # copied an expression per row on the worker's database thread, holding the GIL
    # (a fifth of that thread's CPU per turn at K = 1000, docs/PERFORMANCE.md session 16).
    q = connection.ops.quote_name
    fields = [Session._meta.get_field(name) for name in ("id", "title")]
    values, params = values_rows(fields, first.items())
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {q(Session._meta.db_table)} AS s SET {q('title')} = v.column2 "  # noqa: S608
            f"FROM (VALUES {values}) AS v WHERE s.{q('id')} = v.column1 AND s.{q('title')} = ''",
            params,
        )
    stored = dict(Session.objects.filter(pk__in=ids).values_list("pk", "title"))
    return [stored.get(sid, "") for sid in ids]


def session_import(
    *,
    owner: Any,
    title: str,
    model: str,
    messages: list[dict[str, Any]],
    attachments: list[Any] | None = None,
    parents: list[int | None] | None = None,
    active_leaf: int | None = None,
) -> Session:
    """A new session of `owner` holding `messages` (already validated canonical dicts, in
    order) and the `attachments` they refer to (`sessions.importing.ImportedAttachment`:
    parts name them by the exporter's id). The tree: `parents[i]` is the index of message
    i's parent (None: a first message), `active_leaf` the index of the active leaf; without
    `parents`, one line ending at the last message. All or nothing: files written for a
    failed import are removed again. Turn links are not imported."""
    written: list[Any] = []
    try:
        with transaction.atomic():
            session = Session.objects.create(
                owner=owner,
                title=" ".join(title.split())[:TITLE_MAX_CHARS],
                model=model or settings.DEFAULT_MODEL,
            )
            ids = _import_attachments(owner, session, attachments or [], written)
            batch: list[Message] = []
            seq = 0
            for seq, message in enumerate(messages, start=1):
                content = message.get("content", "")
                if isinstance(content, list):
                    content = [_imported_part(part, ids) for part in content]
                if parents is None:
                    parent = seq - 1 or None
                else:
                    found = parents[seq - 1]
                    parent = found + 1 if found is not None else None
                batch.append(
                    Message(
                        session=session,
                        seq=seq,
                        parent_seq=parent,
                        continuation=message.get("continuation", "") if parent else "",
                        role=message["role"],
                        content=content,
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
            leaf = active_leaf + 1 if active_leaf is not None else (seq or None)
            Session.objects.filter(pk=session.pk).update(next_seq=seq + 1, active_seq=leaf)
    except BaseException:
        for stored in written:
            stored.file.storage.delete(stored.file.name)
        raise
    session.refresh_from_db()
    return session


def _import_attachments(
    owner: Any, session: Session, attachments: list[Any], written: list[Any]
) -> dict[str, dict[str, Any]]:
    """Exporter's id → the owner's attachment (meta for parts); reuses an upload the owner
    already has (same SHA-256), as uploads do."""
    out: dict[str, dict[str, Any]] = {}
    for item in attachments:
        existing = Attachment.objects.filter(owner=owner, sha256=item.sha256).first()
        if existing is None:
            existing = Attachment(
                owner=owner,
                session=session,
                name=item.name[:255],
                mime=item.mime,
                size=len(item.data),
                sha256=item.sha256,
            )
            existing.file.save(item.sha256, ContentFile(item.data), save=False)
            written.append(existing)
            existing.save()
        out[item.id] = attachment_meta(existing)
    return out


def _imported_part(part: dict[str, Any], ids: dict[str, dict[str, Any]]) -> dict[str, Any]:
    meta = part.get("attachment")
    if part.get("type") not in ("image_url", "file") or not isinstance(meta, dict):
        return part
    found = ids.get(str(meta.get("id")))
    if found is None:
        return {"type": "text", "text": f"[attachment not in the export: {meta.get('name')}]"}
    return attachment_part(found)
