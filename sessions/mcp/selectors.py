"""Reads for pages: which MCP server a namespaced tool name belongs to."""

from __future__ import annotations

from sessions.mcp.models import McpServer

# `<server>__<tool>`: the separator the runtime's tool names use (mcp_names.SEPARATOR).
NAME_SEPARATOR = "__"


def mcp_server_labels(tool_names: list[str]) -> dict[str, str]:
    """`{tool name: server label}` for the names that are some MCP server's tools (one
    query, and none when no name could be)."""
    prefixes = {n.partition(NAME_SEPARATOR)[0] for n in tool_names if NAME_SEPARATOR in n}
    if not prefixes:
        return {}
    labels = {s.name: s.label for s in McpServer.objects.filter(name__in=prefixes)}
    return {
        name: labels[name.partition(NAME_SEPARATOR)[0]]
        for name in tool_names
        if name.partition(NAME_SEPARATOR)[0] in labels
    }
