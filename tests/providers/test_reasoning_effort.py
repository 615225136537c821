"""One `reasoning_effort` setting ("off", "low", "medium", "high"), mapped per wire API."""

from __future__ import annotations

import pytest

from providers.capabilities import capabilities_for
from providers.context import build_context
from providers.outbound import OutboundPolicy
from providers.reasoning import (
    EFFORT_LEVELS,
    MIN_THINKING_BUDGET,
    THINKING_BUDGETS,
    UNKNOWN_OUTPUT_CEILING,
    anthropic_thinking,
    normalize_effort,
    thinking_budget,
)
from providers.registry import get_descriptor
from providers.transport import Transport
from providers.types import ModelCapabilities
from providers.wire import anthropic_messages, openai_completions
from providers.wire.openai_completions import OpenAICompletionsClient
from tests.fakes import script as fake
from tests.fakes.anthropic_messages import AnthropicMessagesFake
from tests.fakes.openai_chat import OpenAIChatFake
from tests.fakes.validate import validate_anthropic_request, validate_openai_chat_request

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}]
BUDGET = ModelCapabilities(reasoning=True, thinking="budget")
ADAPTIVE = ModelCapabilities(reasoning=True, thinking="adaptive")
EFFORT = ModelCapabilities(reasoning=True, thinking="effort")


# --- the setting --------------------------------------------------------------------------


def test_levels_are_off_low_medium_high():
    assert EFFORT_LEVELS == ("off", "low", "medium", "high")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("", None), ("low", "low"), (" High ", "high"), ("OFF", "off")],
)
def test_a_setting_normalizes_to_a_level_or_not_set(value, expected):
    assert normalize_effort(value) == expected


def test_a_misspelt_level_fails_loudly():
    with pytest.raises(ValueError, match="reasoning_effort"):
        normalize_effort("hihg")


def test_the_budget_table_is_the_documented_one():
    assert dict(THINKING_BUDGETS) == {"low": 2048, "medium": 8192, "high": 24576}
    assert thinking_budget("off") is None and thinking_budget(None) is None
    assert min(THINKING_BUDGETS.values()) >= MIN_THINKING_BUDGET


# --- Anthropic ------------------------------------------------------------------------------


def _anthropic(settings: dict, caps: ModelCapabilities | None, model: str = "claude-x") -> dict:
    return anthropic_messages.build_request(
        build_context(MESSAGES, None),
        model=model,
        descriptor=get_descriptor("anthropic"),
        stream=True,
        settings=settings,
        capabilities=caps,
    )


@pytest.mark.parametrize(
    ("level", "budget", "max_tokens"),
    [("low", 2048, 8192 + 2048), ("medium", 8192, 8192 + 8192), ("high", 24576, 32_000)],
)
def test_a_budget_model_gets_the_tables_budget_and_room_above_it(level, budget, max_tokens):
    body = _anthropic({"reasoning_effort": level}, BUDGET)

    assert body["thinking"] == {"type": "enabled", "budget_tokens": budget}
    assert body["max_tokens"] == max_tokens > budget
    assert "output_config" not in body
    validate_anthropic_request(body)
    assert AnthropicMessagesFake().check_request(body) is None


@pytest.mark.parametrize("caps", [BUDGET, ADAPTIVE])
def test_a_request_ending_with_an_assistant_prefill_asks_for_no_thinking(caps):
    prefill = [*MESSAGES, {"role": "assistant", "content": "Because"}]
    body = anthropic_messages.build_request(
        build_context(prefill, None),
        model="claude-x",
        descriptor=get_descriptor("anthropic"),
        stream=True,
        settings={"reasoning_effort": "high"},
        capabilities=caps,
    )
    assert "thinking" not in body and "output_config" not in body
    assert body["messages"][-1]["role"] == "assistant"
    validate_anthropic_request(body)


def test_max_tokens_keeps_its_place_in_the_body_when_raised():
    body = _anthropic({"reasoning_effort": "low"}, BUDGET)

    assert list(body)[:3] == ["model", "max_tokens", "system"]


def test_an_explicit_cap_keeps_its_room_for_the_answer():
    body = _anthropic({"reasoning_effort": "low", "max_tokens": 1000}, BUDGET)

    assert body["max_tokens"] == 1000 + 2048


def test_the_raised_cap_never_passes_the_models_output_cap():
    caps = ModelCapabilities(reasoning=True, thinking="budget", max_output_tokens=64_000)

    body = _anthropic({"reasoning_effort": "high"}, caps)

    assert body["max_tokens"] == 64_000
    assert body["thinking"]["budget_tokens"] == 24576


def test_with_an_unknown_output_cap_the_raise_stops_at_the_safe_ceiling():
    plan = anthropic_thinking("high", BUDGET, max_tokens=30_000)

    assert plan.max_tokens == UNKNOWN_OUTPUT_CEILING
    assert plan.thinking["budget_tokens"] < plan.max_tokens


def test_a_budget_shrinks_to_fit_a_small_output_cap():
    caps = ModelCapabilities(reasoning=True, thinking="budget", max_output_tokens=4096)

    plan = anthropic_thinking("high", caps, max_tokens=4096)

    assert plan.max_tokens == 4096
    assert MIN_THINKING_BUDGET <= plan.thinking["budget_tokens"] < 4096


def test_no_thinking_when_even_the_floor_budget_does_not_fit():
    caps = ModelCapabilities(reasoning=True, thinking="budget", max_output_tokens=1500)

    plan = anthropic_thinking("low", caps, max_tokens=1500)

    assert plan.thinking is None and plan.max_tokens == 1500


@pytest.mark.parametrize("level", ["low", "medium", "high"])
def test_an_adaptive_model_gets_adaptive_thinking_and_the_level_as_effort(level):
    body = _anthropic({"reasoning_effort": level}, ADAPTIVE)

    assert body["thinking"] == {"type": "adaptive"}
    assert body["output_config"] == {"effort": level}
    assert body["max_tokens"] == anthropic_messages.DEFAULT_MAX_TOKENS
    validate_anthropic_request(body)
    assert AnthropicMessagesFake().check_request(body) is None


@pytest.mark.parametrize(
    ("call_settings", "caps"),
    [
        ({"reasoning_effort": "off"}, BUDGET),
        ({"reasoning_effort": "off"}, ADAPTIVE),
        ({}, BUDGET),
        ({"reasoning_effort": None}, ADAPTIVE),
        ({"reasoning_effort": "high"}, ModelCapabilities(reasoning=True)),  # shape unknown
        ({"reasoning_effort": "high"}, ModelCapabilities(reasoning=False, thinking="budget")),
        ({"reasoning_effort": "high"}, None),
    ],
)
def test_nothing_is_sent_when_off_not_set_or_the_shape_is_unknown(call_settings, caps):
    body = _anthropic(call_settings, caps)

    assert "thinking" not in body and "output_config" not in body
    assert body["max_tokens"] == anthropic_messages.DEFAULT_MAX_TOKENS


def test_a_misspelt_level_fails_before_any_request():
    with pytest.raises(ValueError):
        _anthropic({"reasoning_effort": "max!"}, BUDGET)


# --- OpenAI-compatible vendors ------------------------------------------------------------


def _chat(provider: str, settings: dict, caps: ModelCapabilities | None) -> dict:
    return openai_completions.build_request(
        build_context(MESSAGES, None),
        model="some-model",
        descriptor=get_descriptor(provider),
        stream=False,
        settings=settings,
        capabilities=caps,
    )


@pytest.mark.parametrize("provider", ["openai", "xai", "groq"])
@pytest.mark.parametrize("level", ["low", "medium", "high"])
def test_top_level_vendors_get_reasoning_effort(provider, level):
    body = _chat(provider, {"reasoning_effort": level}, EFFORT)

    assert body["reasoning_effort"] == level
    validate_openai_chat_request(body)


@pytest.mark.parametrize("provider", ["openai", "xai", "groq"])
def test_top_level_vendors_send_nothing_for_off_they_cannot_switch_off(provider):
    assert "reasoning_effort" not in _chat(provider, {"reasoning_effort": "off"}, EFFORT)


@pytest.mark.parametrize(
    "caps",
    [
        ModelCapabilities(reasoning=False),  # gpt-4o refuses the field
        ModelCapabilities(reasoning=True),  # Grok 4 reasons but refuses the field
        ModelCapabilities(reasoning=None, thinking="effort"),  # not known to reason
        None,
    ],
)
def test_top_level_effort_goes_only_to_models_that_take_a_level(caps):
    assert "reasoning_effort" not in _chat("openai", {"reasoning_effort": "high"}, caps)


@pytest.mark.parametrize("level", ["low", "medium", "high"])
def test_openrouter_gets_a_reasoning_object(level):
    body = _chat("openrouter", {"reasoning_effort": level}, ModelCapabilities(reasoning=True))

    assert body["reasoning"] == {"effort": level}
    assert "reasoning_effort" not in body
    validate_openai_chat_request(body, extra_fields=("reasoning",))


def test_openrouter_switches_reasoning_off_with_effort_none():
    body = _chat("openrouter", {"reasoning_effort": "off"}, ModelCapabilities(reasoning=True))

    assert body["reasoning"] == {"effort": "none"}


def test_openrouter_sends_nothing_to_a_model_not_known_to_reason():
    assert "reasoning" not in _chat("openrouter", {"reasoning_effort": "high"}, None)


@pytest.mark.parametrize("provider", ["deepseek", "mistral", "together", "ollama"])
def test_vendors_without_an_effort_field_get_nothing(provider):
    body = _chat(provider, {"reasoning_effort": "high"}, EFFORT)

    assert "reasoning_effort" not in body and "reasoning" not in body


def test_not_set_sends_nothing():
    body = _chat("openai", {}, EFFORT)

    assert "reasoning_effort" not in body


def test_the_client_decides_from_the_models_capabilities_end_to_end():
    transport = Transport(
        policy=OutboundPolicy(allow_loopback=True), max_retries=0, sleep=lambda s: None
    )
    try:
        with OpenAIChatFake(api_key="k") as server:
            server.push(fake.Reply(fake.text("Because.")), fake.Reply(fake.text("Because.")))
            client = OpenAICompletionsClient(
                get_descriptor("groq"),
                api_key="k",
                base_url=server.base_url,
                transport=transport,
                capabilities=lambda model: capabilities_for(f"groq:{model}", None),
            )
            client.complete(model="openai/gpt-oss-120b", messages=MESSAGES, reasoning_effort="low")
            oss = server.last_request.body
            client.complete(model="llama-3.3-70b", messages=MESSAGES, reasoning_effort="low")
            llama = server.last_request.body
    finally:
        transport.close()

    assert oss["reasoning_effort"] == "low"
    assert "reasoning_effort" not in llama


# --- heuristics: how a family takes its budget ----------------------------------------------


@pytest.mark.parametrize(
    ("model", "thinking"),
    [
        ("anthropic:claude-3-7-sonnet-20250219", "budget"),
        ("anthropic:claude-sonnet-4-20250514", "budget"),
        ("anthropic:claude-opus-4-1", "budget"),
        ("anthropic:claude-sonnet-4-5-20250929", "budget"),
        ("anthropic:claude-haiku-4-5", "budget"),
        ("anthropic:claude-opus-4-5", "budget"),
        ("anthropic:claude-opus-4-6", "adaptive"),
        ("anthropic:claude-sonnet-4-6", "adaptive"),
        ("anthropic:claude-opus-4-7", "adaptive"),
        ("anthropic:claude-sonnet-5", "adaptive"),
        ("anthropic:claude-fable-5-2", "adaptive"),
        ("anthropic:claude-mythos-preview", "adaptive"),
        ("openrouter:anthropic/claude-opus-4.6", "adaptive"),
        ("anthropic:claude-3-5-haiku-latest", None),
        ("anthropic:claude-latest", None),
        ("o3", "effort"),
        ("gpt-5.5", "effort"),
        ("gpt-4o", None),
        ("gemini:gemini-2.5-pro", "budget"),
        ("gemini:gemini-3-pro-preview", "effort"),
        ("gemini:gemini-2.0-flash", None),
        ("groq:openai/gpt-oss-120b", "effort"),
        ("deepseek:deepseek-reasoner", None),
        ("ollama:qwen3:30b", None),
    ],
)
def test_heuristics_name_the_thinking_shape_only_for_known_families(model, thinking):
    caps = capabilities_for(model, None)

    assert caps.thinking == thinking
    if thinking is not None:
        assert caps.reasoning is True


def test_claude_families_without_extended_thinking_do_not_reason():
    assert capabilities_for("anthropic:claude-3-5-sonnet-latest", None).reasoning is False
    assert capabilities_for("anthropic:claude-fable-5", None).reasoning is True
