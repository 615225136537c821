"""The SecretStore the router reads: `get("provider:<name>") -> {"api_key", "base_url", ...}`.

Resolution per DESIGN.md "Secrets": the user's own profile first, then the
organisation's. A user's profile is used whole, never mixed with the organisation's: a
custom base URL can only ever receive that user's own key, and a user profile without
a key fails closed rather than borrowing the organisation key for the user's URL.
"""

from __future__ import annotations

from typing import Any

from django.db.models import F, Q

from openworker.prepared_query import AnyOf, PreparedQuery
from providers.edge.models import ProviderProfile

PREFIX = "provider:"


class UserSecretStore:
    """Every profile the user may use, read and decrypted once, at construction.

    Built where database access is allowed (the engine builds it on its database
    threads); `get()` is then pure memory, so a provider client built lazily inside a
    stream thread never opens a database connection of its own.
    """

    def __init__(
        self,
        user_id: int | None,
        *,
        org_keys: bool = True,
        resolved: list[dict[str, Any]] | None = None,
    ) -> None:
        """`org_keys=False`: the user's own profiles only (providers.model_policy: a model
        the organisation's keys may not serve). `resolved`: the profiles already read and
        decrypted (`user_secret_stores`), instead of reading them here."""
        self.user_id = user_id
        if resolved is None:
            if user_id is None:
                rows = _ORG_PROFILES.rows() if org_keys else []
            else:
                query = _PROFILES if org_keys else _OWN_PROFILES
                rows = query.rows(user_id=user_id)
            resolved = [_resolved(_profile(row)) for row in rows]
        own: dict[str, dict[str, Any]] = {}
        org: dict[str, dict[str, Any]] = {}
        for profile in resolved:
            if profile["owner_id"] is None:
                if org_keys:
                    org[profile["provider"]] = profile["settings"]
            elif profile["owner_id"] == user_id:
                own[profile["provider"]] = profile["settings"]
        # The user's profile wins whole: never mixed with the organisation's.
        self._profiles = {**org, **own}

    def get(self, key: str) -> dict[str, Any] | None:
        if not key.startswith(PREFIX):
            return None
        profile = self._profiles.get(key[len(PREFIX) :])
        return dict(profile) if profile is not None else None


# Read on every turn start (the router is built per turn): compiled once
# (openworker.prepared_query).
_COLUMNS = ("owner_id", "provider", "api_key_encrypted", "base_url", "region")
_PROFILES = PreparedQuery(
    lambda user_id: ProviderProfile.objects.filter(
        Q(owner_id=user_id) | Q(owner__isnull=True)
    ).values_list(*_COLUMNS),
    user_id=int,
)
_OWN_PROFILES = PreparedQuery(
    lambda user_id: ProviderProfile.objects.filter(owner_id=user_id).values_list(*_COLUMNS),
    user_id=int,
)
_ORG_PROFILES = PreparedQuery(
    lambda: ProviderProfile.objects.filter(owner__isnull=True).values_list(*_COLUMNS)
)
# A burst's users and the organisation's (any number of users: compiled once too).
_PROFILES_OF_MANY = PreparedQuery(
    lambda user_ids: ProviderProfile.objects.filter(
        Q(AnyOf(F("owner_id"), user_ids)) | Q(owner__isnull=True)
    ).values_list(*_COLUMNS),
    user_ids=list[int],
)


def user_secret_stores(wanted: list[tuple[int, bool]]) -> list[UserSecretStore]:
    """`UserSecretStore(user_id, org_keys=...)` for each (user id, org_keys) of a burst of
    turn starts, in order: one query for every user's profiles and the organisation's,
    each profile decrypted once however many of the burst's users it serves."""
    if len(wanted) <= 1:  # a lone start: the queries compiled once
        return [UserSecretStore(user_id, org_keys=org_keys) for user_id, org_keys in wanted]
    users = sorted({user_id for user_id, _ in wanted})
    org: list[dict[str, Any]] = []
    own: dict[int, list[dict[str, Any]]] = {}
    for row in _PROFILES_OF_MANY.rows(user_ids=users):
        profile = _resolved(_profile(row))
        owner = profile["owner_id"]
        (org if owner is None else own.setdefault(owner, [])).append(profile)
    return [
        UserSecretStore(user_id, org_keys=org_keys, resolved=[*org, *own.get(user_id, [])])
        for user_id, org_keys in wanted
    ]


def _profile(row: tuple[Any, ...]) -> ProviderProfile:
    return ProviderProfile(**dict(zip(_COLUMNS, row, strict=True)))


def _resolved(profile: ProviderProfile) -> dict[str, Any]:
    return {
        "owner_id": profile.owner_id,
        "provider": profile.provider,
        "settings": {
            "api_key": profile.api_key() or None,
            "base_url": profile.base_url or None,
            "region": profile.region or None,
            "scope": "organisation" if profile.owner_id is None else "user",
        },
    }
