"""MCP tool names and schemas made fit for every provider."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from openworker.runtime.agent.tools.mcp_names import (
    is_strict_compatible,
    neutral_schema,
    split_name,
    tool_name,
)
from sessions.mcp.models import SERVER_NAME_PATTERN

# The strictest rule among the wire APIs (OpenAI's function names; Anthropic, Gemini and
# Bedrock accept a superset).
PROVIDER_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_SEGMENT = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=6)
SERVER = st.builds(
    lambda first, rest: "_".join([first, *rest])[:20].rstrip("_"),
    st.from_regex(r"^[a-z][a-z0-9]{0,5}$", fullmatch=True),
    st.lists(_SEGMENT, max_size=3),
).filter(SERVER_NAME_PATTERN.match)


@given(SERVER, st.text(min_size=1, max_size=200))
def test_every_name_is_valid_for_every_provider_and_stable(server, tool):
    name = tool_name(server, tool)
    assert PROVIDER_NAME.match(name)
    assert name == tool_name(server, tool)
    assert split_name(name)[0] == server


@given(SERVER, st.text(min_size=1, max_size=100), st.text(min_size=1, max_size=100))
def test_distinct_tools_get_distinct_names(server, a, b):
    if a != b:
        assert tool_name(server, a) != tool_name(server, b)


def test_server_names_cannot_blur_where_the_tool_name_starts():
    for bad in ("a_", "a__b", "_a", "A", "1a", "a" * 21, "a-b"):
        assert not SERVER_NAME_PATTERN.match(bad), bad
    assert SERVER_NAME_PATTERN.match("crm_eu1")


def test_a_valid_name_is_kept_readable():
    assert tool_name("docs", "search") == "docs__search"
    assert tool_name("docs", "get.page/v2").startswith("docs__get_page_v2_")


def test_schemas_become_object_schemas_without_root_metadata():
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"}
    assert neutral_schema(schema) == {"type": "object", "properties": {}}
    assert neutral_schema(None) == {"type": "object", "properties": {}}
    original = {"type": "object", "properties": {"q": {"type": "string"}}}
    neutral_schema(original)["properties"]["x"] = {}
    assert "x" not in original["properties"]  # the cache is never mutated


def test_strict_is_declared_only_for_schemas_already_in_the_strict_dialect():
    strict = {
        "type": "object",
        "properties": {
            "q": {"type": "string"},
            "opts": {
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
                "additionalProperties": False,
            },
        },
        "required": ["q", "opts"],
        "additionalProperties": False,
    }
    assert is_strict_compatible(strict)
    loose_child = {**strict, "properties": {**strict["properties"], "opts": {"type": "object"}}}
    assert not is_strict_compatible(loose_child)
    assert not is_strict_compatible({**strict, "required": ["q"]})
    assert not is_strict_compatible({"type": "object", "properties": {}})
