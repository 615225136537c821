"""The tools a session's model may call, and the policy deciding whether a call runs.

The policy is per tool: "allow" runs it, "ask" waits for the user's approval, "deny" reports
a refusal to the model. An admin's override wins over the tool's default; a name nobody
registered is "deny", whatever an override says, because there is nothing to run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .base import POLICIES, Policy, Tool
from .fetch_url import FetchUrlTool
from .workspace import WORKSPACE_TOOLS

# Fail closed: an override that is not a known policy (a typo in the admin page or the
# environment) must not widen what runs unattended.
INVALID_OVERRIDE_POLICY: Policy = "deny"


class ToolRegistry:
    """A name → tool map with the provider-facing list and the policy lookup."""

    def __init__(self, tools: tuple[Tool, ...] | list[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        # Bumped by every change, so a caller holding `definitions()` knows to ask again
        # (an MCP server may change its tools in the middle of a turn).
        self.revision = 0
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        self.revision += 1

    def unregister(self, name: str) -> None:
        if self._tools.pop(name, None) is not None:
            self.revision += 1

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools[name] for name in sorted(self._tools))

    def __len__(self) -> int:
        return len(self._tools)

    def definitions(self) -> list[dict[str, Any]]:
        """`[{"name", "description", "parameters"}]` sorted by name.

        Sorted so the request prefix is byte-stable from turn to turn whatever the order of
        registration: a reordered tool list would invalidate the provider's prompt cache.
        """
        return [tool.definition() for tool in self]

    def policy_for(self, name: str, overrides: Mapping[str, str] | None = None) -> Policy:
        """The effective policy of tool `name`: override, else default; unknown → "deny"."""
        tool = self._tools.get(name)
        if tool is None:
            return "deny"
        if overrides and name in overrides:
            value = str(overrides[name]).strip().lower()
            for policy in POLICIES:
                if value == policy:
                    return policy
            return INVALID_OVERRIDE_POLICY
        return tool.default_policy


def default_registry() -> ToolRegistry:
    """A fresh registry holding the built-in tools (a new one each call: callers may add)."""
    return ToolRegistry([*(cls() for cls in WORKSPACE_TOOLS), FetchUrlTool()])
