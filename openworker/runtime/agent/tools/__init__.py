"""The agent's tools: what the model may call, how each call is checked and run."""

from __future__ import annotations

from .base import POLICIES, Policy, Tool, ToolContext, ToolError, ToolResult
from .registry import ToolRegistry, default_registry
from .workspace import WorkspacePathError, workspace_path

__all__ = [
    "POLICIES",
    "Policy",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "ToolResult",
    "WorkspacePathError",
    "default_registry",
    "workspace_path",
]
