from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from sessions.sso import discovery
from sessions.sso.models import GroupMapping, IdentityProvider, SsoIdentity, SsoPolicy
from sessions.sso.policy import POLICY_PK


class IdentityProviderForm(forms.ModelForm):
    issuer = forms.URLField(
        max_length=500,
        assume_scheme="https",
        help_text=IdentityProvider._meta.get_field("issuer").help_text,
    )
    client_secret = forms.CharField(
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text="Write-only: leave empty to keep the stored secret. Stored encrypted.",
    )

    class Meta:
        model = IdentityProvider
        fields = [
            "name",
            "slug",
            "issuer",
            "client_id",
            "client_secret",
            "scopes",
            "groups_claim",
            "staff_group",
            "link_by_verified_email",
            "enabled",
        ]

    def save(self, commit: bool = True) -> IdentityProvider:
        provider = super().save(commit=False)
        secret = self.cleaned_data.get("client_secret")
        if secret:
            provider.set_client_secret(secret)
        if commit:
            provider.save()
        return provider


class GroupMappingInline(admin.TabularInline):
    model = GroupMapping
    extra = 1
    autocomplete_fields = ["group"]


@admin.register(IdentityProvider)
class IdentityProviderAdmin(admin.ModelAdmin):
    form = IdentityProviderForm
    list_display = ("name", "slug", "issuer", "enabled", "from_environment", "has_secret")
    inlines = [GroupMappingInline]
    prepopulated_fields = {"slug": ("name",)}

    @admin.display(boolean=True, description="secret set")
    def has_secret(self, obj: IdentityProvider) -> bool:
        return obj.has_secret

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        discovery.forget(obj.issuer)


@admin.register(SsoIdentity)
class SsoIdentityAdmin(admin.ModelAdmin):
    list_display = ("user", "provider", "subject", "last_sign_in_at")
    search_fields = ("user__username", "subject")
    readonly_fields = ("user", "provider", "issuer", "subject", "created_at", "last_sign_in_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(SsoPolicy)
class SsoPolicyAdmin(admin.ModelAdmin):
    filter_horizontal = ("break_glass_users",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return not SsoPolicy.objects.filter(pk=POLICY_PK).exists()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        obj.pk = POLICY_PK
        super().save_model(request, obj, form, change)
