"""A provider's discovery document (OpenID Connect Discovery 1.0), read and cached.

Every endpoint and the signing keys' URL come from `<issuer>/.well-known/openid-configuration`,
so an admin types one URL. The document's `issuer` must be the configured one (Discovery
§4.3): a document served for another issuer is refused, not trusted.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from django.core.cache import cache

# Providers change endpoints rarely; five minutes keeps a sign-in to one round trip
# without hiding an admin's fix for long.
DISCOVERY_CACHE_SECONDS = 300
# A sign-in waits on the provider: give up early and say so rather than hang the page.
HTTP_TIMEOUT_SECONDS = 10.0
WELL_KNOWN = "/.well-known/openid-configuration"


class ProviderUnavailable(Exception):
    """The provider could not be reached, or answered with something unusable."""


@dataclass(frozen=True)
class ProviderMetadata:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    userinfo_endpoint: str | None
    end_session_endpoint: str | None
    signing_algs: tuple[str, ...]
    token_auth_methods: tuple[str, ...]


def parse_metadata(doc: dict, *, expected_issuer: str) -> ProviderMetadata:
    """The fields this app uses, checked; pure, for tests."""
    if doc.get("issuer", "").rstrip("/") != expected_issuer.rstrip("/"):
        raise ProviderUnavailable("discovery document names another issuer")
    try:
        return ProviderMetadata(
            issuer=doc["issuer"],
            authorization_endpoint=doc["authorization_endpoint"],
            token_endpoint=doc["token_endpoint"],
            jwks_uri=doc["jwks_uri"],
            userinfo_endpoint=doc.get("userinfo_endpoint"),
            end_session_endpoint=doc.get("end_session_endpoint"),
            signing_algs=tuple(doc.get("id_token_signing_alg_values_supported") or ("RS256",)),
            token_auth_methods=tuple(
                doc.get("token_endpoint_auth_methods_supported") or ("client_secret_basic",)
            ),
        )
    except KeyError as exc:
        raise ProviderUnavailable(f"discovery document lacks {exc.args[0]}") from None


def _cache_key(issuer: str) -> str:
    return f"sso:discovery:{issuer}"


def metadata_for(issuer: str) -> ProviderMetadata:
    doc = cache.get(_cache_key(issuer))
    if doc is None:
        url = issuer.rstrip("/") + WELL_KNOWN
        try:
            response = httpx.get(url, timeout=HTTP_TIMEOUT_SECONDS, follow_redirects=False)
            response.raise_for_status()
            doc = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise ProviderUnavailable(f"discovery failed: {type(exc).__name__}") from None
        if not isinstance(doc, dict):
            raise ProviderUnavailable("discovery document is not a JSON object")
        metadata = parse_metadata(doc, expected_issuer=issuer)
        cache.set(_cache_key(issuer), doc, DISCOVERY_CACHE_SECONDS)
        return metadata
    return parse_metadata(doc, expected_issuer=issuer)


def forget(issuer: str) -> None:
    """Drop the cached document (an admin changed the provider, or a test restarted it)."""
    cache.delete(_cache_key(issuer))
