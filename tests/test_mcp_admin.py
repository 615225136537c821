"""The admin registers MCP servers (secrets write-only and encrypted, URLs under the
outbound policy, discovery on save) and a user picks the servers a session uses."""

from __future__ import annotations

import asyncio

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from openworker.runtime.agent.tools import mcp_client
from openworker.runtime.agent.tools.mcp import server_spec
from sessions.mcp.models import McpCall, McpServer, SessionMcpServer
from sessions.models import Message, Session
from sessions.presenters import message_view, render_message_html
from tests.mcp.servers import http_server

pytestmark = pytest.mark.django_db(transaction=True)
ADD_URL = "/admin/mcp/mcpserver/add/"


@pytest.fixture
def admin_client(db):
    admin = get_user_model().objects.create_superuser("root", password="root-pass-123")
    client = Client()
    client.force_login(admin)
    return client


@pytest.fixture
def team(owner):
    group = Group.objects.create(name="support")
    owner.groups.add(group)
    return group


def add_form(**fields) -> dict:
    form = {
        "name": "docs",
        "display_name": "Docs",
        "transport": "streamable_http",
        "url": "",
        "command": "",
        "args": "[]",
        "default_policy": "ask",
        "timeout_seconds": "30",
        "max_result_bytes": "100000",
        "enabled": "on",
        "tool_policies-TOTAL_FORMS": "0",
        "tool_policies-INITIAL_FORMS": "0",
    }
    form.update(fields)
    return form


def test_the_admin_adds_a_server_its_tools_are_discovered_and_the_token_is_sealed(
    admin_client, team
):
    with http_server() as srv:
        response = admin_client.post(
            ADD_URL,
            add_form(
                url=srv["url"],
                bearer_token="tok-123",
                static_headers="X-Team: ops",
                teams=[team.pk],
            ),
            follow=True,
        )
        assert response.status_code == 200, response.content[:500]
        server = McpServer.objects.get(name="docs")
        assert "echo" in {t["name"] for t in server.tools_cache}
        assert server.tools_refreshed_at is not None
        assert "tok-123" not in server.bearer_encrypted
        assert "ops" not in server.headers_encrypted
        assert list(server.teams.all()) == [team]

        async def whoami() -> str:
            async with mcp_client.connect(server_spec(server)) as session:
                outcome = await mcp_client.call_tool(session, "whoami", {}, timeout=10)
            return outcome.result.content[0].text

        assert asyncio.run(whoami()) == "authorization=Bearer tok-123; team=ops"

        page = admin_client.get(f"/admin/mcp/mcpserver/{server.pk}/change/")
        assert b"tok-123" not in page.content and b"X-Team: ops" not in page.content
        # Saving again without a token keeps the stored one.
        kept = server.bearer_encrypted
        admin_client.post(
            f"/admin/mcp/mcpserver/{server.pk}/change/",
            add_form(url=srv["url"], teams=[team.pk]),
        )
        server.refresh_from_db()
        assert server.bearer_encrypted == kept


@pytest.mark.parametrize(
    "url, reason",
    [
        ("http://127.0.0.1:9/mcp", "loopback"),
        ("http://10.1.2.3/mcp", "private"),
        ("http://169.254.169.254/latest", "metadata"),
    ],
)
def test_a_private_url_is_refused_unless_allow_listed(
    admin_client, settings, monkeypatch, url, reason
):
    settings.DISTRIBUTED = True  # no loopback for free, as in production
    monkeypatch.delenv("OPENWORKER_OUTBOUND_ALLOWLIST", raising=False)
    response = admin_client.post(ADD_URL, add_form(url=url))
    assert response.status_code == 200  # the form again, with the error
    assert reason in response.content.decode()
    assert not McpServer.objects.exists()


def test_an_allow_listed_host_is_accepted(admin_client, settings, monkeypatch):
    settings.DISTRIBUTED = True
    monkeypatch.setenv("OPENWORKER_OUTBOUND_ALLOWLIST", "127.0.0.1")
    with http_server() as srv:
        admin_client.post(ADD_URL, add_form(url=srv["url"]))
    assert McpServer.objects.get().tools_cache


def test_a_stdio_server_needs_a_command_and_only_the_admin_can_add_one(admin_client, owner):
    response = admin_client.post(ADD_URL, add_form(transport="stdio"))
    assert b"A stdio server needs a command." in response.content
    user = Client()
    user.force_login(owner)
    assert user.get(ADD_URL).status_code == 302  # to the admin sign-in
    assert not McpServer.objects.exists()


def test_the_call_record_is_read_only(admin_client):
    assert admin_client.get("/admin/mcp/mcpcall/add/").status_code == 403


def make_server(name: str, teams=()) -> McpServer:
    server = McpServer.objects.create(name=name, url="https://mcp.example.com/mcp")
    server.teams.set(teams)
    return server


def test_a_user_picks_among_the_servers_shared_with_their_teams(owner, team):
    mine = make_server("docs", [team])
    other = make_server("hr", [Group.objects.create(name="hr")])
    session = Session.objects.create(owner=owner, model="anthropic:x")
    client = Client()
    client.force_login(owner)
    url = f"/sessions/{session.pk}/tools/"

    page = client.get(url).content.decode()
    assert f'value="{mine.pk}"' in page and f'value="{other.pk}"' not in page

    assert client.post(url, {"server": [mine.pk]}).status_code == 302
    assert list(SessionMcpServer.objects.values_list("server_id", flat=True)) == [mine.pk]

    refused = client.post(url, {"server": [mine.pk, other.pk]})
    assert refused.status_code == 400
    assert list(SessionMcpServer.objects.values_list("server_id", flat=True)) == [mine.pk]


def test_someone_elses_session_is_not_found(owner, teammate, team):
    session = Session.objects.create(owner=owner, model="anthropic:x")
    client = Client()
    client.force_login(teammate)
    assert client.get(f"/sessions/{session.pk}/tools/").status_code == 404


def test_the_tool_card_names_the_server(owner):
    make_server("docs").__class__.objects.filter(name="docs").update(display_name="Team Docs")
    session = Session.objects.create(owner=owner, model="anthropic:x")
    message = Message.objects.create(
        session=session,
        seq=1,
        role="assistant",
        content="",
        tool_calls=[
            {"id": "c1", "name": "docs__echo", "arguments": {}},
            {"id": "c2", "name": "list_files", "arguments": {}},
        ],
    )
    calls = message_view(session, message)["tool_calls"]
    assert [c["server"] for c in calls] == ["Team Docs", ""]
    html = render_message_html(session, message)
    assert html.count('class="tool-server"') == 1 and "on Team Docs" in html
    assert not McpCall.objects.exists()


def test_rotating_keys_re_encrypts_mcp_secrets_under_the_newest_key(settings):
    from cryptography.fernet import Fernet
    from django.core.management import call_command

    old = settings.ENCRYPTION_KEYS[0]
    server = McpServer.objects.create(name="docs", url="https://mcp.example.com/mcp")
    server.set_bearer("tok-1")
    server.set_headers({"X-Team": "ops"})
    server.save()
    new = Fernet.generate_key().decode()
    settings.ENCRYPTION_KEYS = [new, old]
    call_command("rotate_mcp_keys", stdout=open("/dev/null", "w"))  # noqa: SIM115
    settings.ENCRYPTION_KEYS = [new]  # the old key removed
    server.refresh_from_db()
    assert server.request_headers() == {"X-Team": "ops", "Authorization": "Bearer tok-1"}
