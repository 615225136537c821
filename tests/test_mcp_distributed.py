"""MCP calls with real processes (PostgreSQL, Redis, Daphne, a Celery worker): a call
runs in the worker against a loopback MCP server; `kill -9` of the worker mid-call leaves
an interrupted turn whose retry shows the call was cut short and never sends it again;
turns share the worker's pooled session, which the worker closes when it stops.

Its own module so that no other worker process is consuming the turns queue."""

from __future__ import annotations

import json
import time

import pytest
from django.contrib.auth.models import Group

from openworker.runtime.agent.tools.mcp import discover_and_store
from sessions.mcp.models import McpCall, McpServer, SessionMcpServer
from sessions.models import Message, Session
from tests.fakes import Reply, text, tool_call
from tests.mcp.servers import http_server
from tests.support import procs
from tests.support.chat import (
    open_ws,
    point_provider_at,
    read_sync_until_status,
    wait_for_turn_status,
)

pytestmark = [pytest.mark.distributed, pytest.mark.django_db(transaction=True)]
MODEL = "anthropic:claude-test-1"


@pytest.fixture
def mcp_http():
    with http_server() as srv:
        yield srv


def _session_using_mcp(owner, fake, url: str) -> Session:
    team = Group.objects.create(name="ops")
    owner.groups.add(team)
    server = McpServer.objects.create(name="ops", url=url, default_policy="allow")
    server.teams.add(team)
    tools, error = discover_and_store(server)
    assert tools, error
    point_provider_at(owner, "anthropic", fake.base_url)
    session = Session.objects.create(owner=owner, model=MODEL)
    SessionMcpServer.objects.create(session=session, server=server)
    return session


def test_a_worker_runs_an_mcp_call_and_records_it(
    daphne_server, distributed_env, owner, anthropic_fake, mcp_http
):
    anthropic_fake.push(Reply(tool_call("ops__echo", {"text": "w"})), Reply(text("Done.")))
    session = _session_using_mcp(owner, anthropic_fake, mcp_http["url"])
    with procs.celery_worker(distributed_env), open_ws(daphne_server, owner, session) as ws:
        ws.send(json.dumps({"type": "send", "text": "go"}))
        events = read_sync_until_status(ws, {"completed", "failed"}, timeout=30)
    assert events[-1]["status"] == "completed"
    assert mcp_http["events"] == ["echo:w"]
    call = McpCall.objects.get()
    assert (call.outcome, call.user_id, call.tool) == ("ok", owner.pk, "echo")


def test_a_stopping_worker_closes_its_pooled_mcp_sessions(
    daphne_server, distributed_env, owner, anthropic_fake, mcp_http
):
    anthropic_fake.push(Reply(tool_call("ops__echo", {"text": "1"})), Reply(text("One.")))
    anthropic_fake.push(Reply(tool_call("ops__echo", {"text": "2"})), Reply(text("Two.")))
    session = _session_using_mcp(owner, anthropic_fake, mcp_http["url"])
    assert mcp_http["sessions"] == {"opened": 1, "closed": 1}  # the admin's discovery
    with procs.celery_worker(distributed_env), open_ws(daphne_server, owner, session) as ws:
        for words in ("one", "two"):
            ws.send(json.dumps({"type": "send", "text": words}))
            events = read_sync_until_status(ws, {"completed", "failed"}, timeout=30)
            assert events[-1]["status"] == "completed"
        assert mcp_http["sessions"] == {"opened": 2, "closed": 1}  # one pooled for both
    # SIGTERM: the worker's shutdown ends the session it kept open (an HTTP DELETE).
    assert mcp_http["sessions"] == {"opened": 2, "closed": 2}
    assert mcp_http["events"] == ["echo:1", "echo:2"]


def test_a_call_cut_short_by_a_worker_crash_is_shown_and_not_sent_again(
    daphne_server, distributed_env, owner, anthropic_fake, mcp_http
):
    anthropic_fake.push(Reply(tool_call("ops__slow", {"seconds": 60})))
    anthropic_fake.push(Reply(text("It was interrupted; shall I try again?")))
    session = _session_using_mcp(owner, anthropic_fake, mcp_http["url"])
    with (
        procs.celery_worker(distributed_env) as worker,
        open_ws(daphne_server, owner, session) as ws,
    ):
        ws.send(json.dumps({"type": "send", "text": "go"}))
        while (event := json.loads(ws.recv(timeout=20)))["type"] != "tool.started":
            pass
        turn_id = event["turn"]
        deadline = time.monotonic() + 10
        while "slow:started" not in mcp_http["events"] and time.monotonic() < deadline:
            time.sleep(0.05)
        worker.kill()
        wait_for_turn_status(turn_id, {"interrupted"}, timeout=15)
        read_sync_until_status(ws, {"interrupted"}, timeout=15)
    assert McpCall.objects.get().outcome == "started"  # the record of a call that left

    with procs.celery_worker(distributed_env), open_ws(daphne_server, owner, session) as ws:
        ws.send(json.dumps({"type": "retry", "turn": turn_id}))
        events = read_sync_until_status(ws, {"completed", "failed"}, timeout=30)
    assert events[-1]["status"] == "completed"
    assert mcp_http["events"].count("slow:started") == 1  # never sent again
    tool = Message.objects.get(session=session, role="tool")
    assert tool.extras["is_error"] is True
    assert "was not sent again" in tool.content
    last = anthropic_fake.requests[-1].body["messages"][-1]["content"][0]
    assert last["is_error"] is True
    assert McpCall.objects.get().outcome == "interrupted"
