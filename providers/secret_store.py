"""The SecretStore the router reads: `get("provider:<name>") -> {"api_key", "base_url", ...}`.

Resolution per DESIGN.md "Secrets": the user's own profile first, then the
organisation's. A user's profile is used whole, never mixed with the organisation's: a
custom base URL can only ever receive that user's own key, and a user profile without
a key fails closed rather than borrowing the organisation key for the user's URL.
"""

from __future__ import annotations

from typing import Any

from providers.models import ProviderProfile

PREFIX = "provider:"


class UserSecretStore:
    def __init__(self, user_id: int | None) -> None:
        self.user_id = user_id

    def get(self, key: str) -> dict[str, Any] | None:
        if not key.startswith(PREFIX):
            return None
        provider = key[len(PREFIX) :]
        profile = self._profile(provider)
        if profile is None:
            return None
        return {
            "api_key": profile.api_key() or None,
            "base_url": profile.base_url or None,
            "region": profile.region or None,
            "scope": "organisation" if profile.owner_id is None else "user",
        }

    def _profile(self, provider: str) -> ProviderProfile | None:
        if self.user_id is not None:
            own = ProviderProfile.objects.filter(owner_id=self.user_id, provider=provider).first()
            if own is not None:
                return own
        return ProviderProfile.objects.filter(owner__isnull=True, provider=provider).first()
