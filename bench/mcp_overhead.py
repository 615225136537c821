"""Benchmark: what one MCP tool call adds to a turn, and what a connected server costs a
worker in memory.

Run from the repository root: `.venv/bin/python bench/mcp_overhead.py`. The MCP server
(FastMCP over Streamable HTTP, `tests/mcp/servers.py`) runs in its own process on
loopback, so its CPU and memory are not counted here. Embedded mode (SQLite in a temp dir).

- latency: CALLS calls of the server's `echo` tool through the engine's tool step, i.e.
  `tool.arun(arguments, ToolContext)` exactly as `engine._execute` awaits it (the call
  record written before and after, the loop's pooled session (`mcp_pool`; the first
  call, a warm-up, opens it), the call, the result rendered), against the built-in
  `list_files` through the same step. The difference is what an MCP call adds. Also
  shown: a new session per call as before the pool (connect + initialize + call +
  close), the connection alone (connect + initialize) and a call on an open session.
- memory: RSS of this process before and after the pool holds SESSIONS open sessions
  (SESSIONS servers, or users with their own credentials), per session.
Figures only; no pass/fail (no target was set for these).
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STATE = tempfile.mkdtemp(prefix="ow-bench-mcp-")
for name in ("DATABASE_URL", "REDIS_URL"):
    os.environ.pop(name, None)
os.environ.update(
    {
        "DJANGO_SETTINGS_MODULE": "openworker.settings",
        "OPENWORKER_STATE_DIR": STATE,
        "SQLITE_PATH": str(Path(STATE) / "bench.sqlite3"),
        "MEDIA_ROOT": str(Path(STATE) / "media"),
        "OPENWORKER_LEASE_SWEEPER": "0",
        "DEBUG": "1",
    }
)

import django  # noqa: E402

django.setup()
# The SDK logs every session it opens at INFO: noise here, and output the run would pay for.
logging.getLogger("mcp").setLevel(logging.WARNING)

import psutil  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.contrib.auth.models import Group  # noqa: E402
from django.core.management import call_command  # noqa: E402

from bench._common import percentile, print_table  # noqa: E402
from openworker.runtime.agent.tools import mcp_client, mcp_pool  # noqa: E402
from openworker.runtime.agent.tools.base import ToolContext  # noqa: E402
from openworker.runtime.agent.tools.mcp import (  # noqa: E402
    discover_and_store,
    server_spec,
    session_registry,
)
from providers.cancel import CancelToken  # noqa: E402
from providers.outbound import OutboundPolicy  # noqa: E402
from sessions import selectors  # noqa: E402
from sessions.mcp.models import McpServer, SessionMcpServer  # noqa: E402
from sessions.models import Session  # noqa: E402

CALLS = 200
WARMUP = 10
SESSIONS = 20


def start_server() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "mcp" / "servers.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def setup(url: str) -> tuple[Session, McpServer]:
    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench", password="bench-pass-123")
    team = Group.objects.create(name="bench")
    user.groups.add(team)
    server = McpServer.objects.create(name="bench", url=url, default_policy="allow")
    server.teams.add(team)
    tools, error = discover_and_store(server)
    assert tools, error
    session = Session.objects.create(owner=user, model="anthropic:claude-fake")
    SessionMcpServer.objects.create(session=session, server=server)
    return session, server


async def timed_calls(tool, args: dict, session: Session, n: int) -> list[float]:
    try:
        return await _timed_calls(tool, args, session, n)
    finally:
        await mcp_pool.aclose_running_loop_pool()


async def _timed_calls(tool, args: dict, session: Session, n: int) -> list[float]:
    out = []
    for i in range(n + WARMUP):
        ctx = ToolContext(
            session_id=str(session.pk),
            workspace_root=selectors.workspace_root(session.pk),
            outbound_policy=OutboundPolicy(allow_loopback=True),
            user_id=session.owner_id,
            turn_id=None,
            call_id=f"bench-{tool.name}-{i}",
            cancel=CancelToken(),
        )
        started = time.perf_counter()
        result = await tool.arun(args, ctx)
        elapsed = (time.perf_counter() - started) * 1000
        assert not result.is_error, result.content
        if i >= WARMUP:
            out.append(elapsed)
    return out


async def unpooled_calls(spec: mcp_client.ServerSpec) -> list[float]:
    """A new session per call: what every call cost before the pool."""
    out = []
    for i in range(CALLS + WARMUP):
        started = time.perf_counter()
        async with mcp_client.connect(spec) as s:
            await mcp_client.call_tool(s, "echo", {"text": "x"}, timeout=10)
        if i >= WARMUP:
            out.append((time.perf_counter() - started) * 1000)
    return out


async def connection_figures(spec: mcp_client.ServerSpec) -> tuple[list[float], list[float]]:
    connects, calls = [], []
    for _ in range(50):
        started = time.perf_counter()
        async with mcp_client.connect(spec) as s:
            connects.append((time.perf_counter() - started) * 1000)
            for _ in range(CALLS // 50):
                t = time.perf_counter()
                await mcp_client.call_tool(s, "echo", {"text": "x"}, timeout=10)
                calls.append((time.perf_counter() - t) * 1000)
    return connects, calls


async def memory_per_session(spec: mcp_client.ServerSpec) -> tuple[float, float]:
    me = psutil.Process()
    pool = mcp_pool.McpPool(max_sessions=SESSIONS + 1)

    def opener(on_changed, undelivered):
        return mcp_client.connect(spec, on_tools_changed=on_changed, undelivered=undelivered)

    async def echo(identity: str) -> None:
        pooled = await pool.call_tool(
            mcp_pool.PoolKey("bench", identity), "f", opener, "echo", {"text": "x"}, timeout=10
        )
        assert pooled.outcome.end == "ok", pooled.outcome

    try:
        await echo("warm-up")  # the SDK's imports and first-use caches
        before = me.memory_info().rss
        for i in range(SESSIONS):
            await echo(f"user:{i}")
        after = me.memory_info().rss
        assert len(pool) == SESSIONS + 1
    finally:
        await pool.aclose()
    return (after - before) / SESSIONS / 1024, before / 1024 / 1024


def main() -> None:
    proc, url = start_server()
    try:
        session, server = setup(url)
        registry = session_registry(session_id=session.pk)
        mcp_tool = registry.get("bench__echo")
        builtin = registry.get("list_files")
        spec = server_spec(server)
        mcp_ms = asyncio.run(timed_calls(mcp_tool, {"text": "hello"}, session, CALLS))
        builtin_ms = asyncio.run(timed_calls(builtin, {}, session, CALLS))
        fresh_ms = asyncio.run(unpooled_calls(spec))
        connects, open_calls = asyncio.run(connection_figures(spec))
        per_session_kib, base_mib = asyncio.run(memory_per_session(spec))
    finally:
        proc.kill()
        proc.wait()

    def row(name: str, values: list[float]) -> list:
        return [name, len(values), f"{percentile(values, 50):.2f}", f"{percentile(values, 99):.2f}"]

    added = [m - b for m, b in zip(sorted(mcp_ms), sorted(builtin_ms), strict=True)]
    print_table(
        ["path", "calls", "p50 ms", "p99 ms"],
        [
            row("MCP echo via the engine's tool step", mcp_ms),
            row("built-in list_files, same step", builtin_ms),
            row("added by MCP (same rank)", added),
            row("a new session per call (no pool)", fresh_ms),
            row("  of which: connect + initialize", connects),
            row("  of which: call on an open session", open_calls),
        ],
    )
    print()
    print_table(
        ["pooled sessions", "RSS before MiB", "per session KiB"],
        [[SESSIONS, f"{base_mib:.1f}", f"{per_session_kib:.0f}"]],
    )


if __name__ == "__main__":
    main()
