"""Encrypted provider profiles: a user's own, or the organisation's (owner is null)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from providers import crypto


class ProviderProfile(models.Model):
    """Credentials and endpoint for one provider.

    The API key is stored only as ciphertext (`api_key_encrypted`) and is write-only in
    the UI: pages show `key_last4`, never the key.
    """

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="provider_profiles",
        help_text="Empty for the organisation's profile, used when a user has none.",
    )
    provider = models.CharField(max_length=50)
    api_key_encrypted = models.TextField(blank=True)
    key_last4 = models.CharField(max_length=4, blank=True)
    base_url = models.URLField(max_length=500, blank=True)
    region = models.CharField(max_length=50, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "provider"],
                condition=Q(owner__isnull=False),
                name="profile_owner_provider",
            ),
            models.UniqueConstraint(
                fields=["provider"], condition=Q(owner__isnull=True), name="profile_org_provider"
            ),
        ]

    def __str__(self) -> str:
        whose = "organisation" if self.owner_id is None else f"user {self.owner_id}"
        return f"{self.provider} ({whose})"

    @property
    def has_key(self) -> bool:
        return bool(self.api_key_encrypted)

    def set_api_key(self, api_key: str) -> None:
        api_key = api_key.strip()
        self.api_key_encrypted = crypto.encrypt(api_key) if api_key else ""
        self.key_last4 = api_key[-4:] if len(api_key) >= 8 else ""

    def api_key(self) -> str:
        return crypto.decrypt(self.api_key_encrypted) if self.api_key_encrypted else ""
