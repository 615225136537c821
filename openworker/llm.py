"""How the runtime reaches the provider layer: one router per turn for the session's
owner, reading that user's profiles (then the organisation's) from the SecretStore."""

from __future__ import annotations

from django.conf import settings

from providers.router import ProviderRouter
from providers.secret_store import UserSecretStore


def curated_matrix() -> dict:
    """The admin-managed curated model matrix (empty until the admin issue lands)."""
    return {}


def router_for_user(user_id: int) -> ProviderRouter:
    return ProviderRouter(
        UserSecretStore(user_id),
        matrix=curated_matrix,
        embedded=not settings.DISTRIBUTED,
        default_provider=settings.DEFAULT_PROVIDER,
    )
