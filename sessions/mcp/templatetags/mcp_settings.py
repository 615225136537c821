"""The Settings page's "Connected accounts" section: the OAuth MCP servers the user may
use, each with Connect or Disconnect. A tag rather than context from the Settings view,
so the provider settings (providers.edge) need not import the MCP app."""

from __future__ import annotations

from typing import Any

from django import template

from sessions.mcp.connections import mcp_connection_rows

register = template.Library()


@register.inclusion_tag("mcp/_connections.html", takes_context=True)
def mcp_connections(context: Any) -> dict[str, Any]:
    request = context["request"]
    return {
        "rows": mcp_connection_rows(user=request.user),
        "csrf_token": context.get("csrf_token"),
    }
