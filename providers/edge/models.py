"""Encrypted provider profiles: a user's own, or the organisation's (owner is null)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from providers.edge import crypto


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


class MatrixModel(models.Model):
    """One row of the curated model matrix, managed by admins.

    The provider layer reads these rows through `providers.edge.matrix.curated_matrix()` (cached,
    invalidated on every save/delete) as `providers.capabilities.CuratedModel`s. A capability
    left empty means unknown, and a price left empty means unknown, not free: nothing here is
    ever invented to fill a gap.
    """

    class Thinking(models.TextChoices):
        BUDGET = "budget", "Token budget"
        ADAPTIVE = "adaptive", "Adaptive"
        EFFORT = "effort", "Effort level"

    model_id = models.CharField(
        "model id",
        max_length=200,
        unique=True,
        help_text="Full id with the provider prefix, e.g. anthropic:claude-sonnet-4-5.",
    )
    label = models.CharField(max_length=200)
    provider = models.CharField(max_length=50)
    vision = models.BooleanField(null=True, blank=True)
    pdf = models.BooleanField("PDF input", null=True, blank=True)
    tools = models.BooleanField(null=True, blank=True)
    reasoning = models.BooleanField(null=True, blank=True)
    thinking = models.CharField(
        max_length=20, choices=Thinking.choices, blank=True, help_text="How it takes a budget."
    )
    context_window = models.PositiveIntegerField(null=True, blank=True)
    max_output_tokens = models.PositiveIntegerField(null=True, blank=True)
    # Per million tokens, one price per non-overlapping TokenUsage bucket.
    price_input = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    price_output = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    price_cache_read = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    price_cache_write = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    enabled = models.BooleanField(default=True, help_text="Offered in the model picker.")
    order = models.PositiveIntegerField(default=0)
    groups = models.ManyToManyField(
        "auth.Group",
        blank=True,
        related_name="curated_models",
        help_text="Teams that may pick this model; none selected means everyone.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["order", "label"]
        verbose_name = "curated model"
        verbose_name_plural = "curated model matrix"

    def __str__(self) -> str:
        return self.label or self.model_id


class TeamModelPolicy(models.Model):
    """What a team (an auth group) may run beyond the curated models it is offered.

    Read only through `providers.edge.model_policy`: a member gets the most permissive
    policy among their teams, and a user in no team with a policy gets the site default
    (settings.CUSTOM_MODELS_DEFAULT).
    """

    class Custom(models.TextChoices):
        OFF = "off", "Not allowed: only the curated models offered to the team"
        OWN_KEY = "own_key", "Allowed on the member's own provider key only"
        ANY_KEY = "any_key", "Allowed, also on the organisation's keys"

    team = models.OneToOneField("auth.Group", on_delete=models.CASCADE, related_name="model_policy")
    custom_models = models.CharField(
        "custom model ids",
        max_length=10,
        choices=Custom.choices,
        default=Custom.OWN_KEY,
        help_text=(
            "Whether members may type a model id the matrix does not offer them, and "
            "whose key runs it. The organisation's keys run only curated models the team "
            "may pick unless this says otherwise."
        ),
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "team model policy"
        verbose_name_plural = "team model policies"

    def __str__(self) -> str:
        return f"{self.team}: {self.get_custom_models_display()}"
