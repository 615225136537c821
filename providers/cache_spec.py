"""Prompt caching declared per provider (seed 002 §四): `providers/cache/<provider>.json`.

Each vendor caches in its own way, so no single abstraction covers them; instead every
provider declares which of four modes it is in and the few facts its wire translation
needs, and provider code reads the declaration rather than hard-coding rules:

- `explicit` (Anthropic, Bedrock): breakpoints in the request, `breakpoint_format`
  `cache_control` (a marker on a block) or `cachePoint` (a block of its own), at most
  `max_breakpoints` per request.
- `auto` (the OpenAI family): the vendor caches prefixes by itself; a cache key sent as
  the body field `cache_key_param` (or the header `cache_key_header`) routes a session
  to the same cache.
- `none`: nothing to send, nothing to read.
- `out_of_band` (Gemini): caches are separate resources; only hit statistics are read.

`retention_ttl_map` maps a retention ("short", "long") to the wire TTL, null meaning the
vendor's default (no field sent). `long_ttl_endpoints`, when declared, limits the long TTL
to those hosts: a compatible proxy may refuse a field the vendor's own API accepts.

A provider without a declaration is `none`: never a guess at a vendor's cache fields. A
malformed declaration raises `ValueError` when loaded: they ship with the code, so a typo
must fail the tests, not silently turn caching off.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

# The package that holds the `<provider>.json` declarations.
DECLARATIONS_PACKAGE = "providers.cache"

MODE_EXPLICIT = "explicit"
MODE_AUTO = "auto"
MODE_NONE = "none"
MODE_OUT_OF_BAND = "out_of_band"
MODES = (MODE_EXPLICIT, MODE_AUTO, MODE_NONE, MODE_OUT_OF_BAND)

FORMAT_CACHE_CONTROL = "cache_control"
FORMAT_CACHE_POINT = "cachePoint"
BREAKPOINT_FORMATS = (FORMAT_CACHE_CONTROL, FORMAT_CACHE_POINT)

RETENTION_SHORT = "short"
RETENTION_LONG = "long"
RETENTIONS = (RETENTION_SHORT, RETENTION_LONG)

# Only plain provider names map to a file: a name is never a path.
_PROVIDER_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_KNOWN_KEYS = frozenset(
    {
        "mode",
        "breakpoint_format",
        "retention_ttl_map",
        "max_breakpoints",
        "cache_key_param",
        "cache_key_header",
        "long_ttl_endpoints",
        "notes",
    }
)


@dataclass(frozen=True)
class CacheSpec:
    """One provider's caching declaration (all fields read-only)."""

    provider: str
    mode: str = MODE_NONE
    breakpoint_format: str | None = None
    retention_ttl_map: Mapping[str, str | None] = field(
        default_factory=lambda: MappingProxyType({})
    )
    max_breakpoints: int = 0
    cache_key_param: str | None = None
    cache_key_header: str | None = None
    long_ttl_endpoints: tuple[str, ...] = ()

    @property
    def explicit(self) -> bool:
        return self.mode == MODE_EXPLICIT

    @property
    def auto(self) -> bool:
        return self.mode == MODE_AUTO


def parse_cache_spec(provider: str, data: Mapping[str, Any]) -> CacheSpec:
    """A validated `CacheSpec` from a declaration's JSON object; ValueError when malformed."""

    def bad(reason: str) -> ValueError:
        return ValueError(f"cache declaration for {provider!r}: {reason}")

    if not isinstance(data, Mapping):
        raise bad("not a JSON object")
    unknown = set(data) - _KNOWN_KEYS
    if unknown:
        raise bad(f"unknown keys {sorted(unknown)}")
    mode = data.get("mode")
    if mode not in MODES:
        raise bad(f"mode must be one of {MODES}, got {mode!r}")
    breakpoint_format = data.get("breakpoint_format")
    max_breakpoints = data.get("max_breakpoints", 0)
    if mode == MODE_EXPLICIT:
        if breakpoint_format not in BREAKPOINT_FORMATS:
            raise bad(f"explicit mode needs breakpoint_format in {BREAKPOINT_FORMATS}")
        if not isinstance(max_breakpoints, int) or isinstance(max_breakpoints, bool):
            raise bad("max_breakpoints must be an integer")
        if max_breakpoints < 1:
            raise bad("explicit mode needs max_breakpoints >= 1")
    elif breakpoint_format is not None or max_breakpoints:
        raise bad("breakpoints are only declared in explicit mode")
    ttl_map = data.get("retention_ttl_map") or {}
    if not isinstance(ttl_map, Mapping) or set(ttl_map) - set(RETENTIONS):
        raise bad(f"retention_ttl_map keys must be among {RETENTIONS}")
    if any(value is not None and not isinstance(value, str) for value in ttl_map.values()):
        raise bad("retention_ttl_map values are strings or null")
    for name in ("cache_key_param", "cache_key_header"):
        value = data.get(name)
        if value is not None and (mode != MODE_AUTO or not isinstance(value, str) or not value):
            raise bad(f"{name} is a non-empty string, and only in auto mode")
    endpoints = data.get("long_ttl_endpoints") or []
    if not isinstance(endpoints, list) or not all(isinstance(e, str) and e for e in endpoints):
        raise bad("long_ttl_endpoints is a list of host names")
    return CacheSpec(
        provider=provider,
        mode=mode,
        breakpoint_format=breakpoint_format,
        retention_ttl_map=MappingProxyType(dict(ttl_map)),
        max_breakpoints=max_breakpoints if mode == MODE_EXPLICIT else 0,
        cache_key_param=data.get("cache_key_param"),
        cache_key_header=data.get("cache_key_header"),
        long_ttl_endpoints=tuple(e.lower() for e in endpoints),
    )


@functools.cache
def get_cache_spec(provider: str | None) -> CacheSpec:
    """The declaration of `provider`, or a `none` spec when it has none."""
    name = (provider or "").strip()
    if not _PROVIDER_NAME.match(name):
        return CacheSpec(provider=name)
    resource = resources.files(DECLARATIONS_PACKAGE).joinpath(f"{name}.json")
    if not resource.is_file():
        return CacheSpec(provider=name)
    return parse_cache_spec(name, json.loads(resource.read_text(encoding="utf-8")))


def declared_providers() -> list[str]:
    """Names of every provider with a shipped declaration."""
    root = resources.files(DECLARATIONS_PACKAGE)
    return sorted(
        entry.name.removesuffix(".json") for entry in root.iterdir() if entry.name.endswith(".json")
    )


def cache_mode(provider: str | None) -> str:
    """`explicit`, `auto`, `none` or `out_of_band` for `provider` (`none` when undeclared)."""
    return get_cache_spec(provider).mode


def cache_key_param(provider: str | None) -> str | None:
    """The request-body field that carries the session's cache key, if the provider has one."""
    return get_cache_spec(provider).cache_key_param


def _spec(spec_or_provider: CacheSpec | str | None) -> CacheSpec:
    if isinstance(spec_or_provider, CacheSpec):
        return spec_or_provider
    return get_cache_spec(spec_or_provider)


def long_ttl_allowed(spec: CacheSpec, base_url: str | None) -> bool:
    """Whether the long TTL may be asked of `base_url` (always, unless the declaration lists
    endpoints; then only those hosts: no base URL means the vendor's default, allowed)."""
    if not spec.long_ttl_endpoints or not base_url:
        return True
    host = (urlsplit(base_url).hostname or "").lower().rstrip(".")
    return host in spec.long_ttl_endpoints


def ttl_for_retention(
    spec_or_provider: CacheSpec | str | None,
    retention: str | None,
    *,
    base_url: str | None = None,
) -> str | None:
    """The wire TTL for a retention ("short" or "long"; None is short), or None for the
    vendor's default. ValueError for any other retention: a setting typo must not silently
    change what a team pays."""
    spec = _spec(spec_or_provider)
    key = retention or RETENTION_SHORT
    if key not in RETENTIONS:
        raise ValueError(f"cache retention must be one of {RETENTIONS}, got {retention!r}")
    if key == RETENTION_LONG and not long_ttl_allowed(spec, base_url):
        key = RETENTION_SHORT
    return spec.retention_ttl_map.get(key)
