"""MCP servers, their per-tool policies, the servers a session uses, and the call record.

Secrets (a bearer token, static headers) are stored only as ciphertext under the provider
key ring (`providers.edge.crypto`) and are write-only in the admin. A stdio server runs a
command on the host, so only an admin can register one: there is no user-facing form.
"""

from __future__ import annotations

import json
import re
import uuid

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import models

from providers.edge import crypto

# The server's name prefixes each of its tools' names (`<name>__<tool>`): short, and made of
# the characters every provider accepts in a tool name, so the prefix never needs rewriting;
# single underscores only, so the first "__" of a tool name always ends the server's name.
SERVER_NAME_PATTERN = re.compile(r"^(?=.{1,20}$)[a-z][a-z0-9]*(?:_[a-z0-9]+)*$")

# A call that waits longer than this on one MCP server is ended and reported to the model.
DEFAULT_TIMEOUT_SECONDS = 30
# What one tool result may bring back into the context (text plus encoded images).
DEFAULT_MAX_RESULT_BYTES = 100_000


def validate_server_name(value: str) -> None:
    if not SERVER_NAME_PATTERN.match(value or ""):
        raise ValidationError(
            "Use 1-20 lowercase letters, digits and single underscores, starting with a letter."
        )


class Policy(models.TextChoices):
    ALLOW = "allow", "Allow"
    ASK = "ask", "Ask the user"
    DENY = "deny", "Deny"


class McpServer(models.Model):
    class Transport(models.TextChoices):
        STREAMABLE_HTTP = "streamable_http", "Streamable HTTP (URL)"
        SSE = "sse", "HTTP + SSE (older servers)"
        STDIO = "stdio", "stdio (a command on this host)"

    name = models.CharField(max_length=20, unique=True, validators=[validate_server_name])
    display_name = models.CharField(max_length=100, blank=True)
    transport = models.CharField(
        max_length=20, choices=Transport.choices, default=Transport.STREAMABLE_HTTP
    )
    url = models.URLField(max_length=500, blank=True)
    command = models.CharField(max_length=500, blank=True)
    args = models.JSONField(default=list, blank=True, help_text="A JSON list of arguments.")
    bearer_encrypted = models.TextField(blank=True, editable=False)
    headers_encrypted = models.TextField(blank=True, editable=False)
    default_policy = models.CharField(max_length=10, choices=Policy.choices, default=Policy.ASK)
    sensitive = models.BooleanField(
        default=False, help_text="Keep argument values out of the call record."
    )
    timeout_seconds = models.PositiveIntegerField(default=DEFAULT_TIMEOUT_SECONDS)
    max_result_bytes = models.PositiveIntegerField(default=DEFAULT_MAX_RESULT_BYTES)
    teams = models.ManyToManyField(Group, blank=True, related_name="mcp_servers")
    enabled = models.BooleanField(default=True)
    # OAuth (the MCP authorization spec): each user connects their own account at the
    # server's authorization server; their calls carry their own token (`McpConnection`).
    oauth = models.BooleanField(
        "users connect their own account (OAuth)",
        default=False,
        help_text="Set on its own when the server answers 401 with OAuth metadata.",
    )
    oauth_scopes = models.CharField(
        max_length=500, blank=True, help_text="Blank: the scopes the server's metadata lists."
    )
    oauth_client_id = models.CharField(
        max_length=200,
        blank=True,
        help_text="Only for an authorization server without dynamic client registration.",
    )
    oauth_client_secret_encrypted = models.TextField(blank=True, editable=False)
    # From the 401's `WWW-Authenticate: Bearer resource_metadata=…` (RFC 9728 §5.1).
    oauth_resource_metadata_url = models.URLField(max_length=500, blank=True, editable=False)
    # `oauth.AuthServerInfo.to_json()`: public metadata, refreshed on each Connect.
    oauth_discovery = models.JSONField(default=dict, blank=True, editable=False)
    # The client this site registered (RFC 7591); JSON, encrypted (it holds the secret).
    oauth_client_encrypted = models.TextField(blank=True, editable=False)
    # Discovery cache: [{"name", "description", "inputSchema"}] as the server listed them.
    tools_cache = models.JSONField(default=list, blank=True, editable=False)
    tools_refreshed_at = models.DateTimeField(null=True, blank=True, editable=False)
    tools_error = models.CharField(max_length=500, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.label

    @property
    def label(self) -> str:
        return self.display_name or self.name

    def clean(self) -> None:
        if self.transport == self.Transport.STDIO:
            if not self.command.strip():
                raise ValidationError({"command": "A stdio server needs a command."})
        elif not self.url:
            raise ValidationError({"url": "An HTTP server needs a URL."})
        if not isinstance(self.args, list) or not all(isinstance(a, str) for a in self.args):
            raise ValidationError({"args": "Arguments must be a JSON list of strings."})

    # --- secrets: write-only, ciphertext at rest ---------------------------------------

    def set_bearer(self, token: str) -> None:
        self.bearer_encrypted = crypto.encrypt(token) if token else ""

    def set_headers(self, headers: dict[str, str]) -> None:
        self.headers_encrypted = crypto.encrypt(json.dumps(headers)) if headers else ""

    def set_oauth_client_secret(self, secret: str) -> None:
        self.oauth_client_secret_encrypted = crypto.encrypt(secret) if secret else ""

    def oauth_client_secret(self) -> str:
        if not self.oauth_client_secret_encrypted:
            return ""
        return crypto.decrypt(self.oauth_client_secret_encrypted)

    @property
    def has_bearer(self) -> bool:
        return bool(self.bearer_encrypted)

    @property
    def has_headers(self) -> bool:
        return bool(self.headers_encrypted)

    def request_headers(self) -> dict[str, str]:
        """The decrypted headers every request to this server carries."""
        headers: dict[str, str] = {}
        if self.headers_encrypted:
            headers.update(json.loads(crypto.decrypt(self.headers_encrypted)))
        if self.bearer_encrypted:
            headers["Authorization"] = f"Bearer {crypto.decrypt(self.bearer_encrypted)}"
        return headers


class McpConnection(models.Model):
    """One user's OAuth grant on one server: their tokens, ciphertext at rest.

    Deleting the row is how a connection ends (the user's Disconnect, an admin's revoke,
    a refresh the authorization server refuses); the grant is revoked at the server too
    where it offers RFC 7009. Never exported, never shown: the admin sees only who and when.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="mcp_connections"
    )
    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="connections")
    access_encrypted = models.TextField(editable=False)
    refresh_encrypted = models.TextField(blank=True, editable=False)
    # None: the server did not say (the token is then used until it is refused).
    expires_at = models.DateTimeField(null=True, blank=True)
    scope = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    refreshed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "server"], name="mcp_connection_unique")
        ]
        verbose_name = "MCP connection"

    def __str__(self) -> str:
        return f"{self.user} on {self.server}"

    def access_token(self) -> str:
        return crypto.decrypt(self.access_encrypted)

    def refresh_token(self) -> str:
        return crypto.decrypt(self.refresh_encrypted) if self.refresh_encrypted else ""

    def set_tokens(self, *, access: str, refresh: str | None) -> None:
        """`refresh` None keeps the stored one (an AS that does not rotate it)."""
        self.access_encrypted = crypto.encrypt(access)
        if refresh is not None:
            self.refresh_encrypted = crypto.encrypt(refresh) if refresh else ""


class McpToolPolicy(models.Model):
    """The admin's override of one tool's policy; the server's default applies otherwise."""

    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="tool_policies")
    tool = models.CharField(max_length=200, help_text="The tool's name on the MCP server.")
    policy = models.CharField(max_length=10, choices=Policy.choices)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["server", "tool"], name="mcp_tool_policy_unique")
        ]
        verbose_name = "MCP tool policy"
        verbose_name_plural = "MCP tool policies"

    def __str__(self) -> str:
        return f"{self.server.name}/{self.tool}: {self.policy}"


class SessionMcpServer(models.Model):
    """A server the session's owner switched on for that session."""

    session = models.ForeignKey(
        "chat_sessions.Session", on_delete=models.CASCADE, related_name="mcp_servers"
    )
    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="+")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["session", "server"], name="mcp_session_server_unique")
        ]

    def __str__(self) -> str:
        return f"{self.session_id}: {self.server_id}"


class McpCall(models.Model):
    """One MCP tool call: who, where, what, how long, how it ended.

    Written `started` before the request leaves, so a call a crash interrupted is visible
    (and never re-run silently); `arguments` is null when the server is sensitive.
    """

    class Outcome(models.TextChoices):
        STARTED = "started"
        OK = "ok"
        ERROR = "error"
        TIMEOUT = "timeout"
        CANCELLED = "cancelled"
        OVERSIZE = "oversize"
        INTERRUPTED = "interrupted"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    session_id = models.UUIDField(db_index=True)
    turn_id = models.UUIDField(null=True)
    call_id = models.CharField(max_length=200)
    server = models.ForeignKey(McpServer, null=True, on_delete=models.SET_NULL, related_name="+")
    server_name = models.CharField(max_length=20)
    tool = models.CharField(max_length=200)
    arguments = models.JSONField(null=True, blank=True)
    outcome = models.CharField(max_length=12, choices=Outcome.choices, default=Outcome.STARTED)
    detail = models.CharField(max_length=300, blank=True)
    result_bytes = models.PositiveIntegerField(null=True)
    started_at = models.DateTimeField(auto_now_add=True)
    duration_ms = models.PositiveIntegerField(null=True)

    class Meta:
        ordering = ["-started_at"]
        constraints = [
            models.UniqueConstraint(fields=["turn_id", "call_id"], name="mcp_call_once_per_turn")
        ]
        verbose_name = "MCP call"

    def __str__(self) -> str:
        return f"{self.server_name}/{self.tool}: {self.outcome}"
