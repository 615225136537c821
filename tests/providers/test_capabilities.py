from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from providers.capabilities import (
    CuratedModel,
    Prices,
    capabilities_for,
    entry_for,
    split_model,
)
from providers.types import ModelCapabilities, TokenUsage

GLM = CuratedModel(
    id="together:zai-org/GLM-5.2",
    label="GLM 5.2 (Together)",
    provider="together",
    caps=ModelCapabilities(
        vision=True, pdf=False, tools=True, reasoning=True, context_window=200_000
    ),
    prices=Prices(input="0.60", output="2.20"),
)
GPT = CuratedModel(
    id="gpt-5.5",
    label="GPT-5.5",
    provider="openai",
    caps=ModelCapabilities(
        vision=True, pdf=True, tools=True, reasoning=True, context_window=400_000
    ),
)
MATRIX = {GLM.id: GLM, GPT.id: GPT}


def test_reseller_id_answers_from_the_matrix_by_exact_id():
    caps = capabilities_for("together:zai-org/GLM-5.2", MATRIX)

    assert caps.curated is True
    assert caps.vision is True
    assert caps.context_window == 200_000


def test_a_near_miss_of_a_curated_id_is_a_custom_model():
    for model in ("together:zai-org/glm-5.2", "zai-org/GLM-5.2", "together:zai-org/GLM-5.2x"):
        caps = capabilities_for(model, MATRIX)
        assert caps.curated is False, model
        assert caps.context_window is None, model


def test_default_provider_models_match_bare_and_prefixed():
    assert capabilities_for("gpt-5.5", MATRIX).curated is True
    assert capabilities_for("openai:gpt-5.5", MATRIX).curated is True
    prefixed = {"anthropic:claude-x": GPT}
    assert capabilities_for("claude-x", prefixed, default_provider="anthropic").curated is True


def test_bare_id_is_not_matched_under_a_provider_other_than_the_default():
    assert capabilities_for("ollama:gpt-5.5", MATRIX).curated is False


def test_matrix_may_hold_plain_capabilities():
    matrix = {"ollama:llama3.3": ModelCapabilities(tools=True, context_window=131_072)}

    caps = capabilities_for("ollama:llama3.3", matrix)

    assert caps == ModelCapabilities(tools=True, context_window=131_072, curated=True)


def test_callable_matrix_is_read_on_every_question():
    table: dict[str, CuratedModel] = {}
    calls = []

    def source():
        calls.append(1)
        return table

    assert capabilities_for("together:zai-org/GLM-5.2", source).curated is False
    table[GLM.id] = GLM
    assert capabilities_for("together:zai-org/GLM-5.2", source).curated is True
    assert len(calls) == 2


def test_disabled_curated_model_still_answers_its_facts():
    disabled = CuratedModel(
        id="gpt-5.5", label="x", provider="openai", caps=GPT.caps, enabled=False
    )
    assert capabilities_for("gpt-5.5", {"gpt-5.5": disabled}).context_window == 400_000


def test_entry_for_returns_the_row_with_prices():
    entry = entry_for("together:zai-org/GLM-5.2", MATRIX)
    assert entry is GLM
    assert entry_for("nope", MATRIX) is None
    assert entry_for("gpt-5.5", None) is None


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("qwen2.5-coder:32b", ("openai", "qwen2.5-coder:32b")),
        ("ollama:qwen2.5-coder:32b", ("ollama", "qwen2.5-coder:32b")),
        ("anthropic:claude-sonnet-4-5", ("anthropic", "claude-sonnet-4-5")),
        ("together:zai-org/GLM-5.2", ("together", "zai-org/GLM-5.2")),
        ("nosuch:model", ("openai", "nosuch:model")),
    ],
)
def test_split_model_strips_only_registered_prefixes(model, expected):
    assert split_model(model, default_provider="openai") == expected


# --- heuristics ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "vision", "pdf", "tools", "reasoning"),
    [
        ("anthropic:claude-sonnet-4-5", True, True, True, True),
        ("anthropic:claude-sonnet-4-20250514", True, True, True, True),
        ("anthropic:claude-3-7-sonnet-20250219", True, True, True, True),
        ("anthropic:claude-3-5-haiku-latest", True, True, True, False),
        ("anthropic:claude-2.1", False, False, None, False),
        ("openrouter:anthropic/claude-opus-4.1", True, None, True, True),
        ("gpt-4o", True, True, True, False),
        ("gpt-4.1-mini", True, True, True, False),
        ("gpt-5.5", True, True, True, True),
        ("o3", True, True, True, True),
        ("o3-mini", False, None, True, True),
        ("openrouter:openai/gpt-4o", True, None, True, False),
        ("deepseek:deepseek-reasoner", False, False, None, True),
        ("ollama:deepseek-r1:32b", False, False, None, True),
        ("deepseek:deepseek-chat", False, False, True, False),
        ("ollama:llama3.3", None, None, True, None),
        ("ollama:llama3.2-vision:11b", True, None, None, None),
        ("ollama:qwen2.5vl:7b", True, None, None, None),
        ("together:Qwen/Qwen2.5-VL-72B-Instruct", True, None, None, None),
        ("ollama:llava:13b", True, None, None, None),
        ("qwen2.5-coder:32b", None, None, True, None),
        ("ollama:qwen3:30b", None, None, True, True),
        ("together:meta-llama/Llama-3.3-70B-Instruct-Turbo", None, None, True, None),
        ("mistral:mistral-large-latest", None, None, True, None),
        ("mistral:pixtral-large-latest", True, None, None, None),
        ("together:zai-org/GLM-5.2", None, None, True, True),
        ("ollama:some-new-thing", None, None, None, None),
    ],
)
def test_heuristics_claim_only_known_family_traits(model, vision, pdf, tools, reasoning):
    caps = capabilities_for(model, None)

    assert (caps.vision, caps.pdf, caps.tools, caps.reasoning) == (vision, pdf, tools, reasoning)
    assert caps.curated is False


def test_gemini_family_sees_and_reads_pdfs_on_its_own_api_only():
    caps = capabilities_for("openrouter:google/gemini-2.5-pro", None)
    assert (caps.vision, caps.pdf, caps.tools, caps.reasoning) == (True, None, True, True)
    caps = capabilities_for("gemini-1.5-flash", None, default_provider="openai")
    assert caps.reasoning is None


@given(st.text(max_size=60))
def test_heuristics_never_invent_a_window_or_output_cap(model):
    caps = capabilities_for(model, None)

    assert caps.context_window is None
    assert caps.max_output_tokens is None
    assert caps.curated is False


# --- prices ----------------------------------------------------------------------------


def test_prices_are_exact_decimals_per_million_tokens():
    prices = Prices(input=0.6, output="2.20", cache_read=Decimal("0.06"))
    usage = TokenUsage(input=1_000_000, output=500_000, cache_read=2_000_000)

    assert prices.input == Decimal("0.6")
    assert prices.cost(usage) == Decimal("0.6") + Decimal("1.10") + Decimal("0.12")


def test_cost_is_unknown_when_a_used_bucket_has_no_price():
    prices = Prices(input="1", output="2")

    assert prices.cost(TokenUsage(input=10, output=10, cache_write=5)) is None
    assert prices.cost(TokenUsage(input=10, output=10)) == Decimal("0.00003")
    assert prices.cost(None) is None
