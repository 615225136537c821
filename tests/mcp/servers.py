"""Real MCP servers for the tests, built with the SDK's FastMCP: the same tools served
over Streamable HTTP and HTTP+SSE on loopback (uvicorn in a thread), and over stdio by
`stdio_server.py`. `EVENTS` is what the server saw (calls started, calls cancelled)."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import uvicorn
from mcp import types
from mcp.server.fastmcp import Context, FastMCP, Image

# A 1x1 PNG: small, and a real image any decoder accepts.
PNG_1PX = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def build_server(events: list[str] | None = None) -> FastMCP:
    seen = events if events is not None else []
    pending: list[asyncio.Task[None]] = []  # grow_soon's changes, kept from the collector
    # WARNING: the SDK logs every request at INFO, which would be most of the bench's cost.
    mcp = FastMCP("openworker-test", host="127.0.0.1", log_level="WARNING")

    @mcp.tool(description="Echo the text back.")
    def echo(text: str) -> str:
        seen.append(f"echo:{text}")
        return f"echo: {text}"

    @mcp.tool(description="Add two integers.")
    def add(a: int, b: int) -> dict[str, int]:
        return {"sum": a + b}

    @mcp.tool(description="Wait, then answer.")
    async def slow(seconds: float) -> str:
        seen.append("slow:started")
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            seen.append("slow:cancelled")
            raise
        seen.append("slow:finished")
        return "done"

    @mcp.tool(description="Always fails.")
    def fail() -> str:
        raise ValueError("the database is read-only today")

    @mcp.tool(description="Return n characters.")
    def big(n: int) -> str:
        return "x" * n

    @mcp.tool(description="Return a picture.")
    def picture() -> Image:
        return Image(data=PNG_1PX, format="png")

    @mcp.tool(name="get.page/v2", description="A name no provider accepts as is.")
    def odd_name() -> str:
        return "odd"

    @mcp.tool(description="Whether the server's environment has this variable.")
    def env_has(name: str) -> str:
        return "yes" if name in os.environ else "no"

    @mcp.tool(description="Which credentials the request carried.")
    def whoami(ctx: Context) -> str:
        headers = getattr(ctx.request_context.request, "headers", None) or {}
        return f"authorization={headers.get('authorization', '')}; team={headers.get('x-team', '')}"

    @mcp.tool(description="Add a tool named `extra` and say so.")
    async def grow(ctx: Context) -> str:
        if "extra" not in {t.name for t in await mcp.list_tools()}:
            mcp.add_tool(lambda: "extra!", name="extra", description="Added later.")
        # On this request's own stream, so the notice arrives before the result (a
        # notice on the session's standalone stream may come after it).
        await ctx.session.send_notification(
            types.ServerNotification(types.ToolListChangedNotification()),
            related_request_id=ctx.request_id,
        )
        return "grown"

    @mcp.tool(description="Answer now; add a tool named `later` a moment after.")
    async def grow_soon(ctx: Context) -> str:
        session = ctx.session

        async def change() -> None:
            await anyio.sleep(0.3)
            mcp.add_tool(lambda: "later!", name="later", description="Added after a call.")
            await session.send_tool_list_changed()  # on the session's standalone stream

        pending.append(asyncio.get_running_loop().create_task(change()))
        return "soon"

    @mcp.tool(description="This server's process id.")
    def pid() -> int:
        return os.getpid()

    return mcp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _SessionCounter:
    """Counts the MCP sessions clients open (initialize requests: a POST without a session
    id) and close (DELETE), in `counts`."""

    def __init__(self, app: Any, counts: dict[str, int]) -> None:
        self.app = app
        self.counts = counts

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if scope["method"] == "POST" and b"mcp-session-id" not in headers:
                self.counts["opened"] += 1
            elif scope["method"] == "DELETE":
                self.counts["closed"] += 1
        await self.app(scope, receive, send)


@contextmanager
def http_server(transport: str = "streamable_http", port: int = 0) -> Iterator[dict[str, Any]]:
    """A loopback server; yields {"url", "events", "sessions": {"opened", "closed"},
    "port"}. Pass the `port` of a stopped one to stand in for it after a restart."""
    events: list[str] = []
    sessions = {"opened": 0, "closed": 0}
    mcp = build_server(events)
    app = mcp.sse_app() if transport == "sse" else mcp.streamable_http_app()
    app = _SessionCounter(app, sessions)
    port = port or free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="on",
            # Open streams (a pooled client keeps one) must not hold a stop for long.
            timeout_graceful_shutdown=1,
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the MCP test server did not start")
        time.sleep(0.02)
    path = "/sse" if transport == "sse" else "/mcp"
    try:
        yield {
            "url": f"http://127.0.0.1:{port}{path}",
            "events": events,
            "sessions": sessions,
            "port": port,
        }
    finally:
        server.should_exit = True
        thread.join(10)


def main() -> None:
    """`python tests/mcp/servers.py [streamable_http|sse]`: serve until killed; the first
    line of stdout is the URL (the benches run the server in its own process)."""
    import sys

    transport = sys.argv[1] if len(sys.argv) > 1 else "streamable_http"
    with http_server(transport) as srv:
        print(srv["url"], flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
