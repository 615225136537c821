"""The admin's MCP pages: register a server, share it with teams, set policies, read the
call record. Secrets are write-only: the form never shows a stored token or header."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages

from openworker.runtime.agent.tools.mcp import discover_and_store
from sessions.mcp.models import McpCall, McpServer, McpToolPolicy
from sessions.mcp.services import mcp_url_refusal


def _parse_headers(text: str) -> dict[str, str]:
    headers: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
            raise forms.ValidationError(f"Line {number}: use “Header-Name: value”.")
        headers[name.strip()] = value.strip()
    return headers


class McpServerForm(forms.ModelForm):
    url = forms.URLField(required=False, max_length=500, assume_scheme="https")
    bearer_token = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Sent as “Authorization: Bearer …”. Leave blank to keep the stored one.",
    )
    clear_bearer = forms.BooleanField(required=False, label="Remove the stored bearer token")
    static_headers = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="One “Name: value” per line, stored encrypted. Leave blank to keep them.",
    )
    clear_headers = forms.BooleanField(required=False, label="Remove the stored headers")

    class Meta:
        model = McpServer
        fields = [
            "name",
            "display_name",
            "transport",
            "url",
            "command",
            "args",
            "default_policy",
            "sensitive",
            "timeout_seconds",
            "max_result_bytes",
            "teams",
            "enabled",
        ]

    def clean_static_headers(self) -> dict[str, str]:
        return _parse_headers(self.cleaned_data.get("static_headers") or "")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        url = data.get("url")
        if data.get("transport") != McpServer.Transport.STDIO and url:
            refusal = mcp_url_refusal(url)
            if refusal:
                self.add_error("url", refusal)
        return data

    def save(self, commit: bool = True) -> McpServer:
        server = super().save(commit=False)
        if self.cleaned_data.get("clear_bearer"):
            server.set_bearer("")
        elif self.cleaned_data.get("bearer_token"):
            server.set_bearer(self.cleaned_data["bearer_token"])
        if self.cleaned_data.get("clear_headers"):
            server.set_headers({})
        elif self.cleaned_data.get("static_headers"):
            server.set_headers(self.cleaned_data["static_headers"])
        if commit:
            server.save()
            self.save_m2m()
        return server


class McpToolPolicyInline(admin.TabularInline):
    model = McpToolPolicy
    extra = 0


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin):
    form = McpServerForm
    list_display = ("name", "display_name", "transport", "enabled", "default_policy", "tool_count")
    list_filter = ("transport", "enabled")
    filter_horizontal = ("teams",)
    readonly_fields = (
        "has_bearer",
        "has_headers",
        "tools_listed",
        "tools_refreshed_at",
        "tools_error",
    )
    inlines = [McpToolPolicyInline]
    actions = ["refresh_tools"]

    @admin.display(description="tools")
    def tool_count(self, obj: McpServer) -> int:
        return len(obj.tools_cache or [])

    @admin.display(description="tools discovered")
    def tools_listed(self, obj: McpServer) -> str:
        return ", ".join(t.get("name", "") for t in obj.tools_cache or []) or "—"

    def save_model(self, request: Any, obj: McpServer, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if obj.enabled:
            self._refresh(request, obj)

    @admin.action(description="Refresh the tool list")
    def refresh_tools(self, request: Any, queryset: Any) -> None:
        for server in queryset:
            self._refresh(request, server)

    def _refresh(self, request: Any, server: McpServer) -> None:
        tools, error = discover_and_store(server)
        if tools is None:
            self.message_user(
                request, f"{server.label}: discovery failed ({error}).", messages.WARNING
            )
        else:
            self.message_user(request, f"{server.label}: {len(tools)} tools.", messages.SUCCESS)


@admin.register(McpCall)
class McpCallAdmin(admin.ModelAdmin):
    list_display = ("started_at", "user", "server_name", "tool", "outcome", "duration_ms")
    list_filter = ("outcome", "server_name")
    search_fields = ("tool", "server_name", "call_id")

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False
