from __future__ import annotations

import pytest

from providers.cache_spec import (
    MODES,
    CacheSpec,
    cache_key_param,
    cache_mode,
    declared_providers,
    get_cache_spec,
    parse_cache_spec,
    ttl_for_retention,
)
from providers.registry import provider_names


def test_every_shipped_declaration_loads_and_is_valid():
    names = declared_providers()

    assert {"anthropic", "openai", "bedrock", "gemini"} <= set(names)
    for name in names:
        spec = get_cache_spec(name)
        assert spec.provider == name
        assert spec.mode in MODES


def test_every_registered_provider_declares_its_caching():
    # A provider added to the registry without a cache.json would silently run `none`.
    assert set(provider_names()) <= set(declared_providers())


def test_anthropic_declares_explicit_cache_control_with_four_breakpoints():
    spec = get_cache_spec("anthropic")

    assert (spec.mode, spec.breakpoint_format, spec.max_breakpoints) == (
        "explicit",
        "cache_control",
        4,
    )
    assert dict(spec.retention_ttl_map) == {"short": None, "long": "1h"}
    assert spec.long_ttl_endpoints == ("api.anthropic.com",)


def test_bedrock_declares_cache_points_and_gemini_reads_statistics_only():
    bedrock = get_cache_spec("bedrock")

    assert (bedrock.mode, bedrock.breakpoint_format, bedrock.max_breakpoints) == (
        "explicit",
        "cachePoint",
        4,
    )
    assert cache_mode("gemini") == "out_of_band"


def test_openai_sends_the_session_key_as_prompt_cache_key_and_compat_vendors_do_not():
    assert cache_mode("openai") == "auto"
    assert cache_key_param("openai") == "prompt_cache_key"
    assert cache_mode("deepseek") == "auto"
    assert cache_key_param("deepseek") is None
    assert get_cache_spec("xai").cache_key_header == "x-grok-conv-id"
    assert {cache_mode(name) for name in ("ollama", "mistral", "together")} == {"none"}


@pytest.mark.parametrize("name", ["nosuch", "", None, "../anthropic", "Anthropic", "a/b"])
def test_a_provider_without_a_declaration_falls_back_to_none(name):
    spec = get_cache_spec(name)

    assert spec.mode == "none"
    assert cache_key_param(name) is None
    assert ttl_for_retention(spec, "long") is None


def test_retention_maps_to_the_declared_ttl():
    assert ttl_for_retention("anthropic", None) is None
    assert ttl_for_retention("anthropic", "short") is None
    assert ttl_for_retention("anthropic", "long") == "1h"
    assert ttl_for_retention("bedrock", "long") == "1h"


def test_long_ttl_is_only_asked_of_the_declared_endpoints():
    spec = get_cache_spec("anthropic")

    assert ttl_for_retention(spec, "long", base_url="https://api.anthropic.com") == "1h"
    assert ttl_for_retention(spec, "long", base_url="https://proxy.example.com/v1") is None
    assert ttl_for_retention(spec, "long", base_url="http://127.0.0.1:8080") is None


def test_an_unknown_retention_is_refused_rather_than_guessed():
    with pytest.raises(ValueError, match="retention"):
        ttl_for_retention("anthropic", "forever")


@pytest.mark.parametrize(
    "data, problem",
    [
        ({"mode": "sometimes"}, "mode"),
        ({"mode": "explicit", "max_breakpoints": 4}, "breakpoint_format"),
        ({"mode": "explicit", "breakpoint_format": "cache_control"}, "max_breakpoints"),
        ({"mode": "auto", "max_breakpoints": 2}, "explicit mode"),
        ({"mode": "none", "cache_key_param": "prompt_cache_key"}, "cache_key_param"),
        ({"mode": "auto", "retention_ttl_map": {"medium": "1h"}}, "retention_ttl_map"),
        ({"mode": "auto", "cache_key": "x"}, "unknown keys"),
        (
            {"mode": "explicit", "breakpoint_format": "cache_control", "max_breakpoints": True},
            "integer",
        ),
    ],
)
def test_a_malformed_declaration_fails_loudly(data, problem):
    with pytest.raises(ValueError, match=problem):
        parse_cache_spec("demo", data)


def test_specs_are_read_only():
    spec = get_cache_spec("anthropic")

    with pytest.raises(AttributeError):
        spec.mode = "none"  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.retention_ttl_map["long"] = "24h"  # type: ignore[index]
    assert isinstance(spec, CacheSpec)
