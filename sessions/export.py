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

import json
import re
import zipfile
from collections.abc import Iterable, Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone

from sessions.models import CompactionCheckpoint, Message, Session, Turn

EXPORT_FORMAT = "openworker.session"
EXPORT_VERSION = 1
# Rows fetched per database round trip while streaming.
CHUNK_ROWS = 500
# Zip output is yielded once this much has accumulated (fewer, larger HTTP chunks).
ZIP_FLUSH_BYTES = 256 * 1024
ROLES = {"system", "user", "assistant", "tool"}
USAGE_BUCKETS = ("input", "output", "cache_read", "cache_write")


class ImportRejected(Exception):
    """The uploaded file is not an export we can import; the message is for the user."""


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
    record: dict[str, Any] = {"seq": message.seq, **message.to_canonical()}
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
            "created_at": _iso(session.created_at),
            "updated_at": _iso(session.updated_at),
        },
    }
    yield _dumps(head)[:-1]  # reopen the object: the arrays follow
    yield ',\n"messages": '
    yield from _array(message_record(m) for m in _messages(session))
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
    yield ',\n"usage": ' + _dumps(usage) + "\n}\n"


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
        meta = part.get("attachment") or {}
        if kind == "text":
            pieces.append(str(part.get("text", "")))
        elif kind == "image_url":
            pieces.append(f"*[image: {meta.get('name') or 'image'}]*")
        elif kind == "file":
            name = meta.get("name") or (part.get("file") or {}).get("filename") or "file"
            pieces.append(f"*[file: {name}]*")
    return "\n\n".join(pieces)


def _message_markdown(message: Message) -> str:
    out = []
    if message.role == "user":
        out.append("## User")
    elif message.role == "assistant":
        out.append(f"## Assistant{f' ({message.model})' if message.model else ''}")
    elif message.role == "tool":
        tool = (message.extras or {}).get("tool") or "tool"
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
    for call in message.tool_calls or []:
        arguments = json.dumps(call.get("arguments"), indent=2, ensure_ascii=False)
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
    for message in _messages(session):
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


# --- import --------------------------------------------------------------------------------


def _check_message(index: int, raw: Any) -> dict[str, Any]:
    where = f"Message {index + 1}"
    if not isinstance(raw, dict):
        raise ImportRejected(f"{where} is not an object.")
    role = raw.get("role")
    if role not in ROLES:
        raise ImportRejected(f"{where} has an unknown role.")
    content = raw.get("content", "")
    if not isinstance(content, str) and not (
        isinstance(content, list) and all(isinstance(p, dict) for p in content)
    ):
        raise ImportRejected(f"{where} has content that is neither text nor a list of parts.")
    tool_calls = raw.get("tool_calls")
    if tool_calls is not None and not (
        isinstance(tool_calls, list)
        and all(isinstance(c, dict) and isinstance(c.get("id"), str) for c in tool_calls)
    ):
        raise ImportRejected(f"{where} has malformed tool calls.")
    out: dict[str, Any] = {"role": role, "content": content}
    if tool_calls:
        out["tool_calls"] = tool_calls
    for key in ("tool_call_id", "reasoning", "model", "finish_reason"):
        value = raw.get(key, "")
        if not isinstance(value, str):
            raise ImportRejected(f"{where}: {key} must be text.")
        if value:
            out[key] = value
    for key in ("extras", "usage"):
        value = raw.get(key)
        if value is not None and not isinstance(value, dict):
            raise ImportRejected(f"{where}: {key} must be an object.")
        if value:
            out[key] = value
    return out


def parse_export(data: bytes) -> tuple[str, str, list[dict[str, Any]]]:
    """(title, model, canonical messages) from the bytes of one of our JSON exports."""
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise ImportRejected("The file is not valid JSON.") from None
    if not isinstance(document, dict) or document.get("format") != EXPORT_FORMAT:
        raise ImportRejected("The file is not an OpenWorker session export.")
    if document.get("version") != EXPORT_VERSION:
        raise ImportRejected("This export was made by a version we cannot read.")
    meta = document.get("session") or {}
    messages = document.get("messages")
    if not isinstance(meta, dict) or not isinstance(messages, list):
        raise ImportRejected("The export has no messages.")
    if isinstance(messages, list) and messages and "seq" in messages[0]:
        messages = sorted(messages, key=lambda m: m.get("seq", 0) if isinstance(m, dict) else 0)
    checked = [_check_message(i, m) for i, m in enumerate(messages)]
    title = meta.get("title") if isinstance(meta.get("title"), str) else ""
    model = meta.get("model") if isinstance(meta.get("model"), str) else ""
    return title, model, checked
