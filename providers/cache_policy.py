"""Where prompt-cache breakpoints go (seed 002 §六), read from the provider's `CacheSpec`.

`apply_cache_policy` is the automatic breakpoint policy for `cache_control` providers
(Anthropic): it marks the last tool and the latest user-side message, never overrides a
caller's own marks, and spends at most `max_breakpoints` counting the system breakpoint
and the caller's marks, dropping the lowest priority first: tools > system > messages.

For a plain conversation the outcome is the seed's two-breakpoint agent-loop shape:
- the system block, which caches tools + system together (tools render first);
- the last block of the final message, which caches the whole conversation prefix, so
  each request reads the previous turns' cache and writes only the new tail.
With tools, the last tool is marked too (tools stay cached when the system text changes).

Mixed TTLs: the API refuses a longer-lived breakpoint after a shorter-lived one in prompt
order (tools, system, messages), and a caller's own 1h mark can meet the policy's 5-minute
ones (or the reverse). So once placed, every breakpoint is raised to the longest TTL of
any breakpoint after it (`order_ttls_longest_first`): the caller's long mark keeps its
hour, and the prefixes before it, which its entry contains anyway, are kept as long.

Outbound only: the policy works on copies and the canonical history never carries cache
marks. The system breakpoint is not placed here: `Context.system_prompt` is one string,
so each provider's `_build_system` puts the returned `system` marker on that whole block.

Also here, so the other wire modules need one line each: `cache_point` (Bedrock's
`cachePoint` block) and `cache_request_fields` / `cache_request_headers` (the `auto`
providers' cache key).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .cache_spec import (
    FORMAT_CACHE_CONTROL,
    FORMAT_CACHE_POINT,
    CacheSpec,
    long_ttl_allowed,
    ttl_for_retention,
)
from .json_copy import json_copy_all

# Anthropic's (and Bedrock's) only tier above the 5-minute default is one hour: a wish for
# anything from an hour up gets it, anything shorter rides the default.
LONG_TTL_SECONDS = 3600
LONG_TTL = "1h"
EPHEMERAL = "ephemeral"
# The settings keys the engine passes: the session id as the cache key, and "short" /
# "long" (or a number of seconds) as the retention.
CACHE_KEY_SETTING = "cache_key"
CACHE_RETENTION_SETTING = "cache_retention"
CACHE_CONTROL = "cache_control"
# Canonical roles whose content the wire sends in the user turn (tool results do).
_USER_SIDE_ROLES = ("user", "tool")

Retention = str | int | float | None


# The vendor's default lifetime of a mark without `ttl` (Anthropic: five minutes).
DEFAULT_TTL_SECONDS = 300
_TTL_UNITS = {"s": 1, "m": 60, "h": 3600}


def ttl_seconds(marker: Mapping[str, Any]) -> int:
    """A cache_control marker's lifetime in seconds: "5m", "1h" (or "30s"); the default
    when it names none (or one this module cannot read)."""
    ttl = marker.get("ttl")
    if isinstance(ttl, str) and len(ttl) > 1 and ttl[:-1].isdigit() and ttl[-1] in _TTL_UNITS:
        return int(ttl[:-1]) * _TTL_UNITS[ttl[-1]]
    return DEFAULT_TTL_SECONDS


def _ttl_bucket(seconds: float) -> str | None:
    """≥ 3600 s → "1h", else None (the vendor's 5-minute default: no ttl key)."""
    return LONG_TTL if seconds >= LONG_TTL_SECONDS else None


def resolve_ttl(
    spec: CacheSpec, retention: Retention, *, base_url: str | None = None
) -> str | None:
    """The wire TTL for a retention: "short"/"long" through the declaration's map, a number
    of seconds through `_ttl_bucket` (the long tier only where the declaration allows it)."""
    if isinstance(retention, bool):
        raise TypeError("cache retention is 'short', 'long' or a number of seconds")
    if isinstance(retention, int | float):
        ttl = _ttl_bucket(retention)
        return ttl if ttl is None or long_ttl_allowed(spec, base_url) else None
    return ttl_for_retention(spec, retention, base_url=base_url)


def cache_marker(
    spec: CacheSpec, retention: Retention = None, *, base_url: str | None = None
) -> dict[str, Any]:
    """`{"type": "ephemeral"}` plus `ttl` when the retention asks for a longer tier."""
    marker: dict[str, Any] = {"type": EPHEMERAL}
    ttl = resolve_ttl(spec, retention, base_url=base_url)
    if ttl:
        marker["ttl"] = ttl
    return marker


@dataclass(frozen=True)
class CachePlan:
    """The outbound copies with breakpoints placed, and the marker for the system block
    (None: no system breakpoint). `dropped` counts caller marks removed for the budget."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    system: dict[str, Any] | None = None
    dropped: int = 0


@dataclass
class _Candidate:
    """One breakpoint that may be spent: `apply` places an automatic one, `strip` removes
    a caller's one that did not fit the budget."""

    caller: bool
    apply: Callable[[], None] | None = None
    strip: Callable[[], None] | None = None


def _renders(part: Mapping[str, Any]) -> bool:
    """Whether a canonical content part becomes a wire block (blank text is dropped)."""
    kind = part.get("type")
    if kind == "text":
        text = part.get("text")
        return isinstance(text, str) and bool(text.strip())
    if kind == "image_url":
        image = part.get("image_url")
        return bool(image.get("url") if isinstance(image, Mapping) else image)
    if kind == "file":
        file = part.get("file")
        return isinstance(file, Mapping) and bool(file.get("file_data"))
    return False


def _parts(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return [p for p in content if isinstance(p, dict)] if isinstance(content, list) else []


def _caller_message_marks(messages: list[dict[str, Any]]) -> list[_Candidate]:
    """The caller's own marks on messages, latest first (a later mark covers more)."""
    found: list[_Candidate] = []
    for message in messages:
        if message.get("role") == "tool" and message.get(CACHE_CONTROL):
            found.append(_Candidate(caller=True, strip=_popper(message)))
        for part in _parts(message):
            if part.get(CACHE_CONTROL):
                found.append(_Candidate(caller=True, strip=_popper(part)))
    return found[::-1]


def _popper(holder: dict[str, Any]) -> Callable[[], None]:
    return lambda: holder.pop(CACHE_CONTROL, None)


def _latest_user_mark(messages: list[dict[str, Any]], marker: dict[str, Any]) -> _Candidate | None:
    """The automatic breakpoint on the latest user-side message's last block, or None when
    the caller already marked that block (never overridden) or nothing renders."""
    for position in range(len(messages) - 1, -1, -1):
        message = messages[position]
        if message.get("role") not in _USER_SIDE_ROLES:
            continue
        if message.get("role") == "tool":
            # The whole tool_result block carries the mark (its content may be a string).
            if message.get(CACHE_CONTROL):
                return None
            return _Candidate(caller=False, apply=lambda m=message: _set(m, marker))
        content = message.get("content")
        if isinstance(content, str):
            if not content.strip():
                continue
            return _Candidate(caller=False, apply=lambda m=message: _mark_string(m, marker))
        renderable = [p for p in _parts(message) if _renders(p)]
        if not renderable:
            continue
        last = renderable[-1]
        if last.get(CACHE_CONTROL):
            return None
        return _Candidate(caller=False, apply=lambda p=last: _set(p, marker))
    return None


def _set(holder: dict[str, Any], marker: dict[str, Any]) -> None:
    holder[CACHE_CONTROL] = dict(marker)


def _mark_string(message: dict[str, Any], marker: dict[str, Any]) -> None:
    """A string content becomes the one text part it stands for, carrying the mark: the
    wire renders both as the same text block, so the bytes before the mark don't change."""
    message["content"] = [{"type": "text", "text": message["content"], CACHE_CONTROL: dict(marker)}]


def apply_cache_policy(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    spec: CacheSpec,
    retention: Retention = None,
    system: bool = False,
    base_url: str | None = None,
) -> CachePlan:
    """Place breakpoints on copies of `messages` (canonical, system lifted out) and `tools`.

    Pure: the inputs are never changed. `system` says whether the request has a system
    prompt (its breakpoint counts against the budget). Candidates in priority order: the
    caller's tool marks, the last tool, the system block, the caller's message marks
    (latest first), the latest user-side message (a user message or a tool result, which
    the wire sends in the user turn). Each takes one of `max_breakpoints` while any are
    left; a caller mark that does not fit is removed (the API refuses a fifth), an
    automatic one is simply not placed. Providers that are not `explicit` +
    `cache_control` get plain copies back.
    """
    out_messages = json_copy_all(messages)
    out_tools = json_copy_all(tools or [])
    if not spec.explicit or spec.breakpoint_format != FORMAT_CACHE_CONTROL:
        return CachePlan(out_messages, out_tools)
    marker = cache_marker(spec, retention, base_url=base_url)

    candidates: list[_Candidate] = []
    for tool in out_tools:
        if tool.get(CACHE_CONTROL):
            candidates.append(_Candidate(caller=True, strip=_popper(tool)))
    if out_tools and not out_tools[-1].get(CACHE_CONTROL):
        last_tool = out_tools[-1]
        candidates.append(_Candidate(caller=False, apply=lambda: _set(last_tool, marker)))
    system_slot = _Candidate(caller=False) if system else None
    if system_slot is not None:
        candidates.append(system_slot)
    candidates.extend(_caller_message_marks(out_messages))
    latest = _latest_user_mark(out_messages, marker)
    if latest is not None:
        candidates.append(latest)

    remaining = spec.max_breakpoints
    dropped = 0
    system_marker: dict[str, Any] | None = None
    for candidate in candidates:
        if remaining > 0:
            remaining -= 1
            if candidate is system_slot:
                system_marker = dict(marker)
            elif candidate.apply is not None:
                candidate.apply()
        elif candidate.caller and candidate.strip is not None:
            candidate.strip()
            dropped += 1
    if system_marker is not None:
        # The system block is marked by the wire module from this dict: reorder it too.
        holder = {CACHE_CONTROL: system_marker}
        order_ttls_longest_first(
            [*_tool_holders(out_tools), holder, *_message_holders(out_messages)]
        )
        system_marker = holder[CACHE_CONTROL]
    else:
        order_ttls_longest_first([*_tool_holders(out_tools), *_message_holders(out_messages)])
    return CachePlan(out_messages, out_tools, system_marker, dropped)


def _tool_holders(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [tool for tool in tools if tool.get(CACHE_CONTROL)]


def _message_holders(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What carries a mark in the messages, in the order the wire renders it: a tool
    result's content parts come before the mark on the tool_result block itself."""
    found: list[dict[str, Any]] = []
    for message in messages:
        found.extend(part for part in _parts(message) if part.get(CACHE_CONTROL))
        if message.get("role") == "tool" and message.get(CACHE_CONTROL):
            found.append(message)
    return found


def order_ttls_longest_first(holders: list[dict[str, Any]]) -> None:
    """Raise each marked holder's TTL (in prompt order) to the longest TTL after it, so no
    breakpoint outlives one before it: the order the API demands. In place: `holders` are
    the outbound copies. A marker that must grow gets the later one's `ttl` value."""
    longest: dict[str, Any] | None = None
    for holder in reversed(holders):
        marker = holder.get(CACHE_CONTROL)
        if not isinstance(marker, Mapping):
            continue
        if longest is not None and ttl_seconds(longest) > ttl_seconds(marker):
            holder[CACHE_CONTROL] = {**marker, "ttl": longest["ttl"]}
        else:
            longest = marker


def cache_point(
    spec: CacheSpec, retention: Retention = None, *, base_url: str | None = None
) -> dict[str, Any] | None:
    """Bedrock's breakpoint block, `{"cachePoint": {"type": "default"[, "ttl": "1h"]}}`, or
    None when the provider does not declare `cachePoint` breakpoints."""
    if not spec.explicit or spec.breakpoint_format != FORMAT_CACHE_POINT:
        return None
    point: dict[str, Any] = {"type": "default"}
    ttl = resolve_ttl(spec, retention, base_url=base_url)
    if ttl:
        point["ttl"] = ttl
    return {"cachePoint": point}


def cache_request_fields(spec: CacheSpec, settings: Mapping[str, Any]) -> dict[str, Any]:
    """Body fields for an `auto` provider: `{cache_key_param: settings["cache_key"]}` when
    the provider declares a key field and the caller gave a key (the session id)."""
    key = settings.get(CACHE_KEY_SETTING)
    if not spec.auto or not spec.cache_key_param or key in (None, ""):
        return {}
    return {spec.cache_key_param: str(key)}


def cache_request_headers(spec: CacheSpec, settings: Mapping[str, Any]) -> dict[str, str]:
    """Headers for an `auto` provider that takes its cache key as a header (xAI)."""
    key = settings.get(CACHE_KEY_SETTING)
    if not spec.auto or not spec.cache_key_header or key in (None, ""):
        return {}
    return {spec.cache_key_header: str(key)}
