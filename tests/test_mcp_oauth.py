"""Per-user OAuth on MCP servers, against a real OAuth-protected FastMCP server and its
own authorization server (tests/mcp/oauth_servers.py, both on loopback, built with the
SDK): discovery from the 401, Connect (RFC 7591 registration, authorization code with
PKCE S256, the consent page driven with a real HTTP client), calls with each user's own
token, refresh (before expiry and on a 401), revocation by the user and by an admin, and
no token anywhere it must not be (logs, socket frames, exports, database plaintext)."""

from __future__ import annotations

import json
import logging
import re
from urllib.parse import urlsplit

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.db import connection as db_connection
from django.test import Client
from django.urls import reverse
from mcp.shared.auth import OAuthClientInformationFull

from openworker.runtime.agent.tools import mcp as mcp_tools
from openworker.runtime.agent.tools import mcp_pool
from openworker.runtime.agent.tools.mcp import discover_and_store
from providers.outbound import OutboundPolicy
from sessions.export import session_json_chunks
from sessions.mcp import oauth
from sessions.mcp.connections import PENDING_KEY, mcp_connection_refresh, mcp_connection_token
from sessions.mcp.models import McpCall, McpConnection, McpServer
from sessions.models import Session
from tests.fakes import AnthropicMessagesFake, Reply, text, tool_call
from tests.mcp.oauth_servers import oauth_mcp_server
from tests.mcp.servers import http_server
from tests.test_mcp_admin import add_form
from tests.test_mcp_engine import ask, result_text, session_using, tool_result

pytestmark = pytest.mark.django_db(transaction=True)
LOOPBACK_OK = OutboundPolicy(allow_loopback=True)


@pytest.fixture
def fake():
    with AnthropicMessagesFake() as server:
        yield server


@pytest.fixture
def docs():
    with oauth_mcp_server() as srv:
        yield srv


@pytest.fixture
def team(owner, teammate):
    group = Group.objects.create(name="support")
    owner.groups.add(group)
    teammate.groups.add(group)
    return group


@pytest.fixture
def admin_client(db):
    admin = get_user_model().objects.create_superuser("root", password="root-pass-123")
    client = Client()
    client.force_login(admin)
    return client


def oauth_server(url: str, team: Group, **fields) -> McpServer:
    server = McpServer.objects.create(
        name="docs", display_name="Docs", url=url, oauth=True, **fields
    )
    server.teams.add(team)
    return server


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def consent_at_the_authorization_server(authorize_url: str, account: str) -> str:
    """What a person does at the AS: open the authorization URL, name their account on
    the consent page, press Allow. Returns where the AS sends the browser back."""
    with httpx.Client(follow_redirects=False, timeout=10) as http:
        response = http.get(authorize_url)
        assert response.status_code == 302, response.text
        consent = http.get(response.headers["location"])
        assert "Allow OpenWorker" in consent.text
        ticket = re.search(r'name="ticket" value="([^"]+)"', consent.text).group(1)
        back = http.post(
            response.headers["location"].split("?")[0],
            data={"ticket": ticket, "account": account},
        )
    assert back.status_code == 302, back.text
    return back.headers["location"]


def connect(client: Client, server: McpServer, account: str):
    """Settings → Connect → the AS → our callback; the final response (to Settings)."""
    start = client.get(reverse("mcp_connect", args=[server.pk]))
    assert start.status_code == 302, start.content
    callback = urlsplit(consent_at_the_authorization_server(start["Location"], account))
    assert callback.path == reverse("mcp_oauth_callback")
    return client.get(f"{callback.path}?{callback.query}")


def connect_as(user, server: McpServer, account: str):
    return connect(signed_in(user), server, account)


def test_the_admin_adding_a_server_that_answers_401_marks_it_oauth(admin_client, team, docs):
    response = admin_client.post(
        "/admin/mcp/mcpserver/add/", add_form(url=docs["url"], teams=[team.pk]), follow=True
    )
    assert response.status_code == 200
    server = McpServer.objects.get(name="docs")
    assert server.oauth is True
    assert server.oauth_resource_metadata_url.endswith("/.well-known/oauth-protected-resource/mcp")
    assert "own account (OAuth)" in response.content.decode()
    assert server.tools_cache == []


def test_discovery_follows_the_protected_resource_to_its_authorization_server(docs):
    challenge = oauth.probe(docs["url"], policy=LOOPBACK_OK)
    info = oauth.discover(docs["url"], policy=LOOPBACK_OK, resource_metadata_url=challenge)
    assert info.resource == docs["url"]
    assert info.resource_metadata["authorization_servers"] == [f"{docs['issuer']}/"]
    assert info.metadata["registration_endpoint"] == f"{docs['issuer']}/register"
    assert info.metadata["code_challenge_methods_supported"] == ["S256"]
    assert info.scopes == "docs:read"


def test_a_server_without_oauth_is_not_taken_for_one():
    with http_server() as plain:
        assert oauth.probe(plain["url"], policy=LOOPBACK_OK) is None


def test_connect_registers_the_site_runs_pkce_and_stores_the_tokens_encrypted(owner, team, docs):
    server = oauth_server(docs["url"], team)
    client = signed_in(owner)
    settings_page = client.get(reverse("provider_settings")).content.decode()
    assert 'aria-label="Connect Docs"' in settings_page

    done = connect(client, server, "alice@docs")

    assert done.status_code == 302 and done["Location"].endswith("#mcp-connections")
    assert docs["auth"].log == [
        "register:OpenWorker",
        "authorize:S256:True",
        "consent:alice@docs",
        "grant:authorization_code",
    ]
    row = McpConnection.objects.get(user=owner, server=server)
    access, refresh = docs["auth"].issued
    assert row.access_token() == access and row.refresh_token() == refresh
    assert access not in row.access_encrypted and refresh not in row.refresh_encrypted
    assert row.expires_at is not None and row.scope == "docs:read"
    server.refresh_from_db()
    # The first connection lists the server's tools (with that user's token).
    assert {t["name"] for t in server.tools_cache} == {"whoami", "search"}
    assert client.session.get(PENDING_KEY) == {}
    page = client.get(reverse("provider_settings")).content.decode()
    assert "Docs is connected (2 tools)." in page
    assert 'aria-label="Disconnect Docs"' in page

    # A second user reuses the site's registration: no second client is registered.
    connect(
        signed_in_teammate := signed_in(team.user_set.exclude(pk=owner.pk).get()),
        server,
        "bob@docs",
    )
    assert docs["auth"].log.count("register:OpenWorker") == 1
    assert signed_in_teammate.get(reverse("provider_settings")).status_code == 200


def test_a_callback_whose_state_does_not_match_is_refused(owner, team, docs):
    server = oauth_server(docs["url"], team)
    client = signed_in(owner)
    start = client.get(reverse("mcp_connect", args=[server.pk]))
    callback = urlsplit(consent_at_the_authorization_server(start["Location"], "alice@docs"))
    forged = re.sub(r"state=[^&]+", "state=forged", callback.query)
    response = client.get(f"{callback.path}?{forged}", follow=True)
    assert "expired or was not started here" in response.content.decode()
    assert not McpConnection.objects.exists()
    assert "grant:authorization_code" not in docs["auth"].log


def test_a_user_outside_the_servers_teams_cannot_connect_it(owner, docs):
    server = McpServer.objects.create(name="docs", url=docs["url"], oauth=True)
    response = signed_in(owner).get(reverse("mcp_connect", args=[server.pk]), follow=True)
    assert "You can&#x27;t connect that MCP server." in response.content.decode()
    assert docs["auth"].log == []


async def _run(user, fake, server, tool: str, args: dict) -> list[dict]:
    fake.push(Reply(tool_call(f"docs__{tool}", args)), Reply(text("Done.")))
    session = await session_using(user, fake, server)
    return await ask(user, session)


async def test_each_users_calls_carry_their_own_token(owner, teammate, team, docs, fake):
    server = await sync_to_async(oauth_server)(docs["url"], team, default_policy="allow")
    await sync_to_async(connect_as)(owner, server, "alice@docs")
    await sync_to_async(connect_as)(teammate, server, "bob@docs")
    await server.arefresh_from_db()

    await _run(owner, fake, server, "whoami", {})
    assert result_text(tool_result(fake)) == "account=alice@docs"
    await _run(teammate, fake, server, "whoami", {})
    assert result_text(tool_result(fake)) == "account=bob@docs"
    outcomes = [c.outcome async for c in McpCall.objects.order_by("started_at")]
    assert outcomes == ["ok", "ok"]


async def test_a_call_over_http_sse_carries_the_users_token(owner, team, fake):
    with oauth_mcp_server(transport="sse") as docs:
        server = await sync_to_async(oauth_server)(
            docs["url"], team, default_policy="allow", transport="sse"
        )
        await sync_to_async(connect_as)(owner, server, "alice@docs")
        await server.arefresh_from_db()
        assert {t["name"] for t in server.tools_cache} == {"whoami", "search"}
        docs["auth"].expire_access_tokens()  # and the renewal works on this transport too

        await _run(owner, fake, server, "whoami", {})

        assert result_text(tool_result(fake)) == "account=alice@docs"
        assert "grant:refresh_token" in docs["auth"].log


async def test_a_user_who_has_not_connected_is_told_where_to_connect(
    owner, teammate, team, docs, fake
):
    server = await sync_to_async(oauth_server)(docs["url"], team, default_policy="allow")
    await sync_to_async(connect_as)(owner, server, "alice@docs")  # fills the tools
    await server.arefresh_from_db()
    grants = docs["auth"].log.count("grant:authorization_code")

    events = await _run(teammate, fake, server, "whoami", {})

    assert events[-1]["status"] == "completed"
    said = result_text(tool_result(fake))
    assert "have not connected it yet" in said
    assert "connect Docs in Settings (/settings/#mcp-connections)" in said
    shown = next(
        e["message"] for e in events if e["type"] == "message" and e["message"]["role"] == "tool"
    )
    assert shown["is_error"] is True and "Settings" in json.dumps(shown["content"])
    call = await McpCall.objects.aget(user=teammate)
    assert (call.outcome, call.detail) == ("error", "not connected")
    # Nothing was sent on the teammate's behalf, with anyone's token.
    assert docs["auth"].log.count("grant:authorization_code") == grants


async def test_an_access_token_about_to_expire_is_refreshed_before_the_call(owner, team, fake):
    # Five seconds to live is inside the refresh margin from the start: the first call
    # refreshes before it goes (no waiting, no clock in the assertion).
    with oauth_mcp_server(access_ttl=5) as docs:
        server = await sync_to_async(oauth_server)(docs["url"], team, default_policy="allow")
        await sync_to_async(connect_as)(owner, server, "alice@docs")
        await server.arefresh_from_db()
        before = await McpConnection.objects.aget(user=owner)
        refreshes = docs["auth"].log.count("grant:refresh_token")

        await _run(owner, fake, server, "whoami", {})

        assert result_text(tool_result(fake)) == "account=alice@docs"
        assert docs["auth"].log.count("grant:refresh_token") > refreshes
        after = await McpConnection.objects.aget(user=owner)
        assert after.refreshed_at is not None
        assert after.access_token() != before.access_token()
        assert after.access_token() == docs["auth"].issued[-2]


async def test_an_access_token_the_server_ends_early_is_refreshed_on_the_401(
    owner, team, docs, fake
):
    server = await sync_to_async(oauth_server)(docs["url"], team, default_policy="allow")
    await sync_to_async(connect_as)(owner, server, "alice@docs")
    await server.arefresh_from_db()
    docs["auth"].expire_access_tokens()

    await _run(owner, fake, server, "search", {"query": "setup"})

    assert "Found 1 page for 'setup' in alice@docs's docs" in result_text(tool_result(fake))
    assert docs["auth"].log[-1] == "grant:refresh_token"
    assert (await McpCall.objects.aget()).outcome == "ok"


async def test_a_grant_revoked_at_the_server_asks_the_user_to_connect_again(
    owner, team, docs, fake
):
    server = await sync_to_async(oauth_server)(docs["url"], team, default_policy="allow")
    await sync_to_async(connect_as)(owner, server, "alice@docs")
    await server.arefresh_from_db()
    docs["auth"].revoke_everything_of("alice@docs")

    events = await _run(owner, fake, server, "whoami", {})

    assert events[-1]["status"] == "completed"
    said = result_text(tool_result(fake))
    assert "connection to Docs has ended" in said and "/settings/#mcp-connections" in said
    assert not await McpConnection.objects.filter(user=owner).aexists()


def test_disconnect_revokes_the_grant_at_the_server_and_forgets_the_tokens(owner, team, docs):
    server = oauth_server(docs["url"], team)
    client = signed_in(owner)
    connect(client, server, "alice@docs")
    access, _ = docs["auth"].issued

    page = client.post(reverse("mcp_disconnect", args=[server.pk]), follow=True)

    assert "Docs is disconnected." in page.content.decode()
    assert 'aria-label="Connect Docs"' in page.content.decode()
    assert not McpConnection.objects.exists()
    assert "revoke:alice@docs" in docs["auth"].log
    assert docs["auth"].access == {} and docs["auth"].refresh == {}
    with httpx.Client() as http:  # the token no longer opens the server
        refused = http.post(
            docs["url"],
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            headers={"Authorization": f"Bearer {access}", "Accept": "application/json"},
        )
    assert refused.status_code == 401


def test_a_user_cannot_disconnect_someone_elses_connection(owner, teammate, team, docs):
    server = oauth_server(docs["url"], team)
    connect(signed_in(owner), server, "alice@docs")
    signed_in(teammate).post(reverse("mcp_disconnect", args=[server.pk]))
    assert McpConnection.objects.filter(user=owner).exists()


def test_an_admin_revokes_a_users_connection(owner, team, docs, admin_client):
    server = oauth_server(docs["url"], team)
    connect(signed_in(owner), server, "alice@docs")
    row = McpConnection.objects.get()
    listing = admin_client.get("/admin/mcp/mcpconnection/").content.decode()
    assert "alice on Docs" in listing or ">alice<" in listing
    assert docs["auth"].issued[0] not in listing

    response = admin_client.post(
        "/admin/mcp/mcpconnection/",
        {"action": "revoke", "_selected_action": [row.pk]},
        follow=True,
    )

    assert "Revoked 1 connection(s)." in response.content.decode()
    assert not McpConnection.objects.exists()
    assert "revoke:alice@docs" in docs["auth"].log
    detail = admin_client.get(f"/admin/mcp/mcpserver/{server.pk}/change/").content.decode()
    assert docs["auth"].issued[0] not in detail


def test_deleting_the_server_in_the_admin_revokes_its_users_grants(
    owner, teammate, team, docs, admin_client
):
    server = oauth_server(docs["url"], team)
    connect(signed_in(owner), server, "alice@docs")
    connect(signed_in(teammate), server, "bob@docs")

    admin_client.post(f"/admin/mcp/mcpserver/{server.pk}/delete/", {"post": "yes"})

    assert not McpServer.objects.exists() and not McpConnection.objects.exists()
    assert {"revoke:alice@docs", "revoke:bob@docs"} <= set(docs["auth"].log)
    assert docs["auth"].refresh == {}


def test_the_key_rotation_covers_the_tokens(owner, team, docs):
    server = oauth_server(docs["url"], team)
    connect(signed_in(owner), server, "alice@docs")
    before = McpConnection.objects.get().access_encrypted
    call_command("rotate_mcp_keys", stdout=open("/dev/null", "w"))  # noqa: SIM115
    row = McpConnection.objects.get()
    assert row.access_encrypted != before
    assert row.access_token() == docs["auth"].issued[0]


def _database_text() -> str:
    """Every row of every table, as text: what a database dump would show."""
    chunks = []
    with db_connection.cursor() as cursor:
        for table in db_connection.introspection.table_names(cursor):
            cursor.execute(f'SELECT * FROM "{table}"')  # noqa: S608 - names from introspection
            chunks.extend(repr(row) for row in cursor.fetchall())
    return "\n".join(chunks)


async def test_no_token_reaches_logs_frames_exports_or_the_database(owner, team, fake, caplog):
    caplog.set_level(logging.DEBUG)
    with oauth_mcp_server(access_ttl=5) as docs:  # a refresh happens too
        server = await sync_to_async(oauth_server)(docs["url"], team, default_policy="allow")
        await sync_to_async(connect_as)(owner, server, "alice@docs")
        await server.arefresh_from_db()
        events = await _run(owner, fake, server, "whoami", {})
        issued = list(docs["auth"].issued)
        client_secrets = [c.client_secret for c in docs["auth"].clients.values()]
        session = await Session.objects.alatest("created_at")
        export = await sync_to_async(lambda: "".join(session_json_chunks(session)))()
        database = await sync_to_async(_database_text)()
        # The session's tool call did run with the refreshed token.
        assert result_text(tool_result(fake)) == "account=alice@docs"
    assert len(issued) >= 4 and all(client_secrets)
    frames = json.dumps(events)
    logs = "\n".join(f"{r.getMessage()} {r.args!r}" for r in caplog.records)
    requests_to_model = json.dumps([r.body for r in fake.requests])
    for secret in [*issued, *client_secrets]:
        assert secret not in logs
        assert secret not in frames
        assert secret not in export
        assert secret not in database
        assert secret not in requests_to_model


def test_discovery_for_an_oauth_server_needs_a_connection(owner, team, docs):
    server = oauth_server(docs["url"], team)
    tools, error = discover_and_store(server, user_id=owner.pk)
    assert tools is None and "connect yours in Settings" in error


def test_two_renewals_of_one_stale_token_spend_the_refresh_token_once(owner, team, docs):
    # Two calls of one user found the same token refused: the second renewal, under the
    # row lock, reuses what the first got (this AS rotates refresh tokens: a second
    # refresh with the spent one would fail and end the connection).
    server = oauth_server(docs["url"], team)
    connect(signed_in(owner), server, "alice@docs")
    stale = mcp_connection_token(user_id=owner.pk, server_id=server.pk)
    docs["auth"].expire_access_tokens()

    first = mcp_connection_refresh(connection_id=stale.connection_id, stale_access=stale.access)
    second = mcp_connection_refresh(connection_id=stale.connection_id, stale_access=stale.access)

    assert first is not None and second is not None
    assert first.access == second.access != stale.access
    assert docs["auth"].log.count("grant:refresh_token") == 1
    assert McpConnection.objects.filter(user=owner).exists()


def test_the_tools_page_says_which_servers_need_the_users_own_account(owner, team, docs):
    server = oauth_server(docs["url"], team)
    session = Session.objects.create(owner=owner, model="anthropic:claude-test-1")
    client = signed_in(owner)
    url = reverse("session_mcp_servers", args=[session.pk])
    assert "connect it in Settings" in client.get(url).content.decode()
    connect(client, server, "alice@docs")
    assert "connect it in Settings" not in client.get(url).content.decode()


async def test_a_registration_the_server_forgot_is_made_again_at_the_next_connect(
    owner, team, docs, fake
):
    server = await sync_to_async(oauth_server)(docs["url"], team, default_policy="allow")
    await sync_to_async(connect_as)(owner, server, "alice@docs")
    await server.arefresh_from_db()
    docs["auth"].clients.clear()  # the AS lost (or an operator deleted) this site's client
    docs["auth"].expire_access_tokens()

    await _run(owner, fake, server, "whoami", {})

    assert "connection to Docs has ended" in result_text(tool_result(fake))
    await server.arefresh_from_db()
    assert server.oauth_client_encrypted == ""
    await sync_to_async(connect_as)(owner, server, "alice@docs")
    assert docs["auth"].log.count("register:OpenWorker") == 2
    assert await McpConnection.objects.filter(user=owner).aexists()


def test_without_dynamic_registration_the_admins_client_id_is_used(owner, team, admin_client):
    with oauth_mcp_server(registration=False) as docs:
        server = oauth_server(docs["url"], team)
        refused = signed_in(owner).get(reverse("mcp_connect", args=[server.pk]), follow=True)
        assert "an admin has to enter a client ID" in refused.content.decode()

        docs["auth"].clients["openworker-site"] = OAuthClientInformationFull(
            client_id="openworker-site",
            client_name="OpenWorker",
            client_secret="s3cret-entered-by-the-admin",
            redirect_uris=["http://testserver/settings/connections/callback"],
            token_endpoint_auth_method="client_secret_post",
            scope="docs:read",
        )
        form = add_form(
            url=docs["url"],
            teams=[team.pk],
            oauth="on",
            oauth_client_id="openworker-site",
            oauth_client_secret="s3cret-entered-by-the-admin",
        )
        admin_client.post(f"/admin/mcp/mcpserver/{server.pk}/change/", form)
        server.refresh_from_db()
        assert server.oauth_client_id == "openworker-site"
        assert "s3cret" not in server.oauth_client_secret_encrypted

        connect(signed_in(owner), server, "alice@docs")

        assert not any(entry.startswith("register:") for entry in docs["auth"].log)
        assert "grant:authorization_code" in docs["auth"].log
        assert McpConnection.objects.filter(user=owner, server=server).exists()


async def test_a_users_pooled_session_ends_with_their_connection(owner, team, docs, fake):
    server = await sync_to_async(oauth_server)(docs["url"], team, default_policy="allow")
    await sync_to_async(connect_as)(owner, server, "alice@docs")
    await server.arefresh_from_db()
    await _run(owner, fake, server, "whoami", {})  # opens the pooled session
    spec, credentials = await sync_to_async(mcp_tools.spec_for_user)(server, owner.pk)
    key = mcp_pool.PoolKey(str(server.pk), f"user:{owner.pk}")
    pooled = {key: mcp_tools.pool_fingerprint(spec, credentials)}
    assert await sync_to_async(mcp_tools._pooled_current)(pooled) == {key}

    await sync_to_async(
        lambda: signed_in(owner).post(reverse("mcp_disconnect", args=[server.pk]))
    )()

    # The sweep closes it (its token leaves memory), and the next call is not even tried.
    assert await sync_to_async(mcp_tools._pooled_current)(pooled) == set()
    await _run(owner, fake, server, "whoami", {})
    assert "have not connected it yet" in result_text(tool_result(fake))
