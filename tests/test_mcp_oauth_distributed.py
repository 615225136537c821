"""Two workers' calls of one user renewing one stale token at once, on PostgreSQL: the
row lock makes the second wait and reuse what the first got, so a rotating refresh
token is spent once and the connection survives (without the lock the second refresh
presents the spent token, the AS refuses it, and the user would have to connect again)."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth.models import Group
from django.db import connections

from sessions.mcp.connections import mcp_connection_refresh, mcp_connection_token
from sessions.mcp.models import McpConnection
from tests.mcp.oauth_servers import oauth_mcp_server
from tests.test_mcp_oauth import connect, oauth_server, signed_in

pytestmark = [pytest.mark.distributed, pytest.mark.django_db(transaction=True)]


def test_concurrent_renewals_of_one_token_spend_the_refresh_token_once(require_distributed, owner):
    team = Group.objects.create(name="support")
    owner.groups.add(team)
    with oauth_mcp_server() as docs:
        server = oauth_server(docs["url"], team)
        connect(signed_in(owner), server, "alice@docs")
        stale = mcp_connection_token(user_id=owner.pk, server_id=server.pk)
        docs["auth"].expire_access_tokens()
        docs["auth"].refresh_delay = 0.5
        start = threading.Barrier(2)
        got: list[object] = []

        def renew() -> None:
            start.wait()
            try:
                got.append(
                    mcp_connection_refresh(
                        connection_id=stale.connection_id, stale_access=stale.access
                    )
                )
            finally:
                connections.close_all()

        threads = [threading.Thread(target=renew) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)

        assert len(got) == 2 and all(token is not None for token in got)
        assert got[0].access == got[1].access != stale.access
        assert docs["auth"].log.count("grant:refresh_token") == 1
        assert McpConnection.objects.filter(user=owner).exists()
