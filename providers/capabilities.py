"""What a model can take and do: the curated matrix first, conservative heuristics second.

Curated models answer from the matrix by EXACT full id, including reseller ids such as
`together:zai-org/GLM-5.2` whose names defeat any prefix heuristic. Everything else is a
custom model the user added at their own risk: it falls to name-pattern heuristics that
claim a capability only when the family is known to have it, and never invent a number
(context window and output cap stay None: the meter hides rather than show a made-up
denominator).

Pure Python: the Django side feeds the admin-managed table through `MatrixSource`, either
a mapping or a callable returning one (so it can refresh from its own cache).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import TypeAlias

from .registry import get_descriptor
from .types import ModelCapabilities, TokenUsage

# Prices are quoted per million tokens by every vendor's price list.
TOKENS_PER_PRICE_UNIT = 1_000_000


@dataclass(frozen=True)
class Prices:
    """Price per million tokens for each non-overlapping `TokenUsage` bucket.

    None means unknown, not free: `cost()` refuses to guess rather than under-report.
    """

    input: Decimal | None = None
    output: Decimal | None = None
    cache_read: Decimal | None = None
    cache_write: Decimal | None = None

    def __post_init__(self) -> None:
        # Admin forms and JSON fixtures hand in floats and strings; money is kept exact.
        for name in ("input", "output", "cache_read", "cache_write"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Decimal):
                object.__setattr__(self, name, Decimal(str(value)))

    def cost(self, usage: TokenUsage | None) -> Decimal | None:
        """Cost of one round-trip, or None when usage is unknown or a used bucket is unpriced."""
        if usage is None:
            return None
        total = Decimal(0)
        for name in ("input", "output", "cache_read", "cache_write"):
            tokens = getattr(usage, name)
            if not tokens:
                continue
            price = getattr(self, name)
            if price is None:
                return None
            total += price * tokens
        return total / TOKENS_PER_PRICE_UNIT


@dataclass(frozen=True)
class CuratedModel:
    """One row of the curated matrix: a model the product suggests, labels and vouches for.

    `id` is the full model string users pick (`anthropic:claude-sonnet-4-5`, or bare for the
    default provider). `enabled` is about offering the model, not about its facts: a
    disabled row still answers capability questions for sessions that already use it.
    """

    id: str
    label: str
    provider: str
    caps: ModelCapabilities
    prices: Prices = Prices()
    enabled: bool = True


# A callable lets the Django side hand in its cached, admin-managed table and refresh it.
MatrixSource: TypeAlias = Mapping[str, CuratedModel] | Callable[[], Mapping[str, CuratedModel]]
# Plain capabilities are accepted as matrix values too (tests, fixtures, a static table).
MatrixEntry: TypeAlias = CuratedModel | ModelCapabilities


def split_model(model: str, *, default_provider: str) -> tuple[str, str]:
    """(provider, bare model) for a model string.

    Only a REGISTERED prefix is a provider: `qwen2.5-coder:32b` is a model with a version
    tag, so it goes whole to the default provider; `ollama:qwen2.5-coder:32b` is Ollama's
    `qwen2.5-coder:32b`.
    """
    if ":" in model:
        prefix, rest = model.split(":", 1)
        if get_descriptor(prefix) is not None:
            return prefix, rest
    return default_provider, model


def _read_matrix(matrix: MatrixSource | Mapping[str, MatrixEntry] | None) -> Mapping[str, object]:
    if matrix is None:
        return {}
    if callable(matrix):
        return matrix() or {}
    return matrix


def entry_for(
    model: str,
    matrix: MatrixSource | Mapping[str, MatrixEntry] | None,
    *,
    default_provider: str = "openai",
) -> MatrixEntry | None:
    """The curated row for `model`, by exact id.

    A model of the default provider may be written bare or prefixed, so both spellings
    are tried; nothing fuzzier (no case folding, no prefix matching): a near miss is a
    custom model.
    """
    table = _read_matrix(matrix)
    if not table:
        return None
    entry = table.get(model)
    if entry is None:
        provider, bare = split_model(model, default_provider=default_provider)
        if provider == default_provider:
            alternate = bare if bare != model else f"{default_provider}:{model}"
            entry = table.get(alternate)
    return entry  # type: ignore[return-value]


def capabilities_for(
    model: str,
    matrix: MatrixSource | Mapping[str, MatrixEntry] | None = None,
    *,
    default_provider: str = "openai",
) -> ModelCapabilities:
    """Capabilities of `model` (full id): curated (`curated=True`) or heuristic (`False`)."""
    entry = entry_for(model, matrix, default_provider=default_provider)
    if entry is not None:
        caps = entry.caps if isinstance(entry, CuratedModel) else entry
        return replace(caps, curated=True)
    provider, bare = split_model(model, default_provider=default_provider)
    return heuristic_capabilities(bare, provider=provider)


# --- heuristics --------------------------------------------------------------------------
#
# Each family claims only what every member of it is known to do. PDF input is claimed only
# on the family's own API: resellers differ in whether they forward document parts, and a
# wrong "yes" loses the attachment while a "no" merely degrades it to extracted text.

_VISION_MARKERS = re.compile(r"(?<![a-z])vl(?![a-z])|vision|llava|pixtral")
_CLAUDE_VERSION = re.compile(
    r"claude-(?:(?:opus|sonnet|haiku|instant|fable|mythos)-)?(\d+)(?:[.-](\d)(?!\d))?"
)
# Families newer than any numbered generation that takes a thinking budget: all adaptive.
_CLAUDE_ADAPTIVE_FAMILIES = re.compile(r"claude-(?:fable|mythos)(?![a-z])")
# Claude generations by how they take a reasoning budget: adaptive thinking from 4.6 on
# (Opus 4.7 refuses `budget_tokens` outright; on 4.6 it is deprecated), a token budget
# from 3.7 (the first with extended thinking) up to 4.5.
CLAUDE_ADAPTIVE_FROM = (4, 6)
CLAUDE_THINKING_FROM = (3, 7)
# Gemini 2.5 takes `thinkingBudget` tokens; Gemini 3 takes a `thinkingLevel`.
GEMINI_BUDGET_FROM = (2, 5)
GEMINI_LEVEL_FROM = (3, 0)
_GEMINI_VERSION = re.compile(r"gemini-(\d+)(?:\.(\d+))?")
_OPENAI_O_SERIES = re.compile(r"^o\d+(?:-|$)")
_OPENAI_GPT = re.compile(r"^(?:gpt-4o|gpt-4\.1|gpt-5)")
_OPENAI_NO_VISION = re.compile(r"^(?:o1-mini|o1-preview|o3-mini)")
_DEEPSEEK_REASONER = re.compile(r"deepseek-reasoner|(?<![a-z0-9])r1(?![0-9])")
_DEEPSEEK_CHAT = re.compile(r"deepseek-(?:chat|v\d)")
# Open-weight families whose current generations call tools reliably through the
# OpenAI-compatible endpoints (Ollama, vLLM, resellers). Older generations stay unknown.
_LOCAL_TOOLS = re.compile(
    r"(?<![a-z])(?:llama-?3\.[123]|llama-?4|qwen-?2\.5|qwen-?3|qwq|mistral|mixtral|ministral|devstral|"
    r"magistral|codestral|gpt-oss|glm-4\.[5-9]|glm-[5-9]|kimi-k2|command-r|granite-?3)"
)
_LOCAL_REASONING = re.compile(r"(?<![a-z])(?:qwq|qwen-?3|magistral|gpt-oss|glm-4\.[5-9]|glm-[5-9])")
_GPT_OSS = re.compile(r"(?<![a-z])gpt-oss")
_PDF_NATIVE = {"claude": "anthropic", "gpt": "openai", "gemini": "gemini"}


def _family_name(bare: str) -> str:
    """Lowercased last path segment: `zai-org/GLM-5.2` and `anthropic/claude-x` name their
    family after the vendor's slash."""
    return bare.rsplit("/", 1)[-1].strip().lower()


def _version(match: re.Match[str] | None) -> tuple[int, int] | None:
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2) or 0)


def heuristic_capabilities(bare: str, *, provider: str) -> ModelCapabilities:
    """Capabilities guessed from the model's name (`curated=False`, windows always None)."""
    name = _family_name(bare)
    vision_marked = True if _VISION_MARKERS.search(name) else None

    if name.startswith("claude"):
        version = _version(_CLAUDE_VERSION.search(name))
        if version is not None and version < (3, 0):
            return ModelCapabilities(vision=False, pdf=False, tools=None, reasoning=False)
        thinking = _claude_thinking(name, version)
        return ModelCapabilities(
            vision=True,
            pdf=True if provider == _PDF_NATIVE["claude"] else None,
            tools=True,
            reasoning=True if thinking else (None if version is None else False),
            thinking=thinking,
        )

    if _OPENAI_O_SERIES.match(name) or _OPENAI_GPT.match(name):
        sees = not _OPENAI_NO_VISION.search(name)
        reasons: bool | None = True
        if name.startswith(("gpt-4o", "gpt-4.1")):
            reasons = False
        elif name.startswith("gpt-5") and "chat" in name:
            reasons = None  # the chat aliases are the non-reasoning variants, sometimes
        return ModelCapabilities(
            vision=sees,
            pdf=True if sees and provider == _PDF_NATIVE["gpt"] else None,
            tools=True,
            reasoning=reasons,
            # Every OpenAI reasoning model takes `reasoning_effort` low/medium/high.
            thinking="effort" if reasons else None,
        )

    if name.startswith("gemini"):
        version = _version(_GEMINI_VERSION.search(name))
        thinks: bool | None = None
        if "thinking" in name or (version is not None and version >= GEMINI_BUDGET_FROM):
            thinks = True
        gemini_thinking: str | None = None
        if version is not None and version >= GEMINI_LEVEL_FROM:
            gemini_thinking = "effort"
        elif version is not None and version >= GEMINI_BUDGET_FROM:
            gemini_thinking = "budget"
        return ModelCapabilities(
            vision=True,
            pdf=True if provider == _PDF_NATIVE["gemini"] else None,
            tools=True,
            reasoning=thinks,
            thinking=gemini_thinking,
        )

    if _DEEPSEEK_REASONER.search(name):
        return ModelCapabilities(vision=False, pdf=False, tools=None, reasoning=True)
    if _DEEPSEEK_CHAT.search(name):
        return ModelCapabilities(vision=False, pdf=False, tools=True, reasoning=False)

    return ModelCapabilities(
        vision=vision_marked,
        pdf=None,
        # Vision variants of tool-calling families often ship without the tool template.
        tools=True if _LOCAL_TOOLS.search(name) and not vision_marked else None,
        reasoning=True if _LOCAL_REASONING.search(name) else None,
        # gpt-oss takes `reasoning_effort` low/medium/high wherever it is served.
        thinking="effort" if _GPT_OSS.search(name) else None,
    )


def _claude_thinking(name: str, version: tuple[int, int] | None) -> str | None:
    """ "adaptive", "budget", or None (no extended thinking, or a name we cannot place)."""
    if _CLAUDE_ADAPTIVE_FAMILIES.search(name) or (
        version is not None and version >= CLAUDE_ADAPTIVE_FROM
    ):
        return "adaptive"
    if version is not None and version >= CLAUDE_THINKING_FROM:
        return "budget"
    return None
