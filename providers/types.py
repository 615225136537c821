"""The provider-agnostic value types of the LLM layer (seed 000).

Pure dataclasses: no Django, no httpx. Every wire module translates *into* these and
the engine only ever sees these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TokenUsage:
    """Normalized token counts for one model round-trip.

    `input` counts only fresh (uncached) prompt tokens; cached prompt tokens are split
    into `cache_read`/`cache_write`. Providers that don't report a cache split (Ollama,
    most compatible vendors) leave the cache fields at 0. `output` includes thinking
    tokens where the vendor bills them as output (Gemini, OpenAI reasoning).
    The buckets never overlap, so they can be summed and priced independently.
    """

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0

    @property
    def context_tokens(self) -> int:
        """Prompt-side total: what actually occupied the context window."""
        return self.input + self.cache_read + self.cache_write

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            input=self.input + other.input,
            output=self.output + other.output,
            cache_read=self.cache_read + other.cache_read,
            cache_write=self.cache_write + other.cache_write,
        )

    def to_dict(self) -> dict[str, int]:
        return {
            "input": self.input,
            "output": self.output,
            "cache_read": self.cache_read,
            "cache_write": self.cache_write,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> TokenUsage | None:
        if not data:
            return None
        return cls(
            input=int(data.get("input", 0) or 0),
            output=int(data.get("output", 0) or 0),
            cache_read=int(data.get("cache_read", 0) or 0),
            cache_write=int(data.get("cache_write", 0) or 0),
        )


@dataclass
class ToolCall:
    """One function call the model asked for.

    `arguments` is a dict once parsed. When the model produced arguments that are not
    valid JSON, `arguments` is `{}`, the raw text is kept in `raw_arguments` and
    `error` says why: the engine reports that back to the model instead of crashing.
    """

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw_arguments: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "name": self.name, "arguments": self.arguments}
        if self.error:
            out["error"] = self.error
            out["raw_arguments"] = self.raw_arguments
        return out


@dataclass
class AssistantTurn:
    """One complete model reply."""

    text: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    raw: Any = field(default=None, repr=False, compare=False)
    # The model's thinking text (DeepSeek reasoning_content, Anthropic thinking, Gemini
    # thought summaries...). Display only: stored on the assistant message's `reasoning`
    # sidecar and always stripped before any provider sees the history again.
    reasoning: str | None = None
    # Provider-private sidecars under underscore keys (`_anthropic` thinking signatures,
    # `_gemini` thought signatures, `_openai` encrypted reasoning). Contract: the owning
    # provider re-attaches them, every other provider drops or ignores them.
    extras: dict[str, Any] = field(default_factory=dict)
    # Normalized token counts. None when the provider did not report them: never a guess.
    usage: TokenUsage | None = None


@dataclass
class StreamChunk:
    """One streamed increment. Exactly the last chunk of a stream has `turn` set.

    `tool_call_delta` is `{"index": int, "id": str | None, "name": str | None,
    "arguments": str}`: a fragment of one call's JSON arguments as it arrives.
    """

    text: str | None = None
    reasoning: str | None = None
    tool_call_delta: dict[str, Any] | None = None
    turn: AssistantTurn | None = None


@dataclass(frozen=True)
class ModelCapabilities:
    """What a model can take and do. Unknown is None, never a made-up number."""

    vision: bool | None = None
    pdf: bool | None = None
    tools: bool | None = None
    reasoning: bool | None = None
    context_window: int | None = None
    max_output_tokens: int | None = None
    # How the model takes a reasoning budget where the API differs by model generation:
    # "budget" (Anthropic thinking.budget_tokens), "adaptive" (Anthropic adaptive thinking
    # with an effort), "effort" (an effort level), or None when unknown / not applicable.
    thinking: str | None = None
    # True when the answer comes from the curated matrix; False for heuristics.
    curated: bool = False


@dataclass
class Context:
    """The provider-independent request (seed 002): system kept apart from the dialogue.

    `messages` are canonical messages with system messages removed and `reasoning`
    stripped; content blocks may carry `cache_control`, which translations pass through.
    `tools` are `{"name", "description", "parameters", "cache_control"?}`.
    """

    system_prompt: str | None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
