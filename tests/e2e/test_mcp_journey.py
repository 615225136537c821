"""An MCP journey in Chromium on the distributed stack: the admin adds an OAuth-protected
MCP server in the admin (discovery finds it wants each user's own account); the user
connects their account from Settings (the server's own authorization server and its
consent page, then back); switches the server on for a session; asks a question the
server's tool answers; approves the call (policy ask); sees the result card named
after the server; and disconnects. The MCP server and its authorization server are real
(the SDK's, on loopback: tests/mcp/oauth_servers.py); the call runs in the Celery worker."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Group

from sessions.mcp.models import McpCall, McpConnection, McpServer
from tests.e2e.pages import (
    LIVE_TIMEOUT_MS,
    ROOT_PASSWORD,
    assistant_with,
    send,
    sign_in_admin,
    transcript_text,
    wait_connected,
)
from tests.fakes import Reply, text, tool_call
from tests.mcp.oauth_servers import oauth_mcp_server

pytestmark = [pytest.mark.distributed, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def docs():
    with oauth_mcp_server() as srv:
        yield srv


def test_the_admin_adds_an_oauth_server_a_user_connects_it_and_an_approved_call_answers(
    stack, new_page, shot, alice, root, alice_chat, fake, docs, celery_worker
):
    team = Group.objects.create(name="support")
    alice.groups.add(team)

    # The admin registers the server; discovery meets its 401 and marks it OAuth.
    admin = new_page()
    sign_in_admin(admin, stack, "root", ROOT_PASSWORD)
    admin.goto(f"{stack}/admin/mcp/mcpserver/add/")
    admin.fill("#id_name", "docs")
    admin.fill("#id_display_name", "Team Docs")
    admin.fill("#id_url", docs["url"])
    admin.select_option("#id_default_policy", "ask")
    admin.select_option("#id_teams_from", label="support")
    admin.click("#id_teams_add")
    shot(admin, "admin adds the MCP server")
    admin.click("input[name=_save]")
    admin.locator(".messagelist .warning", has_text="own account (OAuth)").wait_for()
    shot(admin, "discovery marks it OAuth")
    server = McpServer.objects.get(name="docs")
    assert server.oauth is True and server.tools_cache == []

    # The user connects their own account from Settings.
    page = alice_chat
    session = page.session
    page.goto(f"{stack}/settings/")
    section = page.get_by_role("region", name="Connected accounts")
    assert "Not connected" in section.inner_text()
    shot(page, "settings offers Connect")
    section.get_by_role("link", name="Connect Team Docs").click()
    page.wait_for_url(f"{docs['issuer']}/consent*")
    assert "Allow OpenWorker to use your Docs account?" in page.inner_text("h1")
    page.get_by_label("Docs account").fill("alice@docs")
    shot(page, "the authorization server's consent page")
    page.get_by_role("button", name="Allow").click()
    page.wait_for_url(f"{stack}/settings/*")
    assert "Team Docs is connected (2 tools)." in page.inner_text(".messages")
    section = page.get_by_role("region", name="Connected accounts")
    assert section.get_by_role("button", name="Disconnect Team Docs").is_visible()
    shot(page, "connected")
    assert McpConnection.objects.filter(user=alice, server=server).count() == 1

    # The session uses the server; the model asks for its tool; the user approves.
    page.goto(f"{stack}/sessions/{session.pk}/tools/")
    page.get_by_label("Team Docs").check()
    page.get_by_role("button", name="Save").click()
    page.wait_for_url(f"{stack}/sessions/{session.pk}/")
    wait_connected(page)
    fake.push(
        Reply(text("Let me search your docs. "), tool_call("docs__search", {"query": "setup"})),
        Reply(text("Your docs have a page called Setup.")),
    )
    send(page, "Where do our docs explain the setup?")
    card = page.locator("[data-approvals] .approval-card", has_text="docs__search")
    card.wait_for(timeout=LIVE_TIMEOUT_MS)
    assert not McpCall.objects.exists(), "the tool ran before it was approved"
    shot(page, "approval asked")
    card.get_by_role("button", name="Approve").click()

    assistant_with(page, "a page called Setup")
    tool_card = page.locator("[data-items] .tool-card", has_text="docs__search")
    tool_card.wait_for(timeout=LIVE_TIMEOUT_MS)
    assert "on Team Docs" in tool_card.inner_text()
    result = page.locator("[data-items] article.msg-tool", has_text="docs__search")
    result.wait_for()
    result.locator("summary").first.click()
    assert "in alice@docs's docs: Setup" in result.inner_text()
    shot(page, "result card on Team Docs")
    call = McpCall.objects.get()
    assert (call.user_id, call.server_name, call.outcome) == (alice.pk, "docs", "ok")
    # The model got the result that the user's own token fetched.
    assert "alice@docs's docs" in json.dumps(fake.requests[-1].body)

    # No token on any page the user saw, nor in the worker's log.
    shown = page.content() + transcript_text(page)
    page.goto(f"{stack}/settings/")
    shown += page.content()
    admin.goto(f"{stack}/admin/mcp/mcpconnection/")
    shown += admin.content()
    admin.goto(f"{stack}/admin/mcp/mcpserver/{server.pk}/change/")
    shown += admin.content()
    worker_log = celery_worker.output()
    for token in docs["auth"].issued:
        assert token not in shown
        assert token not in worker_log

    # Disconnect ends the grant at the server and here; Settings offers Connect again.
    section = page.get_by_role("region", name="Connected accounts")
    section.get_by_role("button", name="Disconnect Team Docs").click()
    page.wait_for_url(f"{stack}/settings/*")
    assert "Team Docs is disconnected." in page.inner_text(".messages")
    section = page.get_by_role("region", name="Connected accounts")
    assert section.get_by_role("link", name="Connect Team Docs").is_visible()
    shot(page, "disconnected")
    assert not McpConnection.objects.filter(user=alice).exists()
    assert "revoke:alice@docs" in docs["auth"].log
