"""Canonical history → the provider-independent `Context` (seed 002).

Every wire translation starts here, so the rules that hold for all providers live in one
place: system messages are lifted out into `system_prompt`, `reasoning` (display only)
and `usage` (bookkeeping) never reach a provider, and the caller's canonical history is
never mutated: the Context holds deep copies, so a translation may rewrite them freely.

`extras` stay on the messages: the owning translation re-attaches its own sidecar
(`_anthropic` thinking signatures...) and every other translation ignores keys it does
not own.

Cross-provider handoff (a session may switch model mid-conversation) is settled here too,
so every wire API gets the same repaired dialogue without code of its own:

- Reasoning becomes nothing. `reasoning` is display only: it is never replayed as hidden
  thinking (only a provider's own signed sidecar can be, and only to the model that
  signed it) nor as plain text (another model would read its predecessor's private notes
  as something it said). An assistant message left with no text and no tool calls (it
  only reasoned) is dropped.
- Tool-call ids are made valid for every target: an id matching `VALID_TOOL_CALL_ID`
  (Anthropic, Bedrock and OpenAI all accept it) and not already used earlier in the
  history is kept byte for byte, so same-model replays (signatures, encrypted reasoning)
  stay intact. Any other id (invalid characters such as `call:1/abc`, too long, missing,
  or a repeat of an earlier call's id) is rewritten to a synthetic id derived from the
  original id, the call's name and how often that id occurred before, and its results
  follow it. Deterministic and prefix-stable: the same history gives the same ids on
  every request, and appending to it never changes an earlier id (prompt caching).
- A tool result answers a call of the assistant message directly before its run of tool
  messages. A call left without a result when the dialogue moves on (the next user or
  assistant message, or the end) gets a synthetic error result (`is_error: True`, the
  call's `name`), so every API sees each call answered. A result that answers no open
  call (its call is unknown, already answered, or an earlier turn's) is dropped, never
  turned into user text: tool output must not gain the authority of the user's own
  words, and without its call it means nothing to the model.
- A failure the engine recorded as `extras["is_error"]` on a tool result is lifted to a
  top-level `is_error`, the flag every translation reads.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .json_copy import json_copy, json_copy_all
from .types import Context

# Joining several system messages: a blank line keeps them readable as separate
# paragraphs without inventing any markup a model might read as structure.
SYSTEM_JOINER = "\n\n"

# Keys stripped from every message before any provider sees it.
STRIPPED_KEYS = ("reasoning", "usage")

# A tool-call id every target API accepts: Anthropic wants `^[a-zA-Z0-9_-]+$`, Bedrock's
# toolUseId the same set in 1..64 characters, OpenAI at most 64 characters.
VALID_TOOL_CALL_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_INVALID_ID_CHARS = re.compile(r"[^a-zA-Z0-9_-]+")
# A rewritten id is `<stem>_<digest>`: the stem keeps the original recognisable in logs,
# the digest keeps two originals that sanitise alike apart. 40 + 1 + 16 <= 64.
SYNTHETIC_ID_STEM_CHARS = 40
SYNTHETIC_ID_DIGEST_CHARS = 16
# The stem of an id rewritten from a missing one.
MISSING_ID_STEM = "call"
# The content of the result made up for a call that never got one.
ORPHANED_CALL_RESULT = (
    "Error: this tool call was not executed, so it has no result. "
    "Call the tool again if its result is still needed."
)

_DATA_URL = re.compile(
    r"^data:(?P<media>[^;,]+)?(?P<params>(;[^;,]*)*?);base64,(?P<data>.*)$", re.S
)


def build_context(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Context:
    """Lift system messages into `system_prompt`, copy the rest without display-only keys,
    and repair the dialogue for whichever model receives it (see the module docstring).

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
        copied = json_copy(message)
        for key in STRIPPED_KEYS:
            copied.pop(key, None)
        if copied.get("role") == "tool":
            _lift_tool_result_flags(copied)
        if copied.get("role") == "assistant" and _is_empty_assistant(copied):
            continue
        dialogue.append(copied)
    return Context(
        system_prompt=SYSTEM_JOINER.join(system_parts) if system_parts else None,
        messages=repair_tool_calls(dialogue),
        tools=json_copy_all(tools or []),
    )


def _lift_tool_result_flags(message: dict[str, Any]) -> None:
    """The engine records a tool result's failure as `extras["is_error"]`; translations read
    a top-level `is_error` (Anthropic `is_error`, Bedrock `status`, Gemini `error`)."""
    extras = message.get("extras")
    if "is_error" not in message and isinstance(extras, dict) and extras.get("is_error"):
        message["is_error"] = True


def _is_empty_assistant(message: dict[str, Any]) -> bool:
    """No words, no other parts, no calls: what is left of a message that only reasoned."""
    if message.get("tool_calls"):
        return False
    for part in content_parts(message.get("content")):
        if part.get("type") != "text" or str(part.get("text") or "").strip():
            return False
    return True


# --- tool-call repair ---------------------------------------------------------------------


@dataclass
class _OpenCall:
    original: str | None
    id: str
    name: str
    answered: bool = False


@dataclass
class _OpenCalls:
    """The calls of one assistant message, waiting for their results."""

    calls: list[_OpenCall] = field(default_factory=list)

    def claim(self, tool_call_id: Any) -> str | None:
        """The (rewritten) id a result answers: the first unanswered call whose original
        id it names (a missing id names a call whose id was missing); None if none."""
        wanted = tool_call_id if isinstance(tool_call_id, str) and tool_call_id else None
        for call in self.calls:
            if not call.answered and call.original == wanted:
                call.answered = True
                return call.id
        return None

    def synthetic_results(self) -> list[dict[str, Any]]:
        return [
            {
                "role": "tool",
                "tool_call_id": call.id,
                "name": call.name,
                "content": ORPHANED_CALL_RESULT,
                "is_error": True,
            }
            for call in self.calls
            if not call.answered
        ]


def synthetic_tool_call_id(original: str | None, name: str, occurrence: int, salt: int = 0) -> str:
    """A valid id for a call whose own id cannot be sent as is.

    Derived only from the original id, the call's name and how many calls with the same
    original id came before it (plus a salt bumped on the astronomically rare clash), so
    the same history always yields the same id.
    """
    stem = _INVALID_ID_CHARS.sub("_", original or "").strip("_")[:SYNTHETIC_ID_STEM_CHARS]
    seed = "\x00".join((original or "", name, str(occurrence), str(salt)))
    digest = hashlib.sha256(seed.encode()).hexdigest()[:SYNTHETIC_ID_DIGEST_CHARS]
    return f"{stem or MISSING_ID_STEM}_{digest}"


def repair_tool_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Valid, unique tool-call ids with results remapped; orphans repaired (module docstring).

    Works in place on `messages` (build_context's own copies) and returns the repaired
    list. Keeps valid unique ids untouched, so a history that needs no repair comes back
    unchanged.
    """
    out: list[dict[str, Any]] = []
    emitted: set[str] = set()
    occurrences: Counter[str] = Counter()
    pending: _OpenCalls | None = None
    for message in messages:
        role = message.get("role")
        if role == "tool":
            tool_call_id = pending.claim(message.get("tool_call_id")) if pending else None
            if tool_call_id is None:
                continue  # an orphaned result: dropped
            message["tool_call_id"] = tool_call_id
            out.append(message)
            continue
        if pending is not None:
            out.extend(pending.synthetic_results())
            pending = None
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls:
            pending = _OpenCalls()
            for call in calls:
                original = call.get("id") if isinstance(call.get("id"), str) else None
                original = original or None
                name = str(call.get("name") or "")
                call["id"] = _assign_id(original, name, emitted, occurrences)
                pending.calls.append(_OpenCall(original=original, id=call["id"], name=name))
        out.append(message)
    if pending is not None:
        out.extend(pending.synthetic_results())
    return out


def _assign_id(
    original: str | None, name: str, emitted: set[str], occurrences: Counter[str]
) -> str:
    occurrence = occurrences[original or ""]
    occurrences[original or ""] += 1
    if original is not None and VALID_TOOL_CALL_ID.fullmatch(original) and original not in emitted:
        new_id = original
    else:
        salt = 0
        new_id = synthetic_tool_call_id(original, name, occurrence)
        while new_id in emitted:
            salt += 1
            new_id = synthetic_tool_call_id(original, name, occurrence, salt)
    emitted.add(new_id)
    return new_id


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
