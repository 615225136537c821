"""The SecretStore the router reads: `get("provider:<name>") -> {"api_key", "base_url", ...}`.

Resolution per DESIGN.md "Secrets": the user's own profile first, then the
organisation's. A user's profile is used whole, never mixed with the organisation's: a
custom base URL can only ever receive that user's own key, and a user profile without
a key fails closed rather than borrowing the organisation key for the user's URL.
"""

from __future__ import annotations

from typing import Any

from providers.edge.models import ProviderProfile

PREFIX = "provider:"


class UserSecretStore:
    """Every profile the user may use, read and decrypted once, at construction.

    Built where database access is allowed (the engine builds it on its database
    threads); `get()` is then pure memory, so a provider client built lazily inside a
    stream thread never opens a database connection of its own.
    """

    def __init__(self, user_id: int | None, *, org_keys: bool = True) -> None:
        """`org_keys=False`: the user's own profiles only (providers.model_policy: a model
        the organisation's keys may not serve)."""
        self.user_id = user_id
        rows = ProviderProfile.objects.filter(owner__isnull=True)
        if not org_keys:
            rows = ProviderProfile.objects.none()
        if user_id is not None:
            rows = ProviderProfile.objects.filter(owner_id=user_id) | rows
        own: dict[str, dict[str, Any]] = {}
        org: dict[str, dict[str, Any]] = {}
        for profile in rows:
            (org if profile.owner_id is None else own)[profile.provider] = _resolved(profile)
        # The user's profile wins whole: never mixed with the organisation's.
        self._profiles = {**org, **own}

    def get(self, key: str) -> dict[str, Any] | None:
        if not key.startswith(PREFIX):
            return None
        profile = self._profiles.get(key[len(PREFIX) :])
        return dict(profile) if profile is not None else None


def _resolved(profile: ProviderProfile) -> dict[str, Any]:
    return {
        "api_key": profile.api_key() or None,
        "base_url": profile.base_url or None,
        "region": profile.region or None,
        "scope": "organisation" if profile.owner_id is None else "user",
    }
