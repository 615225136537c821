"""Identity providers, the people they vouch for, and the group → team mapping.

A provider's client secret is stored only as ciphertext under the provider key ring
(`providers.edge.crypto`, the same MultiFernet as provider API keys, so `rotate_keys`-style
rotation applies); pages never show it back.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from providers.edge import crypto

DEFAULT_SCOPES = "openid email profile groups"


class IdentityProvider(models.Model):
    """One OpenID Provider the admin trusts: discovery from its issuer URL."""

    slug = models.SlugField(
        max_length=40,
        unique=True,
        help_text="Short name in URLs and logs, e.g. 'okta'.",
    )
    name = models.CharField(max_length=80, help_text="Shown on the button: “Sign in with <name>”.")
    issuer = models.URLField(
        max_length=500,
        help_text="The issuer URL; its /.well-known/openid-configuration is read for "
        "every endpoint and the signing keys.",
    )
    client_id = models.CharField(max_length=255)
    client_secret_encrypted = models.TextField(blank=True, editable=False)
    scopes = models.CharField(
        max_length=255,
        default=DEFAULT_SCOPES,
        validators=[RegexValidator(r"(^|\s)openid(\s|$)", "The scopes must include openid.")],
    )
    groups_claim = models.CharField(
        max_length=100,
        default="groups",
        help_text="The claim that lists the person's groups at the provider.",
    )
    staff_group = models.CharField(
        max_length=255,
        blank=True,
        help_text="Members of this provider group are staff here (admin pages); empty: "
        "sign-in never changes staff status.",
    )
    link_by_verified_email = models.BooleanField(
        default=False,
        help_text="Let a first sign-in take over an existing local account with the same "
        "email address, only when the provider says that address is verified.",
    )
    enabled = models.BooleanField(default=True)
    from_environment = models.BooleanField(default=False, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def has_secret(self) -> bool:
        return bool(self.client_secret_encrypted)

    def set_client_secret(self, secret: str) -> None:
        secret = secret.strip()
        self.client_secret_encrypted = crypto.encrypt(secret) if secret else ""

    def client_secret(self) -> str:
        return crypto.decrypt(self.client_secret_encrypted) if self.client_secret_encrypted else ""


class GroupMapping(models.Model):
    """Members of `claim_value` at the provider belong to the team `group` here."""

    provider = models.ForeignKey(
        IdentityProvider, on_delete=models.CASCADE, related_name="group_mappings"
    )
    claim_value = models.CharField("provider group", max_length=255)
    group = models.ForeignKey("auth.Group", on_delete=models.CASCADE, related_name="+")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "claim_value", "group"], name="sso_mapping_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.claim_value} → {self.group}"


class SsoIdentity(models.Model):
    """The link between a local account and a person at a provider: (issuer, sub)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identities"
    )
    provider = models.ForeignKey(
        IdentityProvider, on_delete=models.SET_NULL, null=True, related_name="identities"
    )
    issuer = models.CharField(max_length=500)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_sign_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "SSO identities"
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="sso_identity_unique")
        ]

    def __str__(self) -> str:
        return f"{self.subject} @ {self.issuer}"


class SsoPolicy(models.Model):
    """The one sign-in policy row (pk 1): whether passwords are still accepted, and for whom."""

    require_sso = models.BooleanField(
        "require single sign-on",
        default=False,
        help_text="Refuse password sign-in for everyone except the break-glass admins below.",
    )
    break_glass_users = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        blank=True,
        related_name="+",
        help_text="Local accounts that may still sign in with a password (keep at least one "
        "admin here in case the identity provider is down).",
    )

    class Meta:
        verbose_name = "sign-in policy"
        verbose_name_plural = "sign-in policy"

    def __str__(self) -> str:
        return "Sign-in policy"
