"""Talking to one MCP server with the official `mcp` SDK: connect, list tools, call one.

No Django here: the caller passes a `ServerSpec` with the decrypted headers and the
outbound policy. Every HTTP request (Streamable HTTP or the older HTTP+SSE) goes through
`AsyncGuardedTransport`, the same SSRF guard provider base URLs use, so a server that
resolves (or redirects) to a private address is refused at connect time, not only when
the admin saved its URL. An MCP session is bound to the loop (and the task) that opened
it: `mcp_pool` keeps open sessions per loop and reuses them across calls and turns.

The SDK (1.x) does not tell the server when a request is abandoned, so Stop and the
per-call timeout send `notifications/cancelled` themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Container
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import anyio
import httpx
from mcp import ClientSession, McpError, StdioServerParameters, types
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CONNECTION_CLOSED

from providers.cancel import CancelToken
from providers.errors import OutboundBlockedError
from providers.outbound import AsyncGuardedTransport, OutboundPolicy

TransportKind = Literal["streamable_http", "sse", "stdio"]

# Connecting (TCP, TLS, the initialize handshake) gets its own bound so a dead server is
# reported quickly instead of eating the whole call timeout.
CONNECT_TIMEOUT_SECONDS = 10.0
# How long to wait for the server to take a cancel notice before closing anyway.
CANCEL_NOTICE_SECONDS = 2.0
# tools/list pages followed before giving up: a paginator that never ends cannot hang us.
MAX_LIST_PAGES = 50

# How a call ended. "unsent": the request provably never reached the server (the session
# was already closed, or the server answered that it no longer knows the session), so it
# may be sent again on a new session. "lost": the connection ended while the request was
# out: it may or may not have run, so it must not be sent again unasked.
CallEnd = Literal["ok", "timeout", "cancelled", "unsent", "lost"]

# The SDK's answer to a request on a session the server has forgotten (HTTP 404: the
# server restarted or expired the session): the server refused it without running it.
SESSION_TERMINATED_CODE = 32600


@dataclass(frozen=True)
class ServerSpec:
    """How to reach one server. `headers` and `auth` are secrets: never logged
    (`repr=False`). `auth` (an `httpx.Auth`, e.g. a user's OAuth token that renews
    itself) signs every HTTP request; it belongs to one user, so a session opened with it
    must never serve another user's call (the pool keys such sessions by user)."""

    name: str
    transport: TransportKind
    url: str = ""
    command: str = ""
    args: tuple[str, ...] = ()
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    outbound: OutboundPolicy | None = None
    auth: httpx.Auth | None = field(default=None, repr=False)


@dataclass(frozen=True)
class CallOutcome:
    end: CallEnd
    result: types.CallToolResult | None = None


ToolsChanged = Callable[[], Awaitable[None]]


def _guarded_client_factory(
    policy: OutboundPolicy | None, undelivered: set[Any] | None = None
) -> Callable[..., httpx.AsyncClient]:
    def factory(
        headers: dict[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
        auth: httpx.Auth | None = None,
    ) -> httpx.AsyncClient:
        transport: httpx.AsyncBaseTransport = AsyncGuardedTransport(policy or OutboundPolicy())
        if undelivered is not None:
            transport = _DeliveryLog(transport, undelivered)
        return httpx.AsyncClient(
            headers=headers,
            timeout=timeout or httpx.Timeout(CONNECT_TIMEOUT_SECONDS, read=300.0),
            auth=auth,
            transport=transport,
            follow_redirects=False,
        )

    return factory


class _DeliveryLog(httpx.AsyncBaseTransport):
    """Notes the JSON-RPC id of every request whose HTTP connection could not even be
    opened (refused, timed out connecting, blocked by the outbound policy): those never
    reached the server, whatever became of the session afterwards."""

    def __init__(self, inner: httpx.AsyncBaseTransport, undelivered: set[Any]) -> None:
        self._inner = inner
        self._undelivered = undelivered

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self._inner.handle_async_request(request)
        except (httpx.ConnectError, httpx.ConnectTimeout, OutboundBlockedError):
            request_id = _jsonrpc_id(request)
            if request_id is not None:
                self._undelivered.add(request_id)
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()


def _jsonrpc_id(request: httpx.Request) -> Any:
    try:
        body = json.loads(request.content or b"null")
    except (ValueError, httpx.RequestNotRead):
        return None
    return body.get("id") if isinstance(body, dict) else None


@contextlib.asynccontextmanager
async def connect(
    spec: ServerSpec,
    *,
    on_tools_changed: ToolsChanged | None = None,
    undelivered: set[Any] | None = None,
) -> AsyncIterator[ClientSession]:
    """An initialized `ClientSession`; `on_tools_changed` runs on `tools/list_changed`.
    `undelivered` collects the ids of requests whose connection could not be opened
    (HTTP transports), so a caller can tell a request that never left from a lost one."""

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
                    auth=spec.auth,
                )
            )
        else:
            http = await stack.enter_async_context(
                _guarded_client_factory(spec.outbound, undelivered)(
                    headers=dict(spec.headers), auth=spec.auth
                )
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
    closed: asyncio.Event | None = None,
    undelivered: Container[Any] = (),
) -> CallOutcome:
    """Call `name`, bounded by `timeout` and by Stop (`cancel`). A call that is abandoned
    tells the server with `notifications/cancelled` before the connection closes.

    `closed` is set by whoever owns the connection when it ends (a pooled session's
    transport failed): a call still out then ends "lost", or "unsent" when its id is in
    `undelivered` (its connection was never opened)."""
    if cancel is not None and cancel.cancelled:
        return CallOutcome("cancelled")
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    unregister = (
        cancel.on_cancel(lambda: loop.call_soon_threadsafe(stopped.set)) if cancel else None
    )
    sent_ids: list[Any] = []

    async def send() -> types.CallToolResult:
        # The id the SDK gives this request: `send_request` takes it in this same step,
        # before any await, so no other call on a shared session can take it first.
        sent_ids.append(session._request_id)  # the SDK exposes no other way
        return await session.call_tool(
            name, arguments, read_timeout_seconds=timedelta(seconds=timeout + 5)
        )

    call = asyncio.ensure_future(send())
    stop = asyncio.ensure_future(stopped.wait())
    ended = asyncio.ensure_future(closed.wait()) if closed is not None else None
    try:
        waits = {call, stop} if ended is None else {call, stop, ended}
        done, _ = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if call in done:
            problem = call.exception()
            if problem is None:
                return CallOutcome("ok", call.result())
            if _never_sent(problem):
                return CallOutcome("unsent")
            if isinstance(problem, McpError) and problem.error.code == CONNECTION_CLOSED:
                return CallOutcome("lost")
            raise problem
        if ended is not None and ended in done:
            call.cancel()
            with contextlib.suppress(BaseException):
                await call
            return CallOutcome("unsent" if sent_ids and sent_ids[0] in undelivered else "lost")
        end: CallEnd = "cancelled" if stop in done else "timeout"
        call.cancel()
        with contextlib.suppress(BaseException):
            await call
        if sent_ids:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    session.send_notification(
                        types.ClientNotification(
                            types.CancelledNotification(
                                params=types.CancelledNotificationParams(
                                    requestId=sent_ids[0],
                                    reason="stopped by the user"
                                    if end == "cancelled"
                                    else "timeout",
                                )
                            )
                        )
                    ),
                    CANCEL_NOTICE_SECONDS,
                )
        return CallOutcome(end)
    finally:
        # The caller itself cancelled (a shutdown): the request must not outlive it on a
        # session that stays open.
        if not call.done():
            call.cancel()
        stop.cancel()
        if ended is not None:
            ended.cancel()
        if unregister is not None:
            unregister()


def _never_sent(exc: BaseException) -> bool:
    """The request provably did not reach the server: the session's streams were already
    closed when it was written, or the server said it no longer knows the session."""
    if isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError):
        return True
    return isinstance(exc, McpError) and exc.error.code == SESSION_TERMINATED_CODE
