"""The MCP client against real SDK servers: Streamable HTTP and HTTP+SSE on loopback, and
stdio. Discovery, list_changed, Stop and the timeout (both tell the server with
`notifications/cancelled`), and the outbound guard on every connection."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from openworker.runtime.agent.tools import mcp_client
from providers.cancel import CancelToken
from providers.errors import OutboundBlockedError
from providers.outbound import OutboundPolicy
from tests.mcp.servers import http_server

STDIO_SCRIPT = Path(__file__).parent / "mcp" / "stdio_server.py"
LOOPBACK_OK = OutboundPolicy(allow_loopback=True)
EXPECTED_TOOLS = {
    "add",
    "big",
    "echo",
    "env_has",
    "fail",
    "get.page/v2",
    "grow",
    "grow_soon",
    "picture",
    "pid",
    "slow",
    "whoami",
}


@pytest.fixture(params=["streamable_http", "sse"])
def server(request):
    with http_server(request.param) as srv:
        srv["spec"] = mcp_client.ServerSpec(
            name="t", transport=request.param, url=srv["url"], outbound=LOOPBACK_OK
        )
        yield srv


@pytest.fixture
def streamable():
    with http_server() as srv:
        srv["spec"] = mcp_client.ServerSpec(
            name="t", transport="streamable_http", url=srv["url"], outbound=LOOPBACK_OK
        )
        yield srv


def stdio_spec() -> mcp_client.ServerSpec:
    return mcp_client.ServerSpec(
        name="local", transport="stdio", command=sys.executable, args=(str(STDIO_SCRIPT),)
    )


async def test_discovery_lists_every_tool_with_its_schema(server):
    tools = {t["name"]: t for t in await mcp_client.discover(server["spec"])}
    assert set(tools) == EXPECTED_TOOLS
    assert tools["add"]["description"] == "Add two integers."
    assert tools["add"]["inputSchema"]["properties"].keys() == {"a", "b"}
    assert set(tools["add"]["inputSchema"]["required"]) == {"a", "b"}


async def test_a_stdio_server_is_discovered_and_called():
    spec = stdio_spec()
    assert {t["name"] for t in await mcp_client.discover(spec)} == EXPECTED_TOOLS
    async with mcp_client.connect(spec) as session:
        outcome = await mcp_client.call_tool(session, "echo", {"text": "hi"}, timeout=10)
    assert outcome.end == "ok"
    assert outcome.result.content[0].text == "echo: hi"


async def test_a_stdio_server_does_not_inherit_the_workers_secrets(monkeypatch):
    monkeypatch.setenv("OPENWORKER_ENCRYPTION_KEYS", "must-not-leak")
    async with mcp_client.connect(stdio_spec()) as session:
        leaked = await mcp_client.call_tool(
            session, "env_has", {"name": "OPENWORKER_ENCRYPTION_KEYS"}, timeout=10
        )
        path = await mcp_client.call_tool(session, "env_has", {"name": "PATH"}, timeout=10)
    assert leaked.result.content[0].text == "no"
    assert path.result.content[0].text == "yes"


async def test_static_headers_reach_the_server(streamable):
    spec = mcp_client.ServerSpec(
        name="t",
        transport="streamable_http",
        url=streamable["url"],
        headers={"Authorization": "Bearer s3cret", "X-Team": "ops"},
        outbound=LOOPBACK_OK,
    )
    async with mcp_client.connect(spec) as session:
        outcome = await mcp_client.call_tool(session, "whoami", {}, timeout=10)
    assert outcome.result.content[0].text == "authorization=Bearer s3cret; team=ops"
    assert "s3cret" not in repr(spec)


async def test_tools_list_changed_reaches_the_client_and_a_relist_shows_the_new_tool(server):
    changed = asyncio.Event()

    async def on_changed() -> None:
        changed.set()

    async with mcp_client.connect(server["spec"], on_tools_changed=on_changed) as session:
        assert "extra" not in {t["name"] for t in await mcp_client.list_tools(session)}
        outcome = await mcp_client.call_tool(session, "grow", {}, timeout=10)
        assert outcome.end == "ok"
        await asyncio.wait_for(changed.wait(), 5)
        assert "extra" in {t["name"] for t in await mcp_client.list_tools(session)}


async def test_stop_cancels_the_in_flight_call_and_tells_the_server(server):
    cancel = CancelToken()
    async with mcp_client.connect(server["spec"]) as session:
        loop = asyncio.get_running_loop()
        loop.call_later(0.5, cancel.cancel)
        started = time.monotonic()
        outcome = await mcp_client.call_tool(
            session, "slow", {"seconds": 30}, timeout=20, cancel=cancel
        )
        elapsed = time.monotonic() - started
        deadline = time.monotonic() + 5
        while "slow:cancelled" not in server["events"] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    assert outcome.end == "cancelled"
    assert elapsed < 10
    assert server["events"][-2:] == ["slow:started", "slow:cancelled"]


async def test_a_call_past_its_timeout_is_cancelled_on_the_server():
    with http_server() as srv:
        spec = mcp_client.ServerSpec(
            name="t", transport="streamable_http", url=srv["url"], outbound=LOOPBACK_OK
        )
        async with mcp_client.connect(spec) as session:
            outcome = await mcp_client.call_tool(session, "slow", {"seconds": 30}, timeout=0.5)
            deadline = time.monotonic() + 5
            while "slow:cancelled" not in srv["events"] and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        assert outcome.end == "timeout"
        assert "slow:cancelled" in srv["events"]
        assert "slow:finished" not in srv["events"]


async def test_a_stop_before_the_call_sends_nothing(streamable):
    cancel = CancelToken()
    cancel.cancel()
    async with mcp_client.connect(streamable["spec"]) as session:
        outcome = await mcp_client.call_tool(
            session, "echo", {"text": "x"}, timeout=5, cancel=cancel
        )
    assert outcome.end == "cancelled"
    assert streamable["events"] == []


def _refusal(exc: BaseException) -> OutboundBlockedError | None:
    if isinstance(exc, OutboundBlockedError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = _refusal(inner)
        if found:
            return found
    return _refusal(exc.__cause__) if exc.__cause__ else None


@pytest.mark.parametrize("transport", ["streamable_http", "sse"])
async def test_loopback_is_refused_at_connect_time_unless_allowed(transport):
    with http_server(transport) as srv:
        spec = mcp_client.ServerSpec(
            name="t", transport=transport, url=srv["url"], outbound=OutboundPolicy()
        )
        with pytest.raises(BaseException) as caught:
            await mcp_client.discover(spec)
        refusal = _refusal(caught.value)
        assert refusal is not None, caught.value
        assert "loopback" in str(refusal)


@pytest.mark.parametrize(
    "url, reason",
    [
        ("http://10.0.0.5/mcp", "private"),
        ("http://169.254.169.254/mcp", "metadata"),
        ("http://[::1]:8080/mcp", "loopback"),
        ("file:///etc/passwd", "only http and https"),
    ],
)
async def test_private_and_metadata_addresses_are_refused(url, reason):
    spec = mcp_client.ServerSpec(
        name="t", transport="streamable_http", url=url, outbound=OutboundPolicy()
    )
    with pytest.raises(BaseException) as caught:
        await mcp_client.discover(spec)
    refusal = _refusal(caught.value)
    assert refusal is not None, caught.value
    assert reason in str(refusal)
