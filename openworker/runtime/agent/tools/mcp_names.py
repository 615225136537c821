"""MCP tool names and schemas made fit for every provider. Pure functions.

Names: `<server>__<tool>`, restricted to `^[a-zA-Z0-9_-]{1,64}$` (the strictest rule among
the APIs we speak: OpenAI, Anthropic, Gemini and Bedrock all accept it). A name that had to
be rewritten or shortened ends in a short hash of the original, so two tools that sanitise
alike stay distinct, and the same tool keeps the same name from one discovery to the next
(a renamed tool would break the provider's prompt cache and the model's earlier calls).

Schemas: the neutral dialect the provider layer expects (an object schema with
`properties`); the Gemini wire translates it further itself. `strict` is declared only when
the schema already meets OpenAI's strict dialect, never forced onto one that does not.
"""

from __future__ import annotations

import copy
import hashlib
import re
from typing import Any

MAX_NAME_LENGTH = 64
SEPARATOR = "__"
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_INVALID = re.compile(r"[^a-zA-Z0-9_-]")
HASH_LENGTH = 8
# Keys no provider accepts at a tool schema's root, and that mean nothing to the model.
_DROPPED_ROOT_KEYS = ("$schema", "$id")
# The keywords OpenAI's strict mode documents as supported. A schema using any other
# (`default`, `minLength`, `oneOf`…) is sent without `strict`: a strict request with an
# unsupported keyword is refused outright, which would fail the whole turn.
_STRICT_KEYWORDS = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "items", "enum", "const",
        "description", "title", "anyOf", "$defs", "definitions", "$ref", "pattern", "format",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "minItems", "maxItems",
    }
)  # fmt: skip


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]


def tool_name(server: str, tool: str) -> str:
    """The provider-facing name of `tool` on `server`: valid, stable, distinct."""
    plain = f"{server}{SEPARATOR}{tool}"
    if NAME_PATTERN.match(plain):
        return plain
    cleaned = _INVALID.sub("_", tool) or "tool"
    suffix = f"_{_digest(tool)}"
    room = MAX_NAME_LENGTH - len(server) - len(SEPARATOR) - len(suffix)
    return f"{server}{SEPARATOR}{cleaned[: max(room, 1)]}{suffix}"[:MAX_NAME_LENGTH]


def split_name(name: str) -> tuple[str, str] | None:
    """`(server, rest)` for an MCP tool's provider-facing name, else None."""
    server, sep, rest = name.partition(SEPARATOR)
    return (server, rest) if sep and server and rest else None


def neutral_schema(schema: Any) -> dict[str, Any]:
    """An MCP `inputSchema` as the provider layer's canonical tool `parameters`."""
    out = copy.deepcopy(schema) if isinstance(schema, dict) else {}
    for key in _DROPPED_ROOT_KEYS:
        out.pop(key, None)
    if out.get("type") != "object":
        out["type"] = "object"
    if not isinstance(out.get("properties"), dict):
        out["properties"] = {}
    return out


def is_strict_compatible(schema: Any) -> bool:
    """Whether `schema` already meets OpenAI's strict function dialect: every object lists
    all its properties as required and forbids others, and no keyword strict refuses."""
    if isinstance(schema, list):
        return all(is_strict_compatible(item) for item in schema)
    if not isinstance(schema, dict):
        return True
    if any(key not in _STRICT_KEYWORDS for key in schema):
        return False
    if schema.get("type") == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False:
            return False
        if set(schema.get("required") or ()) != set(props):
            return False
    return all(
        is_strict_compatible(value)
        for key, value in schema.items()
        if key in ("properties", "$defs", "definitions")
        for value in (value.values() if isinstance(value, dict) else [value])
    ) and all(is_strict_compatible(schema[key]) for key in ("items", "anyOf") if key in schema)
