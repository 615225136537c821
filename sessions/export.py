"""Export of sessions (JSON, Markdown, a zip of all of a user's sessions) and import of our
own JSON into a new session.

Everything is streamed: generators over `.iterator()` querysets, so memory stays flat
however long the session (the views wrap them in `StreamingHttpResponse`). The zip is
written to a non-seekable sink (zipfile then uses data descriptors) and yielded chunk by
chunk.

No secrets: an export is built only from the session, its turns, messages and checkpoints.
Provider profiles (keys, base URLs) are never read here. Messages keep their provider
sidecars (`extras`: thinking signatures and the like) because the JSON export is the
lossless canonical transcript and the import needs them to continue a session faithfully.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import uuid
import zipfile
from collections.abc import Iterable, Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone

from sessions import importing, selectors
from sessions.models import Attachment, CompactionCheckpoint, Message, Session, Turn

logger = logging.getLogger(__name__)

EXPORT_FORMAT = importing.EXPORT_FORMAT
EXPORT_VERSION = importing.EXPORT_VERSION
# Rows fetched per database round trip while streaming.
CHUNK_ROWS = 500
# Zip output is yielded once this much has accumulated (fewer, larger HTTP chunks).
ZIP_FLUSH_BYTES = 256 * 1024
USAGE_BUCKETS = ("input", "output", "cache_read", "cache_write")


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=_json_default)


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def message_record(message: Message) -> dict[str, Any]:
    """The canonical message plus its transcript metadata (display fields, position)."""
    record: dict[str, Any] = {
        "seq": message.seq,
        "parent": message.parent_seq,
        **message.to_canonical(),
    }
    if message.model:
        record["model"] = message.model
    if message.finish_reason:
        record["finish_reason"] = message.finish_reason
    if message.turn_id:
        record["turn"] = str(message.turn_id)
    record["created_at"] = _iso(message.created_at)
    return record


def _turn_record(turn: Turn) -> dict[str, Any]:
    return {
        "id": str(turn.pk),
        "status": turn.status,
        "model": turn.model,
        "usage": turn.usage,
        "cost": str(turn.cost) if turn.cost is not None else None,
        "error_kind": turn.error_kind,
        "created_at": _iso(turn.created_at),
        "finished_at": _iso(turn.finished_at),
    }


def _checkpoint_record(checkpoint: CompactionCheckpoint) -> dict[str, Any]:
    return {
        "boundary_seq": checkpoint.boundary_seq,
        "summary": checkpoint.summary,
        "tokens_before": checkpoint.tokens_before,
        "tokens_after": checkpoint.tokens_after,
        "created_at": _iso(checkpoint.created_at),
    }


def _messages(session: Session) -> Iterator[Message]:
    return Message.objects.filter(session=session).order_by("seq").iterator(chunk_size=CHUNK_ROWS)


def _active_path(session: Session) -> Iterator[Message]:
    """The Markdown export's messages: the path the page shows (the whole tree is JSON's)."""
    rows = selectors.path_rows(session_id=session.pk, leaf_seq=session.active_seq)
    return rows.order_by("seq").iterator(chunk_size=CHUNK_ROWS)


def _array(records: Iterable[dict[str, Any]]) -> Iterator[str]:
    yield "["
    first = True
    for record in records:
        yield ("\n  " if first else ",\n  ") + _dumps(record)
        first = False
    yield "\n]" if not first else "]"


def session_json_chunks(session: Session) -> Iterator[str]:
    """The session as one JSON document, produced piece by piece."""
    head = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported_at": timezone.now().isoformat(),
        "session": {
            "id": str(session.pk),
            "title": session.title,
            "model": session.model,
            "archived": session.archived,
            "active_leaf": session.active_seq,
            "created_at": _iso(session.created_at),
            "updated_at": _iso(session.updated_at),
        },
    }
    yield _dumps(head)[:-1]  # reopen the object: the arrays follow
    yield ',\n"messages": '
    referenced: set[uuid.UUID] = set()

    def records() -> Iterator[dict[str, Any]]:
        for message in _messages(session):
            referenced.update(attachment_ids(message.content))
            yield message_record(message)

    yield from _array(records())
    totals: dict[str, Any] = {bucket: 0 for bucket in USAGE_BUCKETS}
    cost: Decimal | None = Decimal(0)
    priced_any = False

    def turns() -> Iterator[dict[str, Any]]:
        nonlocal cost, priced_any
        rows = Turn.objects.filter(session=session).order_by("created_at")
        for turn in rows.iterator(chunk_size=CHUNK_ROWS):
            for bucket in USAGE_BUCKETS:
                totals[bucket] += int((turn.usage or {}).get(bucket) or 0)
            if turn.cost is not None:
                priced_any = True
                if cost is not None:
                    cost += turn.cost
            elif turn.steps:
                cost = None  # one unpriced call makes the total unknown
            yield _turn_record(turn)

    yield ',\n"turns": '
    yield from _array(turns())
    yield ',\n"checkpoints": '
    checkpoints = CompactionCheckpoint.objects.filter(session=session).order_by("created_at")
    yield from _array(_checkpoint_record(c) for c in checkpoints.iterator(chunk_size=CHUNK_ROWS))
    usage = {**totals, "cost": str(cost) if cost is not None and priced_any else None}
    yield ',\n"usage": ' + _dumps(usage)
    # The files the messages show travel with them (base64), one at a time.
    yield ',\n"attachments": '
    yield from _array(_attachment_records(session, referenced))
    yield "\n}\n"


def attachment_ids(content: Any) -> set[uuid.UUID]:
    """The attachment ids a message's parts name (malformed parts name none)."""
    out: set[uuid.UUID] = set()
    for part in content if isinstance(content, list) else ():
        meta = part.get("attachment") if isinstance(part, dict) else None
        if isinstance(meta, dict):
            try:
                out.add(uuid.UUID(str(meta.get("id"))))
            except ValueError:
                continue
    return out


def _attachment_records(session: Session, ids: set[uuid.UUID]) -> Iterator[dict[str, Any]]:
    rows = Attachment.objects.filter(owner_id=session.owner_id, pk__in=ids).order_by("pk")
    for attachment in rows.iterator(chunk_size=20):
        try:
            with attachment.file.open("rb") as handle:
                data = handle.read()
        except OSError:
            logger.warning("attachment %s has no file; left out of the export", attachment.pk)
            continue
        yield {
            "id": str(attachment.pk),
            "name": attachment.name,
            "mime": attachment.mime,
            "size": len(data),
            "sha256": attachment.sha256,
            "data": base64.b64encode(data).decode("ascii"),
        }


# --- Markdown ------------------------------------------------------------------------------


def _fence(text: str, lang: str = "") -> str:
    """A code fence longer than any backtick run inside `text` (so it cannot close early)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text}\n{ticks}"


def _content_markdown(content: Any) -> str:
    if isinstance(content, str):
        return content
    pieces = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        # A stored session is data: a part of any shape renders as something, never raises.
        meta = _dict(part.get("attachment"))
        if kind == "text":
            pieces.append(str(part.get("text", "")))
        elif kind == "image_url":
            pieces.append(f"*[image: {meta.get('name') or 'image'}]*")
        elif kind == "file":
            name = meta.get("name") or _dict(part.get("file")).get("filename") or "file"
            pieces.append(f"*[file: {name}]*")
    return "\n\n".join(pieces)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _message_markdown(message: Message) -> str:
    out = []
    if message.role == "user":
        out.append("## User")
    elif message.role == "assistant":
        out.append(f"## Assistant{f' ({message.model})' if message.model else ''}")
    elif message.role == "tool":
        tool = _dict(message.extras).get("tool") or "tool"
        out.append(f"### Tool result: {tool}")
    else:
        out.append(f"## {message.role.title()}")
    if message.reasoning:
        quoted = "\n".join(f"> {line}" for line in message.reasoning.splitlines())
        out.append(f"> **Reasoning**\n>\n{quoted}")
    text = _content_markdown(message.content)
    if message.role == "tool":
        out.append(_fence(text))
    elif text:
        out.append(text)
    for call in message.tool_calls if isinstance(message.tool_calls, list) else []:
        call = _dict(call)
        arguments = json.dumps(call.get("arguments"), indent=2, ensure_ascii=False, default=str)
        out.append(f"**Tool call:** `{call.get('name', '')}`\n\n{_fence(arguments, 'json')}")
    return "\n\n".join(out) + "\n\n"


def session_markdown_chunks(session: Session) -> Iterator[str]:
    title = session.title or f"Session {str(session.pk)[:8]}"
    yield f"# {title}\n\n"
    yield f"- Model: {session.model}\n- Created: {_iso(session.created_at)}\n\n"
    checkpoints = {
        c.boundary_seq: c
        for c in CompactionCheckpoint.objects.filter(session=session).order_by("created_at")
    }
    others = selectors.branch_count(session=session)
    if others:
        yield (
            f"*This shows the active branch; {others} other "
            f"branch{'es' if others != 1 else ''} exist{'s' if others == 1 else ''} "
            "(the JSON export has them all).*\n\n"
        )
    for message in _active_path(session):
        checkpoint = checkpoints.get(message.seq)
        if checkpoint is not None:
            yield f"---\n\n*Earlier messages were summarised:*\n\n{checkpoint.summary}\n\n---\n\n"
        yield _message_markdown(message)


# --- the archive of all sessions --------------------------------------------------------


class _Sink:
    """A write-only, non-seekable file for zipfile; `take()` hands out what was written."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self.size = 0

    def write(self, data: bytes) -> int:
        self._chunks.append(bytes(data))
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        return None

    def take(self) -> bytes:
        data = b"".join(self._chunks)
        self._chunks.clear()
        self.size = 0
        return data


def _slug(text: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()
    return slug[:40] or "session"


def archive_chunks(sessions: Iterable[Session]) -> Iterator[bytes]:
    """A zip of every session as `<title>-<id>.json` and `.md`, streamed."""
    sink = _Sink()
    with zipfile.ZipFile(sink, mode="w", compression=zipfile.ZIP_DEFLATED) as archive:  # type: ignore[arg-type]
        for session in sessions:
            stem = f"{_slug(session.title)}-{str(session.pk)[:8]}"
            for name, chunks in (
                (f"{stem}.json", session_json_chunks(session)),
                (f"{stem}.md", session_markdown_chunks(session)),
            ):
                info = zipfile.ZipInfo(name, date_time=timezone.now().timetuple()[:6])
                info.compress_type = zipfile.ZIP_DEFLATED
                with archive.open(info, mode="w", force_zip64=True) as entry:
                    for chunk in chunks:
                        entry.write(chunk.encode())
                        if sink.size >= ZIP_FLUSH_BYTES:
                            yield sink.take()
                yield sink.take()
    yield sink.take()
