from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import providers
from providers import base, cancel, capabilities, errors, router, types

REPO = Path(__file__).resolve().parents[2]

PUBLIC_NAMES = {
    "ProviderRouter": router.ProviderRouter,
    "ProviderClient": base.ProviderClient,
    "AssistantTurn": types.AssistantTurn,
    "ToolCall": types.ToolCall,
    "TokenUsage": types.TokenUsage,
    "StreamChunk": types.StreamChunk,
    "ModelCapabilities": types.ModelCapabilities,
    "Context": types.Context,
    "CuratedModel": capabilities.CuratedModel,
    "Prices": capabilities.Prices,
    "CancelToken": cancel.CancelToken,
}
ERROR_NAMES = [
    "ProviderError",
    "AuthenticationError",
    "NoAccessError",
    "QuotaError",
    "RateLimitError",
    "OverloadedError",
    "ContextTooLongError",
    "BadRequestError",
    "UpstreamUnavailableError",
    "StreamError",
    "OutboundBlockedError",
    "RequestCancelled",
]


def test_importing_providers_does_not_import_django():
    code = "import providers, sys; assert 'django' not in sys.modules, 'django imported'"

    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False
    )

    assert result.returncode == 0, result.stderr


def test_the_documented_names_are_exported_from_the_package():
    for name, obj in PUBLIC_NAMES.items():
        assert getattr(providers, name) is obj, name
        assert name in providers.__all__, name


def test_every_error_type_is_exported_and_is_a_provider_error():
    for name in ERROR_NAMES:
        exported = getattr(providers, name)
        assert exported is getattr(errors, name), name
        assert issubclass(exported, providers.ProviderError), name
        assert name in providers.__all__, name


def test_all_lists_only_names_that_exist():
    missing = [name for name in providers.__all__ if not hasattr(providers, name)]
    assert missing == []


def test_the_router_is_a_provider_client_and_builds_nothing_until_used():
    made = []
    built_router = providers.ProviderRouter(None, transport_factory=lambda: made.append(1))

    assert isinstance(built_router, providers.ProviderClient)
    assert made == []
    assert built_router.capabilities("gpt-5.5").curated is False
