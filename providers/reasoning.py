"""Reasoning effort: one setting for every provider, mapped per wire API.

The caller passes `reasoning_effort` among the settings of `complete()`/`stream()`:

    "off" | "low" | "medium" | "high"     (absent or None: not set)

Not set means the request carries no reasoning field at all and the API's own default
applies. "off" asks for no reasoning where the API has a way to say so, and sends
nothing where it has none (DeepSeek's reasoner always thinks; OpenAI's o-series and
xAI's Grok 4 cannot be switched off by a field).

The shared level → budget table (the one place these numbers live; import it):

    level    budget tokens   used as
    low           2048       Anthropic `thinking.budget_tokens` (caps.thinking "budget"),
    medium        8192       Bedrock Claude's same field, Gemini 2.5 `thinkingBudget`
    high         24576       (24576 is Gemini 2.5 Flash's own maximum: one table fits all)

APIs that take an effort LEVEL instead of a budget (Anthropic adaptive thinking's
`output_config.effort`, Responses `reasoning.effort`, Chat Completions
`reasoning_effort`, OpenRouter `reasoning.effort`, Gemini 3 `thinkingLevel`) take the
level's name itself: "low", "medium" and "high" are spelled the same on all of them.

Which shape a model takes is `ModelCapabilities.thinking` ("budget", "adaptive",
"effort" or None): declared by the curated matrix, guessed by the heuristics only for
families whose every member is known to take it. None means unknown, and an unknown
model is sent nothing: a wrong shape is a 400 (Anthropic refuses `budget_tokens` on
Opus 4.7 and adaptive thinking on Sonnet 4.5), a missing one merely the default.

Pure functions, no I/O: each wire module calls the mapping for its own API.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .registry import CompatFlags
from .types import ModelCapabilities

OFF = "off"
LOW = "low"
MEDIUM = "medium"
HIGH = "high"
EFFORT_LEVELS = (OFF, LOW, MEDIUM, HIGH)
SETTING = "reasoning_effort"

# Thinking-token budget per level (see the table above). Powers of two times 1024 up to
# the high level, which is capped at Gemini 2.5 Flash's maximum so every budget API can
# take the same numbers.
THINKING_BUDGETS: Mapping[str, int] = {LOW: 2048, MEDIUM: 8192, HIGH: 24576}

# Anthropic's floor for `budget_tokens`: a smaller budget is a 400, so it sends none.
MIN_THINKING_BUDGET = 1024
# Thinking tokens count toward Anthropic's `max_tokens`; the answer keeps at least this
# much room after the budget, or the reply could end in thinking with no words at all.
MIN_ANSWER_TOKENS = 1024
# Ceiling for the raised `max_tokens` when the model's own output cap is unknown: the
# smallest cap among the Claude models that take a budget (Opus 4 and 4.1: 32000), so
# raising never trips a "max_tokens too large" 400.
UNKNOWN_OUTPUT_CEILING = 32_000

# `ModelCapabilities.thinking` values.
THINKING_BUDGET = "budget"
THINKING_ADAPTIVE = "adaptive"
THINKING_EFFORT = "effort"

# `CompatFlags.reasoning_effort_param` values.
PARAM_TOP_LEVEL = "reasoning_effort"  # `"reasoning_effort": "<level>"` (OpenAI, xAI, Groq)
PARAM_OBJECT = "reasoning"  # `"reasoning": {"effort": "<level>"}` (OpenRouter)


def normalize_effort(value: Any) -> str | None:
    """The effort level of a setting: one of EFFORT_LEVELS, or None when not set.

    Case and surrounding blanks are forgiven; anything else is a ValueError, because a
    misspelt level silently sent as "default" would be a setting the user never sees
    take effect.
    """
    if value is None:
        return None
    level = str(value).strip().lower()
    if not level:
        return None
    if level not in EFFORT_LEVELS:
        raise ValueError(f"reasoning_effort must be one of {', '.join(EFFORT_LEVELS)}: {value!r}")
    return level


def effort_from(settings: Mapping[str, Any]) -> str | None:
    """The normalized `reasoning_effort` of a call's settings."""
    return normalize_effort(settings.get(SETTING))


def thinking_budget(level: str | None) -> int | None:
    """The budget of a level from the shared table; None for "off" and not set."""
    return THINKING_BUDGETS.get(level or "")


# --- Anthropic Messages (and Claude on Bedrock) ------------------------------------------


@dataclass(frozen=True)
class AnthropicThinking:
    """What a Claude request carries for one effort setting.

    `thinking` and `output_config` are the request fields (None: leave them out);
    `max_tokens` is the request's cap, raised so a budget fits below it.
    """

    max_tokens: int
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None


def anthropic_thinking(
    effort: str | None, capabilities: ModelCapabilities | None, *, max_tokens: int
) -> AnthropicThinking:
    """Effort → Claude's thinking fields, by the shape the model takes.

    - "adaptive" (Opus 4.6+, Sonnet 4.6+, Claude 5): `{"type": "adaptive"}` and
      `output_config: {"effort": <level>}`; `max_tokens` untouched (the model sizes
      its own thinking).
    - "budget" (Claude 3.7 to 4.5): `{"type": "enabled", "budget_tokens": N}` from the
      shared table. Thinking counts toward `max_tokens`, which must exceed the budget,
      so `max_tokens` grows by the budget (keeping the answer's room) up to the model's
      output cap; a budget that still does not fit shrinks, and below Anthropic's floor
      no thinking is sent at all.
    - "off", not set, or a model whose shape is unknown: nothing (thinking stays off
      where that is the default; never a guessed shape).
    """
    level = normalize_effort(effort)
    mode = capabilities.thinking if capabilities is not None else None
    unchanged = AnthropicThinking(max_tokens=max_tokens)
    if level in (None, OFF) or capabilities is None or capabilities.reasoning is False:
        return unchanged
    if mode == THINKING_ADAPTIVE:
        return AnthropicThinking(
            max_tokens=max_tokens,
            thinking={"type": "adaptive"},
            output_config={"effort": level},
        )
    if mode != THINKING_BUDGET:
        return unchanged
    budget = THINKING_BUDGETS[level]
    ceiling = capabilities.max_output_tokens or UNKNOWN_OUTPUT_CEILING
    raised = max(max_tokens, min(max_tokens + budget, ceiling))
    budget = min(budget, raised - MIN_ANSWER_TOKENS)
    if budget < MIN_THINKING_BUDGET:
        return unchanged
    return AnthropicThinking(
        max_tokens=raised, thinking={"type": "enabled", "budget_tokens": budget}
    )


# --- OpenAI-compatible Chat Completions ---------------------------------------------------


def completions_reasoning_fields(
    effort: str | None, *, compat: CompatFlags, capabilities: ModelCapabilities | None
) -> dict[str, Any]:
    """Effort → the top-level request fields of a Chat Completions vendor (maybe none).

    Declared per vendor by `compat.reasoning_effort_param`:
    - None: the vendor has no effort field (DeepSeek: its reasoner always thinks and
      its chat model never does); nothing is sent.
    - "reasoning_effort" (OpenAI, xAI, Groq): `"reasoning_effort": "<level>"`, only to a
      model that takes an effort level (`capabilities.thinking == "effort"`): gpt-4o,
      Grok 4 and Groq's Qwen refuse the field or its levels with a 400.
    - "reasoning" (OpenRouter): `"reasoning": {"effort": "<level>"}`, to any model
      known to reason: OpenRouter translates the level for each upstream (a budget for
      Claude and Gemini).
    "off" sends `compat.reasoning_effort_off` where the vendor has an off value, else
    nothing. Models not known to reason (`capabilities.reasoning` not True) get nothing.
    """
    level = normalize_effort(effort)
    param = compat.reasoning_effort_param
    if level is None or param is None or capabilities is None or capabilities.reasoning is not True:
        return {}
    value = compat.reasoning_effort_off if level == OFF else level
    if value is None:
        return {}
    if param == PARAM_OBJECT:
        return {PARAM_OBJECT: {"effort": value}}
    if param == PARAM_TOP_LEVEL and capabilities.thinking == THINKING_EFFORT:
        return {PARAM_TOP_LEVEL: value}
    return {}
