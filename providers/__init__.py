"""OpenWorker's provider-agnostic LLM layer (seed 000).

`ProviderRouter` is the one `ProviderClient` the engine is handed: it routes each call by
the model's `provider:` prefix to a lazily built per-provider client. Everything here is
pure Python over httpx; the package never imports Django, so the Django edge (encrypted
profiles, the curated matrix table) feeds it plain objects instead.
"""

from __future__ import annotations

from .base import ProviderClient
from .cancel import CancelToken
from .capabilities import CuratedModel, MatrixSource, Prices, capabilities_for
from .errors import (
    AuthenticationError,
    BadRequestError,
    ContextTooLongError,
    NoAccessError,
    OutboundBlockedError,
    OverloadedError,
    ProviderError,
    QuotaError,
    RateLimitError,
    RequestCancelled,
    StreamError,
    UpstreamUnavailableError,
)
from .router import ProviderRouter
from .types import AssistantTurn, Context, ModelCapabilities, StreamChunk, TokenUsage, ToolCall

__all__ = [
    "AssistantTurn",
    "AuthenticationError",
    "BadRequestError",
    "CancelToken",
    "Context",
    "ContextTooLongError",
    "CuratedModel",
    "MatrixSource",
    "ModelCapabilities",
    "NoAccessError",
    "OutboundBlockedError",
    "OverloadedError",
    "Prices",
    "ProviderClient",
    "ProviderError",
    "ProviderRouter",
    "QuotaError",
    "RateLimitError",
    "RequestCancelled",
    "StreamChunk",
    "StreamError",
    "TokenUsage",
    "ToolCall",
    "UpstreamUnavailableError",
    "capabilities_for",
]
