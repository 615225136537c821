"""MCP tools in real turns (embedded mode): a fake Anthropic upstream calls the namespaced
tools of a real FastMCP server on loopback; the engine enforces each policy, waits for
approval across a closed tab, stops an in-flight call, bounds it by time and size, and
records every call. A call a crash left without a result is never sent again unasked."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext

from openworker.runtime.agent.degradation import IMAGE_PLACEHOLDER
from openworker.runtime.agent.tools import mcp_pool
from openworker.runtime.agent.tools.mcp import discover_and_store, session_registry
from openworker.runtime.turns.runner import embedded_runner
from sessions.mcp.models import McpCall, McpServer, McpToolPolicy, SessionMcpServer
from sessions.models import Message, Session, Turn
from tests.fakes import AnthropicMessagesFake, OpenAIChatFake, Reply, text, tool_call
from tests.mcp.servers import PNG_1PX, http_server
from tests.support.chat import point_provider_at, read_until_status
from tests.test_engine_embedded import open_socket
from tests.test_mcp_client import STDIO_SCRIPT

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "anthropic:claude-test-1"


@pytest.fixture(autouse=True)
async def _close_pooled_sessions():
    """The turns ran on this test's loop: its pooled MCP sessions end with the test."""
    yield
    await mcp_pool.aclose_running_loop_pool()


@pytest.fixture
def fake():
    with AnthropicMessagesFake() as server:
        yield server


@pytest.fixture
def mcp_http():
    with http_server() as srv:
        yield srv


def register(owner, url: str = "", **fields) -> McpServer:
    team, _ = Group.objects.get_or_create(name="support")
    owner.groups.add(team)
    server = McpServer.objects.create(
        name=fields.pop("name", "docs"),
        display_name=fields.pop("display_name", "Docs"),
        url=url,
        **fields,
    )
    server.teams.add(team)
    tools, error = discover_and_store(server)
    assert tools, error
    server.refresh_from_db()
    return server


async def session_using(owner, fake, *servers: McpServer) -> Session:
    await sync_to_async(point_provider_at)(owner, "anthropic", fake.base_url)
    session = await Session.objects.acreate(owner=owner, model=MODEL)
    for server in servers:
        await SessionMcpServer.objects.acreate(session=session, server=server)
    return session


async def ask(owner, session, words: str = "go", statuses=None) -> list[dict]:
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": words})
    events = (
        await read_until_status(ws) if statuses is None else await read_until_status(ws, statuses)
    )
    await ws.disconnect()
    return events


def tool_result(fake, index: int = -1) -> dict:
    return fake.requests[index].body["messages"][-1]["content"][0]


def result_text(block: dict) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [])


async def test_an_allowed_tool_runs_and_its_result_reaches_the_model(owner, fake, mcp_http):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="allow")
    fake.push(Reply(tool_call("docs__echo", {"text": "hi"})), Reply(text("It said hi.")))
    session = await session_using(owner, fake, server)
    events = await ask(owner, session)

    assert events[-1]["status"] == "completed"
    offered = {t["name"]: t for t in fake.requests[0].body["tools"]}
    assert offered["docs__echo"]["description"] == "[Docs] Echo the text back."
    assert offered["docs__echo"]["input_schema"]["required"] == ["text"]
    assert "list_files" in offered  # the built-in tools stay
    assert result_text(tool_result(fake)) == "echo: hi"
    assert mcp_http["events"] == ["echo:hi"]
    call = await McpCall.objects.aget()
    assert (call.user_id, call.server_name, call.tool, call.outcome) == (
        owner.pk,
        "docs",
        "echo",
        "ok",
    )
    assert call.arguments == {"text": "hi"}
    assert str(call.session_id) == str(session.pk)
    assert call.duration_ms is not None and call.result_bytes == len("echo: hi")
    card = next(e for e in events if e["type"] == "tool.started")
    assert card["name"] == "docs__echo"


async def test_a_sensitive_server_keeps_argument_values_out_of_the_record(owner, fake, mcp_http):
    server = await sync_to_async(register)(
        owner, mcp_http["url"], default_policy="allow", sensitive=True
    )
    fake.push(Reply(tool_call("docs__echo", {"text": "patient 42"})), Reply(text("ok")))
    await ask(owner, await session_using(owner, fake, server))
    call = await McpCall.objects.aget()
    assert call.outcome == "ok" and call.arguments is None


async def test_an_ask_tool_waits_for_approval_that_survives_a_closed_tab(owner, fake, mcp_http):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="ask")
    fake.push(Reply(tool_call("docs__echo", {"text": "later"})), Reply(text("Done.")))
    session = await session_using(owner, fake, server)
    events = await ask(owner, session)
    assert events[-1]["status"] == "awaiting_approval"
    approval = next(e for e in events if e["type"] == "tool.approval")
    assert approval["calls"][0]["name"] == "docs__echo"
    assert mcp_http["events"] == []  # nothing ran before the user said yes

    ws = await open_socket(owner, session)  # a new tab
    await ws.send_json_to(
        {"type": "approve", "turn": approval["turn"], "call_id": approval["calls"][0]["id"]}
    )
    events = await read_until_status(ws, {"completed", "failed"})
    await ws.disconnect()
    assert events[-1]["status"] == "completed"
    assert mcp_http["events"] == ["echo:later"]
    assert result_text(tool_result(fake)) == "echo: later"


async def test_a_user_denial_never_reaches_the_server(owner, fake, mcp_http):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="ask")
    fake.push(Reply(tool_call("docs__echo", {"text": "no"})), Reply(text("OK.")))
    session = await session_using(owner, fake, server)
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": "go"})
    events = await read_until_status(ws)
    approval = next(e for e in events if e["type"] == "tool.approval")
    await ws.send_json_to(
        {"type": "deny", "turn": approval["turn"], "call_id": approval["calls"][0]["id"]}
    )
    events = await read_until_status(ws, {"completed", "failed"})
    await ws.disconnect()
    assert "denied" in result_text(tool_result(fake))
    assert mcp_http["events"] == []
    assert not await McpCall.objects.aexists()


async def test_a_per_tool_deny_overrides_the_servers_allow(owner, fake, mcp_http):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="allow")
    await McpToolPolicy.objects.acreate(server=server, tool="echo", policy="deny")
    fake.push(Reply(tool_call("docs__echo", {"text": "x"})), Reply(text("Refused.")))
    events = await ask(owner, await session_using(owner, fake, server))
    assert events[-1]["status"] == "completed"
    block = tool_result(fake)
    assert block["is_error"] is True and "disabled by the administrator" in result_text(block)
    assert mcp_http["events"] == []


async def test_a_per_tool_allow_overrides_the_servers_ask(owner, fake, mcp_http):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="ask")
    await McpToolPolicy.objects.acreate(server=server, tool="echo", policy="allow")
    fake.push(Reply(tool_call("docs__echo", {"text": "y"})), Reply(text("Fine.")))
    events = await ask(owner, await session_using(owner, fake, server))
    assert events[-1]["status"] == "completed"
    assert mcp_http["events"] == ["echo:y"]


async def test_an_error_result_goes_back_to_the_model_as_a_tool_error(owner, fake, mcp_http):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="allow")
    fake.push(Reply(tool_call("docs__fail", {})), Reply(text("It failed.")))
    events = await ask(owner, await session_using(owner, fake, server))
    assert events[-1]["status"] == "completed"
    block = tool_result(fake)
    assert block["is_error"] is True
    assert "read-only" in result_text(block)
    assert (await McpCall.objects.aget()).outcome == "error"


async def test_an_oversized_result_is_refused_and_the_model_told_why(owner, fake, mcp_http):
    server = await sync_to_async(register)(
        owner, mcp_http["url"], default_policy="allow", max_result_bytes=1000
    )
    fake.push(Reply(tool_call("docs__big", {"n": 5000})), Reply(text("Too big.")))
    await ask(owner, await session_using(owner, fake, server))
    block = tool_result(fake)
    assert block["is_error"] is True
    assert "5000 bytes, over the 1000-byte limit" in result_text(block)
    call = await McpCall.objects.aget()
    assert call.outcome == "oversize" and call.result_bytes == 5000
    stored = await Message.objects.aget(role="tool")
    assert "x" * 100 not in str(stored.content)


async def test_structured_results_reach_the_model(owner, fake, mcp_http):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="allow")
    fake.push(Reply(tool_call("docs__add", {"a": 2, "b": 3})), Reply(text("5")))
    await ask(owner, await session_using(owner, fake, server))
    assert '"sum": 5' in result_text(tool_result(fake))


async def test_arguments_that_break_the_schema_never_reach_the_server(owner, fake, mcp_http):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="allow")
    fake.push(Reply(tool_call("docs__add", {"a": "two"})), Reply(text("oops")))
    await ask(owner, await session_using(owner, fake, server))
    block = tool_result(fake)
    assert block["is_error"] is True and "Invalid arguments for docs__add" in result_text(block)
    assert not await McpCall.objects.aexists()


async def test_stop_cancels_an_in_flight_call_on_the_server(owner, fake, mcp_http):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="allow")
    fake.push(Reply(tool_call("docs__slow", {"seconds": 30})), Reply(text("never")))
    session = await session_using(owner, fake, server)
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": "go"})
    while (event := await ws.receive_json_from(timeout=10))["type"] != "tool.started":
        pass
    for _ in range(100):
        if "slow:started" in mcp_http["events"]:
            break
        await asyncio.sleep(0.05)
    await ws.send_json_to({"type": "stop", "turn": event["turn"]})
    events = await read_until_status(ws)
    await ws.disconnect()
    assert events[-1]["status"] == "cancelled"
    for _ in range(100):
        if "slow:cancelled" in mcp_http["events"]:
            break
        await asyncio.sleep(0.05)
    assert mcp_http["events"] == ["slow:started", "slow:cancelled"]
    assert (await McpCall.objects.aget()).outcome == "cancelled"
    assert len(fake.requests) == 1  # the model was not called again


async def test_a_call_past_the_servers_timeout_is_a_tool_error(owner, fake, mcp_http):
    server = await sync_to_async(register)(
        owner, mcp_http["url"], default_policy="allow", timeout_seconds=1
    )
    fake.push(Reply(tool_call("docs__slow", {"seconds": 30})), Reply(text("Slow server.")))
    events = await ask(owner, await session_using(owner, fake, server))
    assert events[-1]["status"] == "completed"
    block = tool_result(fake)
    assert block["is_error"] is True and "did not answer within 1 seconds" in result_text(block)
    assert (await McpCall.objects.aget()).outcome == "timeout"
    assert "slow:finished" not in mcp_http["events"]


async def test_an_image_result_reaches_a_vision_model_as_an_image(
    owner, fake, mcp_http, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="allow")
    fake.push(Reply(tool_call("docs__picture", {})), Reply(text("A picture.")))
    await ask(owner, await session_using(owner, fake, server))
    blocks = tool_result(fake)["content"]
    assert blocks[0] == {"type": "text", "text": f"[image: image/png, {len(PNG_1PX)} bytes]"}
    assert blocks[1]["type"] == "image"
    assert base64.b64decode(blocks[1]["source"]["data"]) == PNG_1PX
    stored = await Message.objects.aget(role="tool")
    assert stored.content[1]["image_url"]["url"].startswith("attachment:")  # not the bytes


async def test_an_image_result_degrades_to_the_placeholder_for_a_text_only_model(
    owner, mcp_http, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="allow")
    with OpenAIChatFake(api_key=None) as ollama:
        ollama.push(Reply(tool_call("docs__picture", {})), Reply(text("Cannot see it.")))
        await sync_to_async(point_provider_at)(owner, "ollama", ollama.base_url, api_key="")
        session = await Session.objects.acreate(owner=owner, model="ollama:llama3.3")
        await SessionMcpServer.objects.acreate(session=session, server=server)
        events = await ask(owner, session)
        sent = ollama.requests[-1].body["messages"][-1]
    assert events[-1]["status"] == "completed"
    assert sent["role"] == "tool"
    assert IMAGE_PLACEHOLDER in sent["content"]
    assert "iVBOR" not in json.dumps(ollama.requests[-1].body)


async def test_a_call_a_crash_left_unfinished_is_not_sent_again(owner, fake, mcp_http):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="ask")
    fake.push(Reply(tool_call("docs__echo", {"text": "charge card"})), Reply(text("Asking.")))
    session = await session_using(owner, fake, server)
    events = await ask(owner, session)
    approval = next(e for e in events if e["type"] == "tool.approval")
    call_id = approval["calls"][0]["id"]
    # What a worker that died mid-call leaves: the record of a call that left, no result.
    await McpCall.objects.acreate(
        user=owner,
        session_id=session.pk,
        turn_id=approval["turn"],
        call_id=call_id,
        server=server,
        server_name="docs",
        tool="echo",
    )
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "approve", "turn": approval["turn"], "call_id": call_id})
    events = await read_until_status(ws, {"completed", "failed"})
    await ws.disconnect()
    block = tool_result(fake)
    assert block["is_error"] is True and "was not sent again" in result_text(block)
    assert mcp_http["events"] == []
    assert (await McpCall.objects.aget()).outcome == "interrupted"


async def test_only_chosen_servers_of_the_users_teams_are_offered(owner, fake, mcp_http):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="allow")
    fake.push(Reply(text("a")), Reply(text("b")), Reply(text("c")))
    unchosen = await session_using(owner, fake)
    await ask(owner, unchosen)
    assert not any(t["name"].startswith("docs__") for t in fake.requests[0].body["tools"])

    chosen = await session_using(owner, fake, server)
    await ask(owner, chosen)
    assert any(t["name"] == "docs__echo" for t in fake.requests[1].body["tools"])

    await sync_to_async(owner.groups.clear)()  # off the team: the choice grants nothing
    await ask(owner, chosen)
    assert not any(t["name"].startswith("docs__") for t in fake.requests[2].body["tools"])


async def test_a_list_changed_notification_refreshes_the_tools_for_the_next_turn(
    owner, fake, mcp_http
):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="allow")
    fake.push(Reply(tool_call("docs__grow", {})), Reply(text("Grown.")), Reply(text("next")))
    session = await session_using(owner, fake, server)
    await ask(owner, session)
    assert "docs__extra" not in {t["name"] for t in fake.requests[0].body["tools"]}
    await ask(owner, session, "again")
    assert "docs__extra" in {t["name"] for t in fake.requests[2].body["tools"]}


async def test_names_no_provider_accepts_are_rewritten_and_still_call_the_tool(
    owner, fake, mcp_http
):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="allow")
    fake.push(Reply(text("look")))
    session = await session_using(owner, fake, server)
    await ask(owner, session)
    names = [t["name"] for t in fake.requests[0].body["tools"] if t["name"].startswith("docs__")]
    odd = next(n for n in names if n.startswith("docs__get_page_v2_"))
    fake.push(Reply(tool_call(odd, {})), Reply(text("odd")))
    await ask(owner, session, "call it")
    assert result_text(tool_result(fake)) == "odd"


async def test_a_stdio_server_runs_in_a_turn(owner, fake):
    server = await sync_to_async(register)(
        owner,
        name="local",
        transport="stdio",
        command=sys.executable,
        args=[str(STDIO_SCRIPT)],
        default_policy="allow",
    )
    fake.push(Reply(tool_call("local__echo", {"text": "pipe"})), Reply(text("ok")))
    events = await ask(owner, await session_using(owner, fake, server))
    assert events[-1]["status"] == "completed"
    assert result_text(tool_result(fake)) == "echo: pipe"
    turn = await Turn.objects.aget()
    assert turn.status == "completed"


async def test_tools_a_server_adds_during_a_turn_are_offered_by_its_next_model_call(
    owner, fake, mcp_http
):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="allow")
    fake.push(
        Reply(tool_call("docs__grow", {})),
        Reply(tool_call("docs__extra", {})),
        Reply(text("Used the new tool.")),
    )
    events = await ask(owner, await session_using(owner, fake, server))
    assert events[-1]["status"] == "completed"
    assert "docs__extra" not in {t["name"] for t in fake.requests[0].body["tools"]}
    assert "docs__extra" in {t["name"] for t in fake.requests[1].body["tools"]}  # same turn
    assert result_text(tool_result(fake)) == "extra!"
    await server.arefresh_from_db()
    assert "extra" in {t["name"] for t in server.tools_cache}  # and kept for the next turns


async def test_turns_share_one_open_session_to_the_server(owner, fake, mcp_http):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="allow")
    opened = mcp_http["sessions"]["opened"]  # discovery's own
    fake.push(Reply(tool_call("docs__echo", {"text": "1"})), Reply(text("one")))
    fake.push(Reply(tool_call("docs__echo", {"text": "2"})), Reply(text("two")))
    session = await session_using(owner, fake, server)
    await ask(owner, session)
    await ask(owner, session, "again")
    assert mcp_http["events"] == ["echo:1", "echo:2"]
    assert mcp_http["sessions"]["opened"] - opened == 1


async def test_a_session_without_mcp_servers_builds_its_tools_in_one_query(owner, fake, mcp_http):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="allow")
    plain = await session_using(owner, fake)
    using = await session_using(owner, fake, server)

    def statements(session) -> tuple[int, list[str]]:
        with CaptureQueriesContext(connection) as queries:
            registry = session_registry(session_id=session.pk, owner_id=owner.pk)
        return len(queries), sorted(t.name for t in registry if t.name.startswith("docs__"))

    assert await sync_to_async(statements)(plain) == (1, [])  # was 3: session, owner, servers
    count, names = await sync_to_async(statements)(using)
    assert count == 2 and "docs__echo" in names  # the servers, their tool policies


async def test_a_disabled_or_edited_servers_pooled_session_closes_on_the_next_sweep(
    owner, fake, mcp_http
):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="allow")
    fake.push(Reply(tool_call("docs__echo", {"text": "1"})), Reply(text("one")))
    await ask(owner, await session_using(owner, fake, server))
    pool = mcp_pool.pool()
    assert len(pool) == 1
    await pool.sweep()
    assert len(pool) == 1  # unchanged and enabled: kept

    server.set_bearer("a-new-secret")
    await server.asave()
    await pool.sweep()
    assert len(pool) == 0  # the secret changed in the admin (any process)

    fake.push(Reply(tool_call("docs__echo", {"text": "2"})), Reply(text("two")))
    await ask(owner, await session_using(owner, fake, server))
    assert len(pool) == 1
    await McpServer.objects.filter(pk=server.pk).aupdate(enabled=False)
    await pool.sweep()
    assert len(pool) == 0


async def test_the_embedded_runners_shutdown_closes_the_loops_pooled_sessions(
    owner, fake, mcp_http
):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="allow")
    fake.push(Reply(tool_call("docs__echo", {"text": "1"})), Reply(text("one")))
    await ask(owner, await session_using(owner, fake, server))
    closed = mcp_http["sessions"]["closed"]  # discovery's own
    assert len(mcp_pool.pool()) == 1
    await embedded_runner.shutdown()  # what Daphne's shutdown trigger runs
    assert mcp_http["sessions"]["closed"] == closed + 1  # the pooled session's DELETE


async def test_a_call_whose_server_died_under_it_is_reported_and_not_sent_again(
    owner, fake, tmp_path
):
    events = tmp_path / "events.log"
    server = await sync_to_async(register)(
        owner,
        name="local",
        transport="stdio",
        command=sys.executable,
        args=[str(STDIO_SCRIPT), str(events)],
        default_policy="allow",
    )
    fake.push(Reply(tool_call("local__slow", {"seconds": 30})), Reply(text("It broke.")))
    session = await session_using(owner, fake, server)
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": "go"})
    for _ in range(200):
        if events.exists() and "slow:started" in events.read_text():
            break
        await asyncio.sleep(0.05)
    # The last process started (discovery's came first, and has exited).
    pids = [line for line in events.read_text().splitlines() if line.startswith("pid:")]
    pid = int(pids[-1].removeprefix("pid:"))
    os.kill(pid, signal.SIGKILL)
    finished = await read_until_status(ws, {"completed", "failed"})
    await ws.disconnect()
    assert finished[-1]["status"] == "completed"
    block = tool_result(fake)
    assert block["is_error"] is True and "was not sent again" in result_text(block)
    assert (await McpCall.objects.aget()).outcome == "interrupted"
    assert events.read_text().count("slow:started") == 1


async def test_tools_a_server_changes_after_answering_are_stored_for_the_next_turn(
    owner, fake, mcp_http
):
    server = await sync_to_async(register)(owner, mcp_http["url"], default_policy="allow")
    fake.push(Reply(tool_call("docs__grow_soon", {})), Reply(text("Soon.")), Reply(text("b")))
    session = await session_using(owner, fake, server)
    await ask(owner, session)
    for _ in range(200):  # announced on the session's own stream 0.3 s after the answer
        await server.arefresh_from_db()
        if "later" in {t["name"] for t in server.tools_cache}:
            break
        await asyncio.sleep(0.05)
    await ask(owner, session, "again")
    assert "docs__later" in {t["name"] for t in fake.requests[-1].body["tools"]}
