"""Vendor usage objects → `TokenUsage` with non-overlapping buckets.

The vendors disagree on what "input" means, so each mapping states its arithmetic:
- OpenAI Chat Completions: `prompt_tokens` INCLUDES `prompt_tokens_details.cached_tokens`
  (cache reads) and `prompt_tokens_details.cache_write_tokens` (cache writes, where
  reported), so fresh input is what is left after both. `completion_tokens` already
  includes reasoning tokens (`completion_tokens_details.reasoning_tokens` is a breakdown,
  not an addition): counted once.
- Anthropic Messages: `input_tokens` EXCLUDES both cache buckets ("total_input_tokens =
  cache_read_input_tokens + cache_creation_input_tokens + input_tokens"), so it maps as is.

Never guess: a response without a usage object gives None, not zeros.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .types import TokenUsage

# A usage object naming none of these counts reported nothing: None, not zeros.
_OPENAI_FIELDS = frozenset({"prompt_tokens", "completion_tokens"})
_ANTHROPIC_FIELDS = frozenset(
    {"input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"}
)


def _int(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def usage_from_openai(usage: Mapping[str, Any] | None) -> TokenUsage | None:
    """Map a Chat Completions `usage` object.

    DeepSeek reports its cache hits as a flat `prompt_cache_hit_tokens` instead of
    `prompt_tokens_details.cached_tokens`; both mean "prompt tokens served from cache"
    and both are inside `prompt_tokens`, so either fills `cache_read`.
    """
    if not isinstance(usage, Mapping) or not _OPENAI_FIELDS.intersection(usage):
        return None
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, Mapping):
        details = {}
    cached = _int(details.get("cached_tokens")) or _int(usage.get("prompt_cache_hit_tokens"))
    written = _int(details.get("cache_write_tokens"))
    prompt = _int(usage.get("prompt_tokens"))
    return TokenUsage(
        input=max(0, prompt - cached - written),
        output=_int(usage.get("completion_tokens")),
        cache_read=cached,
        cache_write=written,
    )


def usage_from_anthropic(usage: Mapping[str, Any] | None) -> TokenUsage | None:
    """Map a Messages API `usage` object (the seed's mapping, field for field)."""
    if not isinstance(usage, Mapping) or not _ANTHROPIC_FIELDS.intersection(usage):
        return None
    return TokenUsage(
        input=_int(usage.get("input_tokens")),
        output=_int(usage.get("output_tokens")),
        cache_read=_int(usage.get("cache_read_input_tokens")),
        cache_write=_int(usage.get("cache_creation_input_tokens")),
    )


def merge_anthropic_usage(
    current: Mapping[str, Any] | None, update: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """Fold a `message_delta` usage into the `message_start` one.

    Delta counts are cumulative totals, so present (non-null) fields overwrite rather than
    add; fields the delta omits keep their `message_start` value.
    """
    if not isinstance(update, Mapping):
        return dict(current) if isinstance(current, Mapping) else None
    merged = dict(current) if isinstance(current, Mapping) else {}
    for key, value in update.items():
        if value is not None:
            merged[key] = value
    return merged
