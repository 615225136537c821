"""Admin of the provider layer's Django edge: the organisation's provider profiles (keys
write-only) and the curated model matrix.

Key material never reaches a page: the key field is a password input that is never
filled back in, the list shows only `key_last4`, and the ciphertext field is excluded.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from providers.edge.models import MatrixModel, ProviderProfile, TeamModelPolicy
from providers.registry import provider_names


def _provider_choices() -> list[tuple[str, str]]:
    return [(name, name) for name in provider_names()]


class OrgProfileForm(forms.ModelForm):
    """Set or replace the key without ever showing it; leave it empty to keep the old one."""

    provider = forms.ChoiceField(choices=_provider_choices)
    base_url = forms.URLField(max_length=500, required=False, assume_scheme="https")
    api_key = forms.CharField(
        label="API key",
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text="Write-only: leave empty to keep the stored key.",
    )
    clear_key = forms.BooleanField(required=False, label="Remove the stored key")

    class Meta:
        model = ProviderProfile
        fields = ("provider", "base_url", "region")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        provider = data.get("provider")
        others = ProviderProfile.objects.filter(owner__isnull=True, provider=provider)
        if self.instance.pk:
            others = others.exclude(pk=self.instance.pk)
        if provider and others.exists():
            raise forms.ValidationError("The organisation already has a profile for this provider.")
        return data

    def save(self, commit: bool = True) -> ProviderProfile:
        profile = super().save(commit=False)
        profile.owner = None
        if self.cleaned_data.get("clear_key"):
            profile.set_api_key("")
        elif self.cleaned_data.get("api_key"):
            profile.set_api_key(self.cleaned_data["api_key"])
        if commit:
            profile.save()
        return profile


@admin.register(ProviderProfile)
class OrgProviderProfileAdmin(admin.ModelAdmin):
    """The organisation's profiles (owner empty), used when a user has none of their own.
    Users manage their own profiles in their settings; they are not listed here."""

    form = OrgProfileForm
    list_display = ("provider", "key_status", "base_url", "region", "updated_at")
    search_fields = ("provider",)

    @admin.display(description="key")
    def key_status(self, obj: ProviderProfile) -> str:
        if not obj.has_key:
            return "—"
        return f"…{obj.key_last4}" if obj.key_last4 else "set"

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).filter(owner__isnull=True)


class MatrixModelForm(forms.ModelForm):
    provider = forms.ChoiceField(choices=_provider_choices)

    class Meta:
        model = MatrixModel
        fields = (
            "model_id",
            "label",
            "provider",
            "enabled",
            "order",
            "groups",
            "tools",
            "vision",
            "pdf",
            "reasoning",
            "thinking",
            "context_window",
            "max_output_tokens",
            "price_input",
            "price_output",
            "price_cache_read",
            "price_cache_write",
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        model_id, provider = data.get("model_id") or "", data.get("provider")
        if model_id and provider and ":" in model_id:
            prefix = model_id.split(":", 1)[0]
            if prefix in provider_names() and prefix != provider:
                self.add_error("provider", f"The model id names the provider {prefix!r}.")
        return data


@admin.register(MatrixModel)
class MatrixModelAdmin(admin.ModelAdmin):
    """The curated matrix. Empty capability or price cells mean unknown: leave them empty
    rather than guess. Saving reloads the matrix everywhere (providers.edge.matrix)."""

    form = MatrixModelForm
    list_display = (
        "model_id",
        "label",
        "provider",
        "tools",
        "vision",
        "pdf",
        "reasoning",
        "context_window",
        "max_output_tokens",
        "price_input",
        "price_output",
        "enabled",
        "order",
    )
    list_editable = ("enabled", "order")
    list_filter = ("provider", "enabled")
    search_fields = ("model_id", "label")
    filter_horizontal = ("groups",)
    fieldsets = (
        (None, {"fields": ("model_id", "label", "provider", "enabled", "order", "groups")}),
        (
            "Capabilities (empty: unknown)",
            {
                "fields": (
                    "tools",
                    "vision",
                    "pdf",
                    "reasoning",
                    "thinking",
                    "context_window",
                    "max_output_tokens",
                )
            },
        ),
        (
            "Prices per million tokens (empty: unknown, not free)",
            {"fields": ("price_input", "price_output", "price_cache_read", "price_cache_write")},
        ),
    )


@admin.register(TeamModelPolicy)
class TeamModelPolicyAdmin(admin.ModelAdmin):
    """Per team: custom model ids allowed or not, and on whose key (providers.model_policy)."""

    list_display = ("team", "custom_models", "updated_at")
    list_select_related = ("team",)
    fields = ("team", "custom_models")
