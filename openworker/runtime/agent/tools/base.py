"""What a tool is to the turn engine: a name, a JSON Schema, a policy and a blocking `run`.

The engine looks a tool up by the name the model called, checks its policy, and runs it with
`asyncio.to_thread(tool.run, arguments, ctx)`. `run` validates the arguments against the
tool's schema first, so a model that sends a wrong type or forgets a field gets a
`ToolResult(is_error=True)` it can read and correct, never an exception that ends the turn.
Failures a tool expects (file not found, refused URL) are raised inside `execute` as
`ToolError` and reported the same way.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from providers.cancel import CancelToken
from providers.json_copy import json_copy
from providers.outbound import OutboundPolicy

Policy = Literal["allow", "ask", "deny"]
POLICIES: tuple[Policy, ...] = ("allow", "ask", "deny")


@dataclass(frozen=True)
class ToolContext:
    """Where a tool call runs: the session's own workspace and the server's outbound rules;
    who asked, in which turn and call (for tools that keep a record), and Stop."""

    session_id: str
    workspace_root: Path
    outbound_policy: OutboundPolicy
    user_id: int | None = None
    turn_id: str | None = None
    call_id: str | None = None
    cancel: CancelToken | None = None


@dataclass(frozen=True)
class ToolResult:
    """What goes back to the model as the tool message. `is_error` marks a failed call.
    `content` is text, or canonical parts (text and `attachment:` images) for tools that
    return pictures."""

    content: str | list[dict[str, Any]]
    is_error: bool = False


class ToolError(Exception):
    """An expected failure inside a tool; its message is shown to the model as is."""


class Tool(ABC):
    """One tool the model may call. Subclasses set the class attributes and `execute`.

    `parameters` is a JSON Schema (draft 2020-12) object schema; it is both what the
    provider sees and what the arguments are checked against, so the two cannot drift.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]
    default_policy: ClassVar[Policy] = "ask"

    _validator: ClassVar[Draft202012Validator]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # ABCMeta computes __abstractmethods__ only after this hook, so ask `execute` itself.
        if getattr(cls.execute, "__isabstractmethod__", False) or "parameters" not in dir(cls):
            return
        if cls.default_policy not in POLICIES:
            raise TypeError(f"{cls.__name__}.default_policy must be one of {POLICIES}")
        # A broken schema is a programming error: fail at import, not at the model's call.
        Draft202012Validator.check_schema(cls.parameters)
        cls._validator = Draft202012Validator(cls.parameters)

    def definition(self) -> dict[str, Any]:
        """The provider-facing description: `{"name", "description", "parameters"}`."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": json_copy(self.parameters),
        }

    def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Validate `args`, then execute. Blocking; never raises for bad input."""
        problem = self.argument_error(args)
        if problem is not None:
            return ToolResult(problem, is_error=True)
        try:
            result = self.execute(args, ctx)
        except ToolError as exc:
            return ToolResult(str(exc), is_error=True)
        return result if isinstance(result, ToolResult) else ToolResult(result)

    async def arun(self, args: Any, ctx: ToolContext) -> ToolResult:
        """What the engine awaits: `run` in a thread; tools that speak asyncio override it."""
        return await asyncio.to_thread(self.run, args, ctx)

    def argument_error(self, args: Any) -> str | None:
        """A message for the model when `args` do not fit the schema, else None."""
        error = best_match(self._validator.iter_errors(args))
        if error is None:
            return None
        where = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.path)
        location = f" at arguments{where}" if where else ""
        return (
            f"Invalid arguments for {self.name}{location}: {error.message}. "
            f"Expected: {self._signature()}."
        )

    def _signature(self) -> str:
        props = self.parameters.get("properties", {})
        required = set(self.parameters.get("required", ()))
        parts = []
        for key, spec in props.items():
            kind = spec.get("type", "any")
            parts.append(f"{key} ({kind}{', required' if key in required else ''})")
        return ", ".join(parts) or "no arguments"

    @abstractmethod
    def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult | str:
        """Do the work with validated `args`; raise `ToolError` for expected failures."""
