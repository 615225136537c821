from __future__ import annotations

from django.apps import AppConfig


class McpConfig(AppConfig):
    name = "sessions.mcp"
    label = "mcp"
    verbose_name = "MCP servers"
    default_auto_field = "django.db.models.BigAutoField"
