"""Talking to one MCP server with the official `mcp` SDK: connect, list tools, call one.

No Django here: the caller passes a `ServerSpec` with the decrypted headers and the
outbound policy. Every HTTP request (Streamable HTTP or the older HTTP+SSE) goes through
`AsyncGuardedTransport`, the same SSRF guard provider base URLs use, so a server that
resolves (or redirects) to a private address is refused at connect time, not only when
the admin saved its URL. One connection per call: a turn may run on any worker process's
loop, and an MCP session is bound to the loop that opened it.

The SDK (1.x) does not tell the server when a request is abandoned, so Stop and the
per-call timeout send `notifications/cancelled` themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import httpx
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from providers.cancel import CancelToken
from providers.outbound import AsyncGuardedTransport, OutboundPolicy

TransportKind = Literal["streamable_http", "sse", "stdio"]

# Connecting (TCP, TLS, the initialize handshake) gets its own bound so a dead server is
# reported quickly instead of eating the whole call timeout.
CONNECT_TIMEOUT_SECONDS = 10.0
# How long to wait for the server to take a cancel notice before closing anyway.
CANCEL_NOTICE_SECONDS = 2.0
# tools/list pages followed before giving up: a paginator that never ends cannot hang us.
MAX_LIST_PAGES = 50

CallEnd = Literal["ok", "timeout", "cancelled"]


@dataclass(frozen=True)
class ServerSpec:
    """How to reach one server. `headers` are secrets: never logged (`repr=False`)."""

    name: str
    transport: TransportKind
    url: str = ""
    command: str = ""
    args: tuple[str, ...] = ()
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    outbound: OutboundPolicy | None = None


@dataclass(frozen=True)
class CallOutcome:
    end: CallEnd
    result: types.CallToolResult | None = None


ToolsChanged = Callable[[], Awaitable[None]]


def _guarded_client_factory(policy: OutboundPolicy | None) -> Callable[..., httpx.AsyncClient]:
    def factory(
        headers: dict[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
        auth: httpx.Auth | None = None,
    ) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            headers=headers,
            timeout=timeout or httpx.Timeout(CONNECT_TIMEOUT_SECONDS, read=300.0),
            auth=auth,
            transport=AsyncGuardedTransport(policy or OutboundPolicy()),
            follow_redirects=False,
        )

    return factory


@contextlib.asynccontextmanager
async def connect(
    spec: ServerSpec, *, on_tools_changed: ToolsChanged | None = None
) -> AsyncIterator[ClientSession]:
    """An initialized `ClientSession`; `on_tools_changed` runs on `tools/list_changed`."""

    async def on_message(message: Any) -> None:
        changed = isinstance(message, types.ServerNotification) and isinstance(
            message.root, types.ToolListChangedNotification
        )
        if changed and on_tools_changed is not None:
            await on_tools_changed()

    async with contextlib.AsyncExitStack() as stack:
        if spec.transport == "stdio":
            params = StdioServerParameters(command=spec.command, args=list(spec.args))
            read, write = await stack.enter_async_context(stdio_client(params))
        elif spec.transport == "sse":
            read, write = await stack.enter_async_context(
                sse_client(
                    spec.url,
                    headers=dict(spec.headers),
                    timeout=CONNECT_TIMEOUT_SECONDS,
                    httpx_client_factory=_guarded_client_factory(spec.outbound),
                )
            )
        else:
            http = await stack.enter_async_context(
                _guarded_client_factory(spec.outbound)(headers=dict(spec.headers))
            )
            read, write, _ = await stack.enter_async_context(
                streamable_http_client(spec.url, http_client=http)
            )
        session = await stack.enter_async_context(
            ClientSession(read, write, message_handler=on_message)
        )
        await asyncio.wait_for(session.initialize(), CONNECT_TIMEOUT_SECONDS)
        yield session


async def list_tools(session: ClientSession) -> list[dict[str, Any]]:
    """Every tool the server lists: `[{"name", "description", "inputSchema"}]`."""
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        page = await session.list_tools(cursor=cursor) if cursor else await session.list_tools()
        tools.extend(
            {
                "name": tool.name,
                "description": tool.description or "",
                "inputSchema": tool.inputSchema or {"type": "object"},
            }
            for tool in page.tools
        )
        cursor = page.nextCursor
        if not cursor:
            break
    return tools


async def discover(spec: ServerSpec) -> list[dict[str, Any]]:
    async with connect(spec) as session:
        return await list_tools(session)


async def call_tool(
    session: ClientSession,
    name: str,
    arguments: dict[str, Any],
    *,
    timeout: float,
    cancel: CancelToken | None = None,
) -> CallOutcome:
    """Call `name`, bounded by `timeout` and by Stop (`cancel`). A call that is abandoned
    tells the server with `notifications/cancelled` before the connection closes."""
    if cancel is not None and cancel.cancelled:
        return CallOutcome("cancelled")
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    unregister = (
        cancel.on_cancel(lambda: loop.call_soon_threadsafe(stopped.set)) if cancel else None
    )
    # The id the SDK gives the next request; `send_request` takes it before any await.
    request_id = session._request_id  # the SDK exposes no other way
    call = asyncio.ensure_future(
        session.call_tool(name, arguments, read_timeout_seconds=timedelta(seconds=timeout + 5))
    )
    stop = asyncio.ensure_future(stopped.wait())
    try:
        done, _ = await asyncio.wait(
            {call, stop}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if call in done:
            return CallOutcome("ok", call.result())
        end: CallEnd = "cancelled" if stop in done else "timeout"
        call.cancel()
        with contextlib.suppress(BaseException):
            await call
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                session.send_notification(
                    types.ClientNotification(
                        types.CancelledNotification(
                            params=types.CancelledNotificationParams(
                                requestId=request_id,
                                reason="stopped by the user" if end == "cancelled" else "timeout",
                            )
                        )
                    )
                ),
                CANCEL_NOTICE_SECONDS,
            )
        return CallOutcome(end)
    finally:
        stop.cancel()
        if unregister is not None:
            unregister()
