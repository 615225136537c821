"""Build one provider's client from its descriptor and its SecretStore profile.

The wire API a provider speaks is a declaration (`ProviderDescriptor.api`), so adding an
OpenAI-compatible vendor touches the registry only. Wire modules are imported on first
use, except in the serving processes, which import them all at start-up
(`preload_wire_modules`) rather than on a burst's first turn.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .registry import (
    ANTHROPIC_MESSAGES,
    BEDROCK_CONVERSE,
    GEMINI,
    OPENAI_COMPLETIONS,
    OPENAI_RESPONSES,
    get_descriptor,
    provider_names,
)

if TYPE_CHECKING:
    from .base import ProviderClient
    from .transport import Transport
    from .types import ModelCapabilities

# Wire API → (module, class). Every class takes
# `(descriptor, *, api_key, base_url, transport, capabilities)`.
_CLIENT_CLASSES: dict[str, tuple[str, str]] = {
    OPENAI_COMPLETIONS: ("providers.wire.openai_completions", "OpenAICompletionsClient"),
    ANTHROPIC_MESSAGES: ("providers.wire.anthropic_messages", "AnthropicMessagesClient"),
    BEDROCK_CONVERSE: ("providers.wire.bedrock_converse", "BedrockConverseClient"),
    OPENAI_RESPONSES: ("providers.wire.openai_responses", "OpenAIResponsesClient"),
    GEMINI: ("providers.wire.gemini", "GeminiClient"),
}


def preload_wire_modules() -> None:
    """Import every wire module now. A serving process calls this at start-up: imported
    on the first turn instead, they held the event loop of a burst's first turns (tens of
    milliseconds) while every other stream waited."""
    for module_name, _class_name in _CLIENT_CLASSES.values():
        importlib.import_module(module_name)


def build_provider_client(
    name: str,
    profile: Mapping[str, Any] | None,
    secrets: object | None,
    *,
    transport: Transport,
    capabilities: Callable[[str], ModelCapabilities],
) -> ProviderClient:
    """A client for provider `name`.

    `profile` is the provider's SecretStore entry (`api_key`, `base_url`, either may be
    missing or None); an empty `base_url` means the descriptor's default. `secrets` is
    passed for APIs whose credentials are more than one key (Bedrock) and unused today.
    A missing key is the client's to report, at call time, with a friendly message.

    Raises ValueError for an unregistered provider (naming the registered ones) and
    NotImplementedError for a wire API that is declared but not translated yet.
    """
    del secrets  # reserved for multi-credential APIs; see docstring
    descriptor = get_descriptor(name)
    if descriptor is None:
        raise ValueError(
            f"Unknown provider {name!r}; registered providers: {', '.join(provider_names())}"
        )
    target = _CLIENT_CLASSES.get(descriptor.api)
    if target is None:
        raise ValueError(f"Provider {name!r} declares an unknown wire API {descriptor.api!r}")
    module_name, class_name = target
    client_class = getattr(importlib.import_module(module_name), class_name)
    profile = profile or {}
    # A class declaring `takes_profile` also gets the whole profile (Bedrock's SigV4
    # credentials and region are more than one key).
    extra = {"profile": profile} if getattr(client_class, "takes_profile", False) else {}
    return client_class(
        descriptor,
        api_key=profile.get("api_key"),
        base_url=profile.get("base_url") or None,
        transport=transport,
        capabilities=capabilities,
        **extra,
    )
