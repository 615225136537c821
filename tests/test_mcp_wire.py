"""MCP tools as each wire API receives them: the tools a real FastMCP server lists, made
into registry definitions, then through every wire's own tool translation."""

from __future__ import annotations

import asyncio
import re

import pytest

from openworker.runtime.agent.tools import mcp_client
from openworker.runtime.agent.tools.mcp import McpTool
from providers.outbound import OutboundPolicy
from providers.registry import CompatFlags
from providers.wire import (
    anthropic_messages,
    bedrock_converse,
    gemini,
    openai_completions,
    openai_responses,
)
from sessions.mcp.models import McpServer
from tests.mcp.servers import http_server

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
STRICT_SCHEMA = {
    "type": "object",
    "properties": {"q": {"type": "string", "description": "what to look for"}},
    "required": ["q"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def definitions() -> list[dict]:
    with http_server() as srv:
        spec = mcp_client.ServerSpec(
            name="docs",
            transport="streamable_http",
            url=srv["url"],
            outbound=OutboundPolicy(allow_loopback=True),
        )
        listed = asyncio.run(mcp_client.discover(spec))
    listed.append({"name": "lookup", "description": "Strict.", "inputSchema": STRICT_SCHEMA})
    server = McpServer(name="docs", display_name="Docs")
    return [McpTool(server, item, "ask").definition() for item in listed]


def _keys(schema: object) -> set[str]:
    if isinstance(schema, dict):
        return set(schema) | {k for v in schema.values() for k in _keys(v)}
    if isinstance(schema, list):
        return {k for v in schema for k in _keys(v)}
    return set()


def test_every_wire_gets_valid_unique_names(definitions):
    names = [d["name"] for d in definitions]
    assert len(set(names)) == len(names)
    assert all(NAME.match(n) for n in names)
    for wire in (
        [t["name"] for t in anthropic_messages._build_tools(definitions)],
        [
            t["function"]["name"]
            for t in openai_completions._build_tools(definitions, CompatFlags())
        ],
        [t["toolSpec"]["name"] for t in bedrock_converse._build_tools(definitions)],
        [f["name"] for t in gemini._build_tools(definitions) for f in t["functionDeclarations"]],
    ):
        assert wire == names


def test_gemini_gets_its_schema_subset(definitions):
    declarations = gemini._build_tools(definitions)[0]["functionDeclarations"]
    for declaration in declarations:
        keys = _keys(declaration.get("parameters", {}))
        assert not keys & {"$schema", "additionalProperties", "title"}, declaration["name"]


def test_strict_is_sent_only_for_a_schema_already_strict(definitions):
    functions = {
        t["function"]["name"]: t["function"]
        for t in openai_completions._build_tools(definitions, CompatFlags())
    }
    assert functions["docs__lookup"]["strict"] is True
    assert [n for n, f in functions.items() if f.get("strict")] == ["docs__lookup"]
    loose = openai_completions._build_tools(definitions, CompatFlags(strict_tools=False))
    assert not any("strict" in t["function"] for t in loose)
    responses = {t["name"]: t["strict"] for t in openai_responses._build_tools(definitions)}
    assert [n for n, strict in responses.items() if strict] == ["docs__lookup"]
