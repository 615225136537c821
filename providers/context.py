"""Canonical history → the provider-independent `Context` (seed 002).

Every wire translation starts here, so the rules that hold for all providers live in one
place: system messages are lifted out into `system_prompt`, `reasoning` (display only)
and `usage` (bookkeeping) never reach a provider, and the caller's canonical history is
never mutated: the Context holds deep copies, so a translation may rewrite them freely.

`extras` stay on the messages: the owning translation re-attaches its own sidecar
(`_anthropic` thinking signatures...) and every other translation ignores keys it does
not own.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from .types import Context

# Joining several system messages: a blank line keeps them readable as separate
# paragraphs without inventing any markup a model might read as structure.
SYSTEM_JOINER = "\n\n"

# Keys stripped from every message before any provider sees it.
STRIPPED_KEYS = ("reasoning", "usage")

_DATA_URL = re.compile(
    r"^data:(?P<media>[^;,]+)?(?P<params>(;[^;,]*)*?);base64,(?P<data>.*)$", re.S
)


def build_context(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Context:
    """Lift system messages into `system_prompt` and copy the rest without sidecars.

    The returned messages and tools are deep copies: translations may add or drop keys
    (cache markers, wire fields) without touching the persisted history.
    """
    system_parts: list[str] = []
    dialogue: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") == "system":
            text = content_text(message.get("content"))
            if text:
                system_parts.append(text)
            continue
        copied = copy.deepcopy(message)
        for key in STRIPPED_KEYS:
            copied.pop(key, None)
        dialogue.append(copied)
    return Context(
        system_prompt=SYSTEM_JOINER.join(system_parts) if system_parts else None,
        messages=dialogue,
        tools=copy.deepcopy(list(tools or [])),
    )


def content_parts(content: Any) -> list[dict[str, Any]]:
    """Canonical content as a list of parts: a string becomes one text part, None none."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [part for part in content if isinstance(part, dict)]


def content_text(content: Any) -> str:
    """The text of canonical content, parts joined; non-text parts are skipped."""
    if isinstance(content, str):
        return content
    return "".join(
        str(part.get("text") or "") for part in content_parts(content) if part.get("type") == "text"
    )


def parse_data_url(url: str) -> tuple[str, str] | None:
    """`data:<media>;base64,<data>` → (media_type, data); None for any other URL."""
    match = _DATA_URL.match(url or "")
    if match is None:
        return None
    return (match.group("media") or "application/octet-stream"), match.group("data")
