"""The Django edge of the provider layer: encrypted provider profiles (and, later, the
curated model matrix). Only this app's modules import Django; `import providers` does not."""

from __future__ import annotations

from django.apps import AppConfig


class ProvidersConfig(AppConfig):
    name = "providers"
    label = "providers"
    verbose_name = "Providers"
    default_auto_field = "django.db.models.BigAutoField"
