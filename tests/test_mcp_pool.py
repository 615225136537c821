"""The pool of open MCP sessions against real SDK servers (Streamable HTTP on loopback,
stdio processes): reuse across calls, a session per credentials identity, invalidation
on edits and by the validator, the idle timeout and the bounds, Stop on a pooled session,
and health: a session the server forgot or a stdio process that died is replaced and the
call sent once, while a call that was out when the connection died is never sent again."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from openworker.runtime.agent.tools import mcp_client
from openworker.runtime.agent.tools.mcp_pool import McpPool, PoolKey
from providers.cancel import CancelToken
from providers.outbound import OutboundPolicy
from tests.mcp.servers import http_server
from tests.test_mcp_client import STDIO_SCRIPT

LOOPBACK_OK = OutboundPolicy(allow_loopback=True)
KEY = PoolKey("1", "server")


def http_spec(url: str, token: str = "") -> mcp_client.ServerSpec:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return mcp_client.ServerSpec(
        name="t", transport="streamable_http", url=url, headers=headers, outbound=LOOPBACK_OK
    )


def stdio_spec(events: Path) -> mcp_client.ServerSpec:
    return mcp_client.ServerSpec(
        name="local",
        transport="stdio",
        command=sys.executable,
        args=(str(STDIO_SCRIPT), str(events)),
    )


async def call(pool: McpPool, spec, name: str, args=None, *, key=KEY, **kw):
    def opener(on_changed, undelivered):
        return mcp_client.connect(spec, on_tools_changed=on_changed, undelivered=undelivered)

    fingerprint = f"{spec.url}{spec.command}{sorted(spec.headers.items())}{spec.args}"
    kw.setdefault("timeout", 10)
    return await pool.call_tool(
        key, fingerprint, opener, name, args or {}, stdio=spec.transport == "stdio", **kw
    )


def text(pooled) -> str:
    assert pooled.outcome.end == "ok", pooled.outcome
    return pooled.outcome.result.content[0].text


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def until(predicate, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
async def pool():
    pool = McpPool()
    yield pool
    await pool.aclose()


@pytest.fixture
def streamable():
    with http_server() as srv:
        yield srv


async def test_calls_share_one_open_session(pool, streamable):
    spec = http_spec(streamable["url"])
    first = await call(pool, spec, "echo", {"text": "a"})
    second = await call(pool, spec, "echo", {"text": "b"})
    third = await call(pool, spec, "echo", {"text": "c"})
    assert [text(r) for r in (first, second, third)] == ["echo: a", "echo: b", "echo: c"]
    assert (first.reused, second.reused, third.reused) == (False, True, True)
    assert streamable["sessions"]["opened"] == 1 and pool.opened == 1
    assert streamable["events"] == ["echo:a", "echo:b", "echo:c"]


async def test_an_http_sse_server_is_pooled_too(pool):
    with http_server("sse") as srv:
        spec = mcp_client.ServerSpec(
            name="t", transport="sse", url=srv["url"], outbound=LOOPBACK_OK
        )
        first = await call(pool, spec, "echo", {"text": "a"})
        second = await call(pool, spec, "echo", {"text": "b"})
        assert (text(first), text(second)) == ("echo: a", "echo: b")
        assert second.reused and pool.opened == 1
        await pool.aclose()


async def test_concurrent_calls_share_the_session(pool, streamable):
    spec = http_spec(streamable["url"])
    results = await asyncio.gather(*(call(pool, spec, "echo", {"text": str(i)}) for i in range(5)))
    assert sorted(text(r) for r in results) == [f"echo: {i}" for i in range(5)]
    assert streamable["sessions"]["opened"] == 1


async def test_each_credentials_identity_gets_its_own_session(pool, streamable):
    alice = http_spec(streamable["url"], token="alice-token")
    bob = http_spec(streamable["url"], token="bob-token")
    for _ in range(2):
        got_a = await call(pool, alice, "whoami", key=PoolKey("1", "user:1"))
        got_b = await call(pool, bob, "whoami", key=PoolKey("1", "user:2"))
        assert text(got_a).startswith("authorization=Bearer alice-token")
        assert text(got_b).startswith("authorization=Bearer bob-token")
    assert streamable["sessions"]["opened"] == 2 and len(pool) == 2


async def test_an_edited_server_or_a_new_secret_gets_a_new_session_and_the_old_one_closes(
    pool, streamable
):
    before = http_spec(streamable["url"], token="old-secret")
    after = http_spec(streamable["url"], token="new-secret")
    assert text(await call(pool, before, "whoami")).startswith("authorization=Bearer old-secret")
    assert text(await call(pool, after, "whoami")).startswith("authorization=Bearer new-secret")
    assert streamable["sessions"]["opened"] == 2
    await until(lambda: streamable["sessions"]["closed"] == 1)  # the old session's DELETE
    assert len(pool) == 1


async def test_a_server_the_validator_no_longer_knows_loses_its_sessions_on_the_sweep(
    pool, streamable
):
    text(await call(pool, http_spec(streamable["url"]), "echo", {"text": "x"}))
    asked: list[dict] = []

    async def validate(pooled):
        asked.append(dict(pooled))
        return set()  # the admin disabled the server

    pool.validate = validate
    await pool.sweep()
    assert list(asked[0]) == [KEY]
    assert len(pool) == 0
    await until(lambda: streamable["sessions"]["closed"] == 1)


async def test_sessions_idle_past_the_timeout_are_closed(streamable):
    pool = McpPool(idle_seconds=0.2, sweep_seconds=0.1)
    try:
        text(await call(pool, http_spec(streamable["url"]), "echo", {"text": "x"}))
        assert len(pool) == 1
        await until(lambda: len(pool) == 0)
        await until(lambda: streamable["sessions"]["closed"] == 1)
    finally:
        await pool.aclose()


async def test_stdio_processes_are_pooled_and_bounded(tmp_path):
    pool = McpPool(max_stdio=1)
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    try:
        pid_a = int(text(await call(pool, stdio_spec(first), "pid", key=PoolKey("a", "server"))))
        again = await call(pool, stdio_spec(first), "pid", key=PoolKey("a", "server"))
        assert int(text(again)) == pid_a and again.reused  # the same process
        pid_b = int(text(await call(pool, stdio_spec(second), "pid", key=PoolKey("b", "server"))))
        assert pid_b != pid_a
        await until(lambda: gone(pid_a))  # the idle one made room
        assert len(pool) == 1
    finally:
        await pool.aclose()
    await until(lambda: gone(pid_b))


async def test_when_every_pooled_session_is_busy_a_call_gets_one_of_its_own(streamable):
    pool = McpPool(max_sessions=1)
    try:
        spec = http_spec(streamable["url"])
        slow = asyncio.ensure_future(call(pool, spec, "slow", {"seconds": 1}))
        await until(lambda: "slow:started" in streamable["events"])
        other = await call(pool, spec, "echo", {"text": "x"}, key=PoolKey("2", "server"))
        assert text(other) == "echo: x"
        assert text(await slow) == "done"
        assert len(pool) == 1  # the extra session was not kept
        await until(lambda: streamable["sessions"]["closed"] == 1)
    finally:
        await pool.aclose()


async def test_stop_on_a_pooled_session_tells_the_server_and_keeps_the_session(pool, streamable):
    spec = http_spec(streamable["url"])
    cancel = CancelToken()
    asyncio.get_running_loop().call_later(0.5, cancel.cancel)
    stopped = await call(pool, spec, "slow", {"seconds": 30}, timeout=20, cancel=cancel)
    assert stopped.outcome.end == "cancelled"
    await until(lambda: "slow:cancelled" in streamable["events"])
    assert text(await call(pool, spec, "echo", {"text": "after"})) == "echo: after"
    assert streamable["sessions"]["opened"] == 1


async def test_a_session_the_server_forgot_is_reopened_and_the_call_sent_once(pool):
    with http_server() as first:
        spec = http_spec(first["url"])
        text(await call(pool, spec, "echo", {"text": "before"}))
        port = first["port"]
    with http_server(port=port) as restarted:  # the server restarted: sessions forgotten
        again = await call(pool, spec, "echo", {"text": "after"})
        assert text(again) == "echo: after"
        assert restarted["events"] == ["echo:after"]
        assert restarted["sessions"]["opened"] == 1


async def test_a_call_whose_connection_never_opened_is_not_taken_for_a_lost_one(pool):
    with http_server() as srv:
        spec = http_spec(srv["url"])
        text(await call(pool, spec, "echo", {"text": "before"}))
    # The server is down: the request's connection is refused, so it never left. It is
    # tried once more on a new session (refused too), and reported as a failure to
    # connect, not as a call that may have run.
    with pytest.raises(BaseException) as caught:
        await call(pool, spec, "echo", {"text": "after"})
    assert "ConnectError" in repr(caught.value)
    assert len(pool) == 0


async def test_a_stdio_server_that_died_while_idle_is_restarted_for_the_next_call(pool, tmp_path):
    events = tmp_path / "events.log"
    pid = int(text(await call(pool, stdio_spec(events), "pid")))
    os.kill(pid, signal.SIGKILL)
    await until(lambda: gone(pid))
    assert text(await call(pool, stdio_spec(events), "echo", {"text": "next"})) == "echo: next"
    assert lines(events).count("echo:next") == 1
    assert len([line for line in lines(events) if line.startswith("pid:")]) == 2


async def test_a_call_out_when_its_server_died_is_not_sent_again(pool, tmp_path):
    events = tmp_path / "events.log"
    spec = stdio_spec(events)
    pid = int(text(await call(pool, spec, "pid")))
    out = asyncio.ensure_future(call(pool, spec, "slow", {"seconds": 30}, timeout=20))
    await until(lambda: "slow:started" in lines(events))
    os.kill(pid, signal.SIGKILL)
    lost = await out
    assert lost.outcome.end == "lost"
    assert text(await call(pool, spec, "echo", {"text": "next"})) == "echo: next"
    assert lines(events).count("slow:started") == 1  # never sent to the new process
    assert lines(events).count("echo:next") == 1


async def test_tools_changed_during_a_call_are_listed_again_on_the_same_session(pool, streamable):
    spec = http_spec(streamable["url"])
    plain = await call(pool, spec, "echo", {"text": "x"})
    assert plain.tools is None
    grown = await call(pool, spec, "grow")
    assert text(grown) == "grown"
    assert "extra" in {t["name"] for t in grown.tools}
    assert (await call(pool, spec, "echo", {"text": "y"})).tools is None
    assert streamable["sessions"]["opened"] == 1


async def test_tools_changed_while_no_call_is_out_are_listed_and_handed_on(pool, streamable):
    listed: list[tuple[PoolKey, set[str]]] = []

    async def tools_listed(key, tools):
        listed.append((key, {t["name"] for t in tools}))

    pool.tools_listed = tools_listed
    spec = http_spec(streamable["url"])
    assert text(await call(pool, spec, "grow_soon")) == "soon"
    await until(lambda: listed)  # the server announced it 0.3 s after answering
    assert listed[0][0] == KEY and "later" in listed[0][1]
    assert streamable["sessions"]["opened"] == 1


async def test_closing_the_pool_ends_every_session(tmp_path, streamable):
    pool = McpPool()
    text(await call(pool, http_spec(streamable["url"]), "echo", {"text": "x"}))
    pid = int(
        text(await call(pool, stdio_spec(tmp_path / "e.log"), "pid", key=PoolKey("s", "server")))
    )
    await pool.aclose()
    assert len(pool) == 0
    assert gone(pid)
    assert streamable["sessions"]["closed"] == 1
