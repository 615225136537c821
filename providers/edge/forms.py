"""Forms of the provider settings page (the Django edge of the provider layer).

The API key field is write-only: it never renders a value, an empty submission keeps
the stored key, and only `key_last4` is ever shown back.
"""

from __future__ import annotations

from typing import Any

from django import forms

from providers.edge.models import ProviderProfile
from providers.registry import ProviderDescriptor

# Long enough for any vendor's key (AWS secret pairs included), short enough to refuse junk.
MAX_KEY_CHARS = 1_000


class ProviderProfileForm(forms.Form):
    api_key = forms.CharField(
        label="API key",
        required=False,
        max_length=MAX_KEY_CHARS,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text="Leave empty to keep the stored key. Only its last four characters are shown.",
    )
    clear_key = forms.BooleanField(label="Remove the stored key", required=False)
    base_url = forms.URLField(
        label="Base URL",
        required=False,
        max_length=500,
        assume_scheme="https",
        help_text="Empty: the provider's default endpoint.",
    )
    region = forms.CharField(label="Region", required=False, max_length=50)

    def __init__(self, *args: Any, descriptor: ProviderDescriptor, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.descriptor = descriptor
        self.fields["base_url"].widget.attrs["placeholder"] = descriptor.default_base_url
        if not self.needs_region:
            del self.fields["region"]
        if not descriptor.requires_key:
            self.fields["api_key"].help_text = "Optional for this provider."

    @property
    def needs_region(self) -> bool:
        return "{region}" in self.descriptor.default_base_url or self.descriptor.auth == "sigv4"

    def clean_api_key(self) -> str:
        key = self.cleaned_data.get("api_key", "").strip()
        if key and any(ch.isspace() for ch in key):
            raise forms.ValidationError("An API key has no spaces or line breaks.")
        return key

    def save(self, profile: ProviderProfile) -> ProviderProfile:
        data = self.cleaned_data
        if data.get("clear_key"):
            profile.set_api_key("")
        elif data.get("api_key"):
            profile.set_api_key(data["api_key"])
        profile.base_url = data.get("base_url", "")
        profile.region = data.get("region", "") if self.needs_region else ""
        profile.save()
        return profile


class ConnectionTestForm(forms.Form):
    model = forms.CharField(
        label="Model to test with",
        max_length=200,
        help_text="A model of this provider; a one-word request is sent to it.",
    )
