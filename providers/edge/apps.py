"""The Django edge of the provider layer: encrypted provider profiles, the curated model
matrix table, the SecretStore and the user's provider settings pages. Only this package
imports Django; the pure core (`providers/*.py`, `providers/wire/`) never does.

The app keeps the label `providers` (its tables and migrations predate the move)."""

from __future__ import annotations

from django.apps import AppConfig


class ProvidersConfig(AppConfig):
    name = "providers.edge"
    label = "providers"
    verbose_name = "Providers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from providers.edge import matrix  # noqa: F401 - connects the cache invalidation receivers
