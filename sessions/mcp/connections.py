"""Users' OAuth connections to MCP servers: Connect (start and finish the authorization
code flow), the token a call uses, refresh, and revocation by the user or an admin.

The flow's state between Connect and the callback lives in the user's Django session
(`PENDING_KEY`), the PKCE verifier encrypted; tokens live in `McpConnection`, encrypted.
Every failure a person sees is `ConnectError` with a plain message: never a token, never
an AS's raw error body.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
from django.db import transaction
from django.utils import timezone
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from providers.edge import crypto
from providers.errors import ProviderError
from sessions.mcp import oauth
from sessions.mcp.models import McpConnection, McpServer
from sessions.mcp.services import mcp_servers_for_user, outbound_policy

logger = logging.getLogger(__name__)

# The Django session key that carries flows from Connect to the callback, by `state`.
PENDING_KEY = "mcp_oauth_pending"
# Flows one browser session may have under way at once (two tabs, two servers); the
# oldest is dropped past this, so the session cannot grow without end.
MAX_PENDING_FLOWS = 5
# The name this site registers under; the AS shows it on its consent page.
CLIENT_NAME = "OpenWorker"


class ConnectError(Exception):
    """Connecting failed; the message is for the user."""


@dataclass(frozen=True)
class ConnectionToken:
    """What one call needs: the connection, its access token (a secret: `repr=False`),
    and when the token expires (epoch seconds; None when the AS did not say)."""

    connection_id: int
    access: str = field(repr=False)
    expires_at: float | None


# --- discovery and the client registration -------------------------------------------------


def mcp_oauth_detect(*, server: McpServer) -> bool:
    """Whether `server` asks for OAuth (a 401 with a Bearer challenge); marks it so, with
    the challenge's `resource_metadata` URL, when it does."""
    try:
        found = oauth.probe(server.url, policy=outbound_policy())
    except (httpx.HTTPError, ProviderError):
        return False
    if found is None:
        return False
    server.oauth = True
    server.oauth_resource_metadata_url = found
    McpServer.objects.filter(pk=server.pk).update(oauth=True, oauth_resource_metadata_url=found)
    return True


def _discover(server: McpServer) -> oauth.AuthServerInfo:
    try:
        info = oauth.discover(
            server.url,
            policy=outbound_policy(),
            resource_metadata_url=server.oauth_resource_metadata_url or None,
        )
    except oauth.OAuthError as exc:
        raise ConnectError(f"{server.label}: {exc}.") from None
    except (httpx.HTTPError, ProviderError) as exc:
        raise ConnectError(
            f"{server.label}'s authorization server could not be reached ({type(exc).__name__})."
        ) from None
    server.oauth_discovery = info.to_json()
    McpServer.objects.filter(pk=server.pk).update(oauth_discovery=server.oauth_discovery)
    return info


def _stored_client(server: McpServer) -> OAuthClientInformationFull | None:
    if server.oauth_client_id:
        secret = server.oauth_client_secret()
        return OAuthClientInformationFull(
            client_id=server.oauth_client_id,
            client_secret=secret or None,
            redirect_uris=None,
            token_endpoint_auth_method=oauth.CLIENT_SECRET_POST if secret else "none",
        )
    if not server.oauth_client_encrypted:
        return None
    return OAuthClientInformationFull.model_validate(
        json.loads(crypto.decrypt(server.oauth_client_encrypted))
    )


def _client_for(
    server: McpServer, info: oauth.AuthServerInfo, redirect_uri: str
) -> OAuthClientInformationFull:
    """The admin's client ID, else this site's registration for this redirect URI (made
    now, RFC 7591, when there is none or the site's address changed)."""
    client = _stored_client(server)
    if client is not None and (
        server.oauth_client_id or redirect_uri in {str(u) for u in client.redirect_uris or []}
    ):
        return client
    try:
        client = oauth.register(
            info, redirect_uri=redirect_uri, client_name=CLIENT_NAME, policy=outbound_policy()
        )
    except oauth.OAuthError as exc:
        raise ConnectError(f"{server.label}: {exc}.") from None
    except (httpx.HTTPError, ProviderError) as exc:
        raise ConnectError(
            f"{server.label}'s authorization server could not be reached ({type(exc).__name__})."
        ) from None
    server.oauth_client_encrypted = crypto.encrypt(client.model_dump_json(exclude_none=True))
    McpServer.objects.filter(pk=server.pk).update(
        oauth_client_encrypted=server.oauth_client_encrypted
    )
    return client


def _forget_registration(server: McpServer) -> None:
    """The AS refused this site's registered client: the next Connect registers anew (an
    admin's client ID is the admin's to fix)."""
    if server.oauth_client_encrypted and not server.oauth_client_id:
        server.oauth_client_encrypted = ""
        McpServer.objects.filter(pk=server.pk).update(oauth_client_encrypted="")


def _server_for(user: Any, server_id: int) -> McpServer:
    server = mcp_servers_for_user(user=user).filter(pk=server_id, oauth=True).first()
    if server is None:
        raise ConnectError("You can't connect that MCP server.")
    return server


# --- Connect ---------------------------------------------------------------------------------


def mcp_connect_start(
    *, user: Any, server_id: int, redirect_uri: str
) -> tuple[str, dict[str, Any]]:
    """`(authorization URL, pending state for the user's session)`."""
    server = _server_for(user, server_id)
    info = _discover(server)
    client = _client_for(server, info, redirect_uri)
    request = oauth.authorization_request(
        info, client, redirect_uri=redirect_uri, scope=server.oauth_scopes or None
    )
    pending = {
        "server": server.pk,
        "state": request.state,
        "verifier": crypto.encrypt(request.verifier),
        "redirect_uri": redirect_uri,
    }
    return request.url, pending


def pending_add(flows: dict[str, Any] | None, pending: dict[str, Any]) -> dict[str, Any]:
    """The session's flows with `pending` added (keyed by its `state`)."""
    kept = dict(flows or {})
    kept[pending["state"]] = pending
    return dict(list(kept.items())[-MAX_PENDING_FLOWS:])


def pending_take(
    flows: dict[str, Any] | None, state: str
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """`(the flow this callback's state started, the others)`; each is used once."""
    rest = dict(flows or {})
    return rest.pop(state or "", None), rest


def _expiry(token: OAuthToken) -> Any:
    if token.expires_in is None:
        return None
    return timezone.now() + timedelta(seconds=token.expires_in)


def mcp_connect_finish(
    *,
    user: Any,
    pending: dict[str, Any] | None,
    state: str,
    code: str,
    error: str = "",
) -> McpServer:
    """Exchange the callback's code (PKCE-proved) for tokens and store them."""
    if not pending or not secrets.compare_digest(str(pending.get("state", "")), state or "-"):
        raise ConnectError(
            "That sign-in link has expired or was not started here. Try Connect again."
        )
    server = _server_for(user, int(pending["server"]))
    if error:
        messages = {"access_denied": "You declined access at the authorization server."}
        raise ConnectError(messages.get(error, f"{server.label} did not connect ({error[:60]})."))
    if not code:
        raise ConnectError(f"{server.label} sent no authorization code. Try Connect again.")
    info = oauth.AuthServerInfo.from_json(server.oauth_discovery)
    client = _stored_client(server)
    if client is None:
        raise ConnectError(f"{server.label}: the client registration is gone. Try Connect again.")
    try:
        token = oauth.exchange_code(
            info,
            client,
            code=code,
            verifier=crypto.decrypt(pending["verifier"]),
            redirect_uri=pending["redirect_uri"],
            policy=outbound_policy(),
        )
    except oauth.ClientRefused as exc:
        _forget_registration(server)
        raise ConnectError(f"{server.label}: {exc}. Try Connect again.") from None
    except oauth.OAuthError as exc:
        raise ConnectError(f"{server.label}: {exc}.") from None
    except (httpx.HTTPError, ProviderError) as exc:
        raise ConnectError(
            f"{server.label}'s authorization server could not be reached ({type(exc).__name__})."
        ) from None
    with transaction.atomic():
        connection = McpConnection.objects.select_for_update().filter(
            user=user, server=server
        ).first() or McpConnection(user=user, server=server)
        connection.set_tokens(access=token.access_token, refresh=token.refresh_token or "")
        connection.expires_at = _expiry(token)
        connection.scope = (token.scope or "")[:500]
        connection.save()
    return server


# --- the token a call uses, and refresh -----------------------------------------------------


def mcp_connection_token(*, user_id: int | None, server_id: int) -> ConnectionToken | None:
    """The user's access token for the server, or None when they have not connected."""
    if user_id is None:
        return None
    connection = McpConnection.objects.filter(user_id=user_id, server_id=server_id).first()
    if connection is None:
        return None
    try:
        access = connection.access_token()
    except crypto.DecryptionError:
        return None
    expires = connection.expires_at.timestamp() if connection.expires_at else None
    return ConnectionToken(connection.pk, access, expires)


def mcp_connection_refresh(*, connection_id: int, stale_access: str) -> ConnectionToken | None:
    """A fresh token for a connection whose `stale_access` expired or was refused.

    Under the row's lock: a concurrent call that refreshed first is reused (a rotating
    refresh token is spent once). None when the grant is gone (no refresh token, the AS
    refused it, the row was revoked): the connection is then deleted, so Settings shows
    Connect. A transient failure (AS down) raises, and the connection stays.
    """
    with transaction.atomic():
        connection = (
            McpConnection.objects.select_for_update()
            .select_related("server")
            .filter(pk=connection_id)
            .first()
        )
        if connection is None:
            return None
        current = connection.access_token()
        if current != stale_access:
            expires = connection.expires_at.timestamp() if connection.expires_at else None
            return ConnectionToken(connection.pk, current, expires)
        refresh_token = connection.refresh_token()
        server = connection.server
        client = _stored_client(server)
        if not refresh_token or client is None or not server.oauth_discovery:
            connection.delete()
            return None
        try:
            token = oauth.refresh(
                oauth.AuthServerInfo.from_json(server.oauth_discovery),
                client,
                refresh_token=refresh_token,
                policy=outbound_policy(),
            )
        except oauth.GrantRefused as exc:
            logger.info("MCP connection %s: the refresh was refused; removed", connection_id)
            if isinstance(exc, oauth.ClientRefused):
                _forget_registration(server)
            connection.delete()
            return None
        connection.set_tokens(access=token.access_token, refresh=token.refresh_token)
        connection.expires_at = _expiry(token)
        connection.refreshed_at = timezone.now()
        connection.save(
            update_fields=["access_encrypted", "refresh_encrypted", "expires_at", "refreshed_at"]
        )
    expires = connection.expires_at.timestamp() if connection.expires_at else None
    return ConnectionToken(connection.pk, token.access_token, expires)


# --- revocation --------------------------------------------------------------------------------


def mcp_connection_revoke(*, connection: McpConnection) -> bool:
    """End a connection: revoke the grant at the AS where it offers RFC 7009 (best effort,
    refresh token first, which ends the whole grant at most servers), then forget the
    tokens here whatever it answered. True when the AS took the revocation."""
    server = connection.server
    revoked = False
    client = _stored_client(server) if server.oauth_discovery else None
    if client is not None:
        info = oauth.AuthServerInfo.from_json(server.oauth_discovery)
        try:
            pairs = [
                (connection.refresh_token(), "refresh_token"),
                (connection.access_token(), "access_token"),
            ]
        except crypto.DecryptionError:
            pairs = []
        for token, hint in pairs:
            if token:
                revoked = (
                    oauth.revoke(info, client, token=token, hint=hint, policy=outbound_policy())
                    or revoked
                )
    connection.delete()
    return revoked


def mcp_connection_disconnect(*, user: Any, server_id: int) -> McpServer | None:
    """The user's Disconnect: their own connection only; the server, or None if none."""
    connection = (
        McpConnection.objects.select_related("server")
        .filter(user=user, server_id=server_id)
        .first()
    )
    if connection is None:
        return None
    mcp_connection_revoke(connection=connection)
    return connection.server


# --- Settings ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConnectionRow:
    server: McpServer
    connection: McpConnection | None


def mcp_connection_rows(*, user: Any) -> list[ConnectionRow]:
    """The OAuth servers the user may use, each with their connection (or None)."""
    servers = list(mcp_servers_for_user(user=user).filter(oauth=True))
    mine = {
        c.server_id: c
        for c in McpConnection.objects.filter(user=user, server__in=servers).only(
            "id", "server_id", "created_at", "expires_at", "scope", "refreshed_at"
        )
    }
    return [ConnectionRow(server, mine.get(server.pk)) for server in servers]


def mcp_servers_needing_connection(*, user: Any, servers: list[McpServer]) -> set[int]:
    """Which of `servers` are OAuth servers the user has not connected (their tools would
    only answer "connect first")."""
    oauth_ids = {s.pk for s in servers if s.oauth}
    if not oauth_ids:
        return set()
    connected = set(
        McpConnection.objects.filter(user=user, server_id__in=oauth_ids).values_list(
            "server_id", flat=True
        )
    )
    return oauth_ids - connected
