"""ProviderRouter: one `ProviderClient` that dispatches on the `provider:` prefix of the model.

It is the single provider every engine is handed, so `complete()/stream()` (which receive
the full model string per call) route themselves: `ollama:llama3.3` goes to the Ollama
client with model `llama3.3`, bare `gpt-5.5` to the default provider. Only a REGISTERED
prefix is stripped: `qwen2.5-coder:32b` is a version tag, not a provider.

Each provider's client is built lazily from its SecretStore profile
(`secrets.get("provider:<name>")`), once, under a lock, and cached until `invalidate()`.
A client dropped while calls are still running on it is closed when the last one ends,
so saving a new key never cuts a streaming turn short.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .base import ProviderClient
from .capabilities import CuratedModel, MatrixSource, capabilities_for, entry_for, split_model
from .factory import build_provider_client
from .outbound import OutboundPolicy
from .registry import get_descriptor, provider_names
from .transport import Transport
from .types import AssistantTurn, ModelCapabilities, StreamChunk

logger = logging.getLogger(__name__)

# SecretStore key of a provider profile: `provider:<name>` (DESIGN.md).
PROFILE_KEY_PREFIX = "provider:"


class SecretSource(Protocol):
    """Anything with `.get(key)`: the Django SecretStore (user profile, then org), a dict."""

    def get(self, key: str) -> Mapping[str, Any] | None: ...


ClientFactory = Callable[..., ProviderClient]


@dataclass
class _Entry:
    """A cached client and how many calls are using it."""

    name: str
    client: ProviderClient
    leases: int = 0
    retired: bool = False


class ProviderRouter(ProviderClient):
    """Routes each call to the client of the model's provider.

    `matrix` answers `capabilities()` for curated models (a mapping or a callable re-read
    on every question, so an admin edit shows up without rebuilding the router).
    `transport_factory` is called once per client built; the client owns what it returns
    (its `close()` releases it), and the router closes it only if the build fails. By
    default each client gets a `Transport` guarded by `outbound` (or
    `OutboundPolicy.from_env(embedded=embedded)`: the safe default is the distributed
    policy, which admits no private address unless allow-listed).
    """

    def __init__(
        self,
        secrets: SecretSource | None,
        *,
        matrix: MatrixSource | None = None,
        default_provider: str = "openai",
        outbound: OutboundPolicy | None = None,
        embedded: bool = False,
        transport_factory: Callable[[], Transport] | None = None,
        client_factory: ClientFactory = build_provider_client,
    ) -> None:
        if get_descriptor(default_provider) is None:
            raise ValueError(
                f"Unknown default provider {default_provider!r}; "
                f"registered providers: {', '.join(provider_names())}"
            )
        self._secrets = secrets
        self._matrix = matrix
        self._default_provider = default_provider
        self._outbound = outbound
        self._embedded = embedded
        self._transport_factory = transport_factory
        self._client_factory = client_factory
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    @property
    def default_provider(self) -> str:
        return self._default_provider

    # --- routing -----------------------------------------------------------------------

    def _entry_locked(self, name: str) -> _Entry:
        entry = self._entries.get(name)
        if entry is None:
            profile: Mapping[str, Any] = {}
            if self._secrets is not None:
                profile = self._secrets.get(f"{PROFILE_KEY_PREFIX}{name}") or {}
            transport = self._new_transport()
            try:
                client = self._client_factory(
                    name,
                    profile,
                    self._secrets,
                    transport=transport,
                    capabilities=self._capabilities_of(name),
                )
            except BaseException:
                _close_quietly(name, transport)
                raise
            entry = _Entry(name=name, client=client)
            self._entries[name] = entry
        return entry

    def _new_transport(self) -> Transport:
        if self._transport_factory is not None:
            return self._transport_factory()
        if self._outbound is None:
            self._outbound = OutboundPolicy.from_env(embedded=self._embedded)
        return Transport(policy=self._outbound)

    def _capabilities_of(self, name: str) -> Callable[[str], ModelCapabilities]:
        """What a client asks with the BARE model: answered for the full id."""

        def capabilities(bare: str) -> ModelCapabilities:
            return self.capabilities(f"{name}:{bare}")

        return capabilities

    def _acquire(self, model: str) -> tuple[_Entry, str]:
        name, bare = split_model(model, default_provider=self._default_provider)
        with self._lock:
            entry = self._entry_locked(name)
            entry.leases += 1
        return entry, bare

    def _release(self, entry: _Entry) -> None:
        with self._lock:
            entry.leases -= 1
            close_now = entry.retired and entry.leases == 0
        if close_now:
            _close_entry(entry)

    # --- ProviderClient ----------------------------------------------------------------

    def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **settings: Any,
    ) -> AssistantTurn:
        entry, bare = self._acquire(model)
        try:
            return entry.client.complete(model=bare, messages=messages, tools=tools, **settings)
        finally:
            self._release(entry)

    def stream(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **settings: Any,
    ) -> Iterator[StreamChunk]:
        """Stream from the provider's client. The client is resolved on the first `next()`
        (a generator runs nothing before), and held until the stream ends or is closed."""
        entry, bare = self._acquire(model)
        try:
            yield from entry.client.stream(model=bare, messages=messages, tools=tools, **settings)
        finally:
            self._release(entry)

    async def astream(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **settings: Any,
    ) -> AsyncIterator[StreamChunk]:
        """`stream` for a caller on an event loop, through the client's own `astream`."""
        entry, bare = self._acquire(model)
        try:
            async for chunk in entry.client.astream(
                model=bare, messages=messages, tools=tools, **settings
            ):
                yield chunk
        finally:
            self._release(entry)

    async def acomplete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **settings: Any,
    ) -> AssistantTurn:
        """`complete` for a caller on an event loop, through the client's `acomplete`."""
        entry, bare = self._acquire(model)
        try:
            return await entry.client.acomplete(
                model=bare, messages=messages, tools=tools, **settings
            )
        finally:
            self._release(entry)

    def capabilities(self, model: str) -> ModelCapabilities:
        """Curated answer for the full id, else heuristics; never a made-up window."""
        return capabilities_for(model, self._matrix, default_provider=self._default_provider)

    def curated(self, model: str) -> CuratedModel | None:
        """The curated matrix row for `model` (label, prices), or None for a custom model."""
        entry = entry_for(model, self._matrix, default_provider=self._default_provider)
        return entry if isinstance(entry, CuratedModel) else None

    def invalidate(self, name: str | None = None) -> None:
        """Drop cached client(s) so the next call rebuilds with fresh config.

        `name` is a provider name; None drops every client. Each dropped client is closed
        now, or when the last call still running on it ends.
        """
        with self._lock:
            names = list(self._entries) if name is None else [name]
            dropped = [self._entries.pop(n) for n in names if n in self._entries]
            idle = []
            for entry in dropped:
                entry.retired = True
                if entry.leases == 0:
                    idle.append(entry)
        for entry in idle:
            _close_entry(entry)

    def close(self) -> None:
        self.invalidate()

    async def aclose(self) -> None:
        """`close` from an event loop: the clients' loop-side connections are closed on
        it (they cannot be from another thread), then everything else."""
        with self._lock:
            clients = [(entry.name, entry.client) for entry in self._entries.values()]
        for name, client in clients:
            try:
                await client.aclose()
            except Exception:
                logger.warning("closing the %s client failed", name, exc_info=True)
        self.close()


def _close_entry(entry: _Entry) -> None:
    # The client owns the transport it was built with: its close() releases both.
    _close_quietly(entry.name, entry.client)


def _close_quietly(name: str, resource: Any) -> None:
    """Close a dropped client or transport; a failure to release a pool is not the caller's
    problem, so it is logged (never with the profile) and swallowed."""
    close = getattr(resource, "close", None)
    if close is None:
        return
    try:
        close()
    except Exception:
        logger.warning("closing the %s provider client failed", name, exc_info=True)
