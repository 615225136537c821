"""Which identity providers are offered, including the one configured by environment."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from sessions.sso.models import IdentityProvider

_env_synced = False


def _env_provider_sync() -> None:
    """Upsert the provider named by OPENWORKER_OIDC_* (settings.SSO_ENV_PROVIDER), once per process.

    One code path for both kinds: the environment's provider is a row like the admin's
    (secret encrypted the same way), marked `from_environment`, and the environment wins.
    """
    global _env_synced
    conf = getattr(settings, "SSO_ENV_PROVIDER", None)
    if _env_synced or not conf:
        return
    with transaction.atomic():
        row = IdentityProvider.objects.select_for_update().filter(slug=conf["slug"]).first()
        row = row or IdentityProvider(slug=conf["slug"])
        row.name = conf["name"]
        row.issuer = conf["issuer"]
        row.client_id = conf["client_id"]
        if row.client_secret() != conf["client_secret"]:
            row.set_client_secret(conf["client_secret"])
        row.from_environment = True
        row.enabled = True
        row.save()
    _env_synced = True


def providers_enabled() -> list[IdentityProvider]:
    _env_provider_sync()
    return list(IdentityProvider.objects.filter(enabled=True))


def provider_enabled(slug: str) -> IdentityProvider | None:
    _env_provider_sync()
    return IdentityProvider.objects.filter(enabled=True, slug=slug).first()
