"""The admin's MCP pages: register a server, share it with teams, set policies, read the
call record. Secrets are write-only: the form never shows a stored token or header."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages

from openworker.runtime.agent.tools.mcp import discover_and_store
from sessions.mcp.connections import mcp_connection_revoke, mcp_oauth_detect
from sessions.mcp.models import McpCall, McpConnection, McpServer, McpToolPolicy
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
    oauth_client_secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="With a client ID only. Leave blank to keep the stored one.",
    )
    clear_oauth_client_secret = forms.BooleanField(
        required=False, label="Remove the stored OAuth client secret"
    )

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
            "oauth",
            "oauth_scopes",
            "oauth_client_id",
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
        if self.cleaned_data.get("clear_oauth_client_secret"):
            server.set_oauth_client_secret("")
        elif self.cleaned_data.get("oauth_client_secret"):
            server.set_oauth_client_secret(self.cleaned_data["oauth_client_secret"])
        if "oauth_client_id" in self.changed_data or "url" in self.changed_data:
            # A registration belongs to one AS and client: a new one is made at next Connect.
            server.oauth_client_encrypted = ""
            server.oauth_discovery = {}
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
        "oauth_resource_metadata_url",
        "connection_count",
        "tools_listed",
        "tools_refreshed_at",
        "tools_error",
    )
    inlines = [McpToolPolicyInline]
    actions = ["refresh_tools"]

    def delete_model(self, request: Any, obj: McpServer) -> None:
        # The users' grants at the server end with it, not only their rows here.
        for connection in obj.connections.select_related("server"):
            mcp_connection_revoke(connection=connection)
        super().delete_model(request, obj)

    def delete_queryset(self, request: Any, queryset: Any) -> None:
        for connection in McpConnection.objects.filter(server__in=queryset).select_related(
            "server"
        ):
            mcp_connection_revoke(connection=connection)
        super().delete_queryset(request, queryset)

    @admin.display(description="tools")
    def tool_count(self, obj: McpServer) -> int:
        return len(obj.tools_cache or [])

    @admin.display(description="users connected (OAuth)")
    def connection_count(self, obj: McpServer) -> int:
        return obj.connections.count() if obj.pk else 0

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
        tools, error = discover_and_store(server, user_id=request.user.pk)
        if (
            tools is None
            and not server.oauth
            and server.transport != McpServer.Transport.STDIO
            and mcp_oauth_detect(server=server)
        ):
            self.message_user(
                request,
                f"{server.label} asks each user to sign in with their own account (OAuth), so it "
                "is now marked as OAuth: users connect it in Settings. Its tools are listed when "
                "the first user (you too) connects.",
                messages.WARNING,
            )
            return
        if tools is None:
            self.message_user(
                request, f"{server.label}: discovery failed ({error}).", messages.WARNING
            )
        else:
            self.message_user(request, f"{server.label}: {len(tools)} tools.", messages.SUCCESS)


@admin.register(McpConnection)
class McpConnectionAdmin(admin.ModelAdmin):
    """Who connected which server and when; never the tokens. Deleting a connection (or
    the revoke action) revokes the grant at the server where it offers revocation."""

    list_display = ("user", "server", "created_at", "expires_at", "refreshed_at")
    list_filter = ("server",)
    search_fields = ("user__username", "server__name")
    fields = ("user", "server", "scope", "created_at", "expires_at", "refreshed_at")
    readonly_fields = fields
    actions = ["revoke"]

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def get_actions(self, request: Any) -> dict[str, Any]:
        # The stock "delete selected" would skip the revocation at the server.
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    @admin.action(description="Revoke the selected connections", permissions=["delete"])
    def revoke(self, request: Any, queryset: Any) -> None:
        count = 0
        for connection in queryset.select_related("server"):
            mcp_connection_revoke(connection=connection)
            count += 1
        self.message_user(request, f"Revoked {count} connection(s).", messages.SUCCESS)

    def delete_model(self, request: Any, obj: McpConnection) -> None:
        mcp_connection_revoke(connection=obj)


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
