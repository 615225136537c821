"""Import of our own JSON export: a schema-checked parse with limits, before anything is
saved. Pure functions: bytes in, a `ParsedImport` (or `ImportRejected` naming what is
wrong) out; `services.session_import` then writes it in one transaction.

The checks, in order, each with a message for the page:
1. size (the view refuses before reading past `MAX_IMPORT_BYTES`) and JSON syntax;
2. nesting depth (`MAX_DEPTH`) and every string free of NUL characters and lone
   surrogates (neither survives PostgreSQL, and neither is ever in an export of ours);
3. the JSON Schema of the export (`jsonschema`, Draft 2020-12): types, roles, lengths that
   match the database columns, counts of messages, parts, tool calls and attachments;
4. `seq` on every message or on none, never twice; a `parent` (version 2: the transcript
   as a tree) names an earlier message's seq; attachments decode (base64), match their
   declared size and SHA-256, and are a type an upload may be (sniffed by content).
Attachment parts that name an attachment the file does not carry become a short text note,
so an older export (before attachments travelled) still imports whole.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from sessions.attachments import sniff_mime

EXPORT_FORMAT = "openworker.session"
# 2: messages carry `parent` (and `continuation`), the session its `active_leaf`: the
# whole tree round-trips. Version 1 files (one line) still import.
EXPORT_VERSION = 2
READABLE_VERSIONS = (1, 2)
# Bounded so one upload cannot exhaust memory or the database (it is parsed whole).
MAX_IMPORT_BYTES = 50 * 1024 * 1024
# Our exports nest about eight levels (message → parts → attachment meta; tool arguments a
# few more); anything far deeper is not one of ours and would cost recursion to render.
MAX_DEPTH = 32
MAX_MESSAGES = 10_000
MAX_PARTS = 64
MAX_TOOL_CALLS = 128
MAX_ATTACHMENTS = 200
# One message's text: far above MAX_MESSAGE_CHARS (model replies are longer than prompts).
MAX_TEXT_CHARS = 1_000_000
# The widths of the columns these land in (sessions.models).
MODEL_CHARS = 200
TOOL_CALL_ID_CHARS = 200
FINISH_REASON_CHARS = 40
NAME_CHARS = 255
MIME_CHARS = 100
TITLE_CHARS = 500
ROLES = ["system", "user", "assistant", "tool"]
_UUID = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
_SURROGATE = re.compile("[\ud800-\udfff]")


class ImportRejected(Exception):
    """The uploaded file is not an export we can import; the message is for the user."""


def _text(max_chars: int) -> dict[str, Any]:
    return {"type": "string", "maxLength": max_chars}


_ATTACHMENT_META = {
    "type": "object",
    "properties": {
        # Any short id: one the file does not carry becomes a note (older exports).
        "id": _text(64),
        "name": _text(NAME_CHARS),
        "mime": _text(MIME_CHARS),
        "size": {"type": "integer", "minimum": 0},
    },
}
_PART = {
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {"enum": ["text", "image_url", "file"]},
        "text": _text(MAX_TEXT_CHARS),
        "attachment": _ATTACHMENT_META,
        "image_url": {"type": "object", "properties": {"url": _text(MAX_TEXT_CHARS)}},
        "file": {
            "type": "object",
            "properties": {"filename": _text(NAME_CHARS), "file_data": _text(MAX_TEXT_CHARS)},
        },
    },
    "if": {"properties": {"type": {"const": "text"}}},
    "then": {"required": ["text"]},
}
_TOOL_CALL = {
    "type": "object",
    "required": ["id", "name"],
    "properties": {
        "id": {**_text(TOOL_CALL_ID_CHARS), "minLength": 1},
        "name": _text(NAME_CHARS),
        "arguments": {},
    },
}
_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "seq": {"type": "integer", "minimum": 0},
        "parent": {"type": ["integer", "null"], "minimum": 0},
        "continuation": {"enum": ["", "prefill", "instruction"]},
        "role": {"enum": ROLES},
        "content": {
            "anyOf": [
                _text(MAX_TEXT_CHARS),
                {"type": "array", "maxItems": MAX_PARTS, "items": _PART},
            ]
        },
        "tool_calls": {
            "type": ["array", "null"],
            "maxItems": MAX_TOOL_CALLS,
            "items": _TOOL_CALL,
        },
        "tool_call_id": _text(TOOL_CALL_ID_CHARS),
        "reasoning": _text(MAX_TEXT_CHARS),
        "model": _text(MODEL_CHARS),
        "finish_reason": _text(FINISH_REASON_CHARS),
        "extras": {"type": ["object", "null"]},
        "usage": {
            "type": ["object", "null"],
            "additionalProperties": {"type": ["integer", "null"], "minimum": 0},
        },
    },
}
_ATTACHMENT = {
    "type": "object",
    "required": ["id", "data"],
    "properties": {
        "id": {"type": "string", "pattern": _UUID},
        "name": _text(NAME_CHARS),
        "mime": _text(MIME_CHARS),
        "size": {"type": "integer", "minimum": 1},
        "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        # base64 of at most MAX_ATTACHMENT_BYTES (checked again once decoded).
        "data": {"type": "string", "minLength": 1},
    },
}
EXPORT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["format", "version", "messages"],
    "properties": {
        "format": {"const": EXPORT_FORMAT},
        "version": {"enum": list(READABLE_VERSIONS)},
        "session": {
            "type": "object",
            "properties": {
                "title": _text(TITLE_CHARS),
                "model": _text(MODEL_CHARS),
                "active_leaf": {"type": ["integer", "null"], "minimum": 0},
            },
        },
        "messages": {"type": "array", "maxItems": MAX_MESSAGES, "items": _MESSAGE},
        "attachments": {"type": "array", "maxItems": MAX_ATTACHMENTS, "items": _ATTACHMENT},
    },
}
_VALIDATOR = Draft202012Validator(EXPORT_SCHEMA)


@dataclass(frozen=True)
class ImportedAttachment:
    """One attachment of the file, decoded and checked; `id` is the exporter's id."""

    id: str
    name: str
    mime: str
    data: bytes
    sha256: str


@dataclass(frozen=True)
class ParsedImport:
    title: str
    model: str
    messages: list[dict[str, Any]]
    attachments: list[ImportedAttachment] = field(default_factory=list)
    # The tree, by index into `messages`: each message's parent (None: a first message)
    # and the active leaf; `parents` None for a file that is one line (version 1).
    parents: list[int | None] | None = None
    active_leaf: int | None = None


# --- the steps ---------------------------------------------------------------------------


def _load(data: bytes) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        raise ImportRejected(f"The file nests deeper than {MAX_DEPTH} levels.") from None
    except (ValueError, UnicodeDecodeError):
        raise ImportRejected("The file is not valid JSON.") from None


def _where(path: list[str | int]) -> str:
    """`messages[3].content[0].text` (what the page names), or "The file" at the top."""
    if not path:
        return "The file"
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out


def _check_values(document: Any) -> None:
    """Depth and characters, without recursion (a hostile depth cannot cost a stack)."""
    stack: list[tuple[Any, list[str | int]]] = [(document, [])]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_DEPTH:
            raise ImportRejected(f"{_where(path[:4])}… nests deeper than {MAX_DEPTH} levels.")
        if isinstance(value, dict):
            for key, item in value.items():
                _check_string(key, path)
                stack.append((item, [*path, key]))
        elif isinstance(value, list):
            stack.extend((item, [*path, index]) for index, item in enumerate(value))
        elif isinstance(value, str):
            _check_string(value, path)


def _check_string(value: str, path: list[str | int]) -> None:
    if "\x00" in value:
        raise ImportRejected(f"{_where(path)} contains a NUL character.")
    if _SURROGATE.search(value):
        raise ImportRejected(f"{_where(path)} contains an unpaired surrogate (not valid text).")


def _schema_message(error: ValidationError) -> str:
    """A sentence naming where and what, never echoing a huge value back."""
    where = _where(list(error.absolute_path))
    kind, limit = error.validator, error.validator_value
    if kind == "maxLength":
        return f"{where} is longer than {limit:,} characters."
    if kind == "minLength":
        return f"{where} is empty."
    if kind == "maxItems":
        return f"{where} has more than {limit:,} entries."
    if kind == "type":
        expected = " or ".join(limit) if isinstance(limit, list) else limit
        return f"{where} must be of type {expected}."
    if kind == "enum":
        return f"{where} must be one of: {', '.join(map(str, limit))}."
    if kind == "const" and error.absolute_path and error.absolute_path[-1] == "format":
        return "The file is not an OpenWorker session export."
    if kind == "const":
        return "This export was made by a version we cannot read."
    if kind == "required":
        return f"{where} lacks {error.message.split(' is a required')[0]}."
    if kind == "pattern":
        return f"{where} is not in the expected form."
    if kind == "anyOf":
        return f"{where} must be text or a list of parts."
    if kind in ("minimum", "maximum"):
        return f"{where} is out of range."
    return f"{where}: {error.message[:200]}"


def _check_schema(document: Any) -> None:
    if not isinstance(document, dict) or document.get("format") != EXPORT_FORMAT:
        raise ImportRejected("The file is not an OpenWorker session export.")
    if document.get("version") not in READABLE_VERSIONS:
        raise ImportRejected("This export was made by a version we cannot read.")
    errors = sorted(_VALIDATOR.iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        error = errors[0]
        # anyOf hides the real cause: report the branch that matches the value's shape.
        if error.validator == "anyOf" and error.context:
            shaped = [e for e in error.context if e.validator != "type"]
            error = shaped[0] if shaped else error
        raise ImportRejected(_schema_message(error))


def _order(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    with_seq = [m for m in messages if "seq" in m]
    if not with_seq:
        return messages
    if len(with_seq) != len(messages):
        raise ImportRejected("Either every message has a seq or none does.")
    seen: dict[int, int] = {}
    for index, message in enumerate(messages):
        if message["seq"] in seen:
            raise ImportRejected(
                f"messages[{seen[message['seq']]}] and messages[{index}] have the same seq."
            )
        seen[message["seq"]] = index
    return sorted(messages, key=lambda m: m["seq"])


def _attachments(raw: list[dict[str, Any]]) -> list[ImportedAttachment]:
    limit = settings.MAX_ATTACHMENT_BYTES
    out = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        where = f"attachments[{index}]"
        if len(item["data"]) > (limit * 4) // 3 + 4:
            raise ImportRejected(f"{where} is larger than {limit // (1024 * 1024)} MB.")
        try:
            data = base64.b64decode(item["data"], validate=True)
        except (binascii.Error, ValueError):
            raise ImportRejected(f"{where}.data is not base64.") from None
        if not data or len(data) > limit:
            raise ImportRejected(f"{where} is empty or larger than {limit // (1024 * 1024)} MB.")
        if "size" in item and item["size"] != len(data):
            raise ImportRejected(f"{where}.size does not match its data.")
        digest = hashlib.sha256(data).hexdigest()
        if "sha256" in item and item["sha256"] != digest:
            raise ImportRejected(f"{where}.sha256 does not match its data.")
        mime = sniff_mime(data[:16])
        if mime is None:
            raise ImportRejected(f"{where} is not a PNG, JPEG, GIF or WebP image or a PDF.")
        key = str(uuid.UUID(item["id"]))
        if key in seen:
            raise ImportRejected(f"{where}.id appears twice.")
        seen.add(key)
        out.append(ImportedAttachment(key, item.get("name") or "attachment", mime, data, digest))
    return out


def _message(raw: dict[str, Any], carried: set[str]) -> dict[str, Any]:
    content = raw.get("content", "")
    if isinstance(content, list):
        content = [_part(part, carried) for part in content]
    out: dict[str, Any] = {"role": raw["role"], "content": content}
    if raw.get("tool_calls"):
        out["tool_calls"] = raw["tool_calls"]
    for key in ("tool_call_id", "reasoning", "model", "finish_reason", "continuation"):
        if raw.get(key):
            out[key] = raw[key]
    for key in ("extras", "usage"):
        if raw.get(key):
            out[key] = raw[key]
    return out


def _part(part: dict[str, Any], carried: set[str]) -> dict[str, Any]:
    """Text as is; an attachment part only when the file carries its bytes, else a note."""
    if part["type"] == "text":
        return {"type": "text", "text": part["text"]}
    meta = part.get("attachment") or {}
    key = _uuid_text(meta.get("id"))
    name = meta.get("name") or ("image" if part["type"] == "image_url" else "file")
    if key not in carried:
        return {"type": "text", "text": f"[attachment not in the export: {name}]"}
    return {"type": part["type"], "attachment": {"id": key, "name": name}}


def _uuid_text(value: Any) -> str:
    try:
        return str(uuid.UUID(str(value))) if value else ""
    except ValueError:
        return ""


def parse_import(data: bytes) -> ParsedImport:
    """The checked content of one of our JSON exports, or ImportRejected saying what is
    wrong. Nothing is written here."""
    if len(data) > MAX_IMPORT_BYTES:
        raise ImportRejected(f"Imports are limited to {MAX_IMPORT_BYTES // (1024 * 1024)} MB.")
    document = _load(data)
    _check_values(document)
    _check_schema(document)
    attachments = _attachments(document.get("attachments") or [])
    carried = {a.id for a in attachments}
    ordered = _order(document["messages"])
    messages = [_message(m, carried) for m in ordered]
    meta = document.get("session") or {}
    parents, active = _tree(ordered, meta.get("active_leaf"))
    return ParsedImport(
        title=meta.get("title") or "",
        model=meta.get("model") or "",
        messages=messages,
        attachments=attachments,
        parents=parents,
        active_leaf=active,
    )


def _tree(
    ordered: list[dict[str, Any]], active_leaf: Any
) -> tuple[list[int | None] | None, int | None]:
    """(each message's parent as an index into `ordered`, the active leaf's index), or
    (None, None) for a file that is one line. A parent must be an earlier message (by
    seq), so the file is a tree with no cycle; the active leaf must be a message."""
    if not any("parent" in m for m in ordered):
        if active_leaf is not None:
            raise ImportRejected("session.active_leaf needs messages with a parent.")
        return None, None
    index = {m["seq"]: i for i, m in enumerate(ordered) if "seq" in m}
    if len(index) != len(ordered):
        raise ImportRejected("Messages with a parent need a seq.")
    parents: list[int | None] = []
    for message in ordered:
        parent = message.get("parent")
        if parent is None:
            parents.append(None)
            continue
        if parent not in index or parent >= message["seq"]:
            raise ImportRejected(
                f"messages (seq {message['seq']}).parent names no earlier message."
            )
        parents.append(index[parent])
    if active_leaf is None:
        return parents, len(ordered) - 1 if ordered else None
    if active_leaf not in index:
        raise ImportRejected("session.active_leaf names no message.")
    return parents, index[active_leaf]
