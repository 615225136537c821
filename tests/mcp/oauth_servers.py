"""A real OAuth-protected MCP server and its own authorization server, both built with the
SDK and served on loopback (uvicorn threads), as the MCP authorization spec lays them out:

- the authorization server (`mcp.server.auth.routes.create_auth_routes` over an in-memory
  `OAuthAuthorizationServerProvider`): RFC 8414 metadata, RFC 7591 registration, the
  authorization endpoint (PKCE S256 checked by the SDK's token handler), token and
  refresh grants, RFC 7009 revocation. `/authorize` sends the browser to a consent page of
  its own where the person names their account at the AS and presses Allow;
- the resource server (FastMCP with a `TokenVerifier` and `AuthSettings`): 401 with
  `WWW-Authenticate: Bearer resource_metadata=…` without a valid token, RFC 9728
  protected-resource metadata, and a `whoami` tool that answers with the token's account.

`AuthServer.log` is what the AS saw (grants, registrations, revocations) so tests can prove
which step happened; `issued` is every token it handed out, so they can look for leaks.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import anyio
import uvicorn
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.routes import create_auth_routes
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.fastmcp import FastMCP
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from tests.mcp.servers import free_port

SCOPE = "docs:read"
# A code lives this long at the AS (RFC 6749 §4.1.2 recommends at most 10 minutes).
CODE_TTL_SECONDS = 300


@dataclass
class AuthServer:
    """The in-memory `OAuthAuthorizationServerProvider` (the SDK's protocol)."""

    access_ttl: int = 3600
    # Seconds the refresh grant takes: widens the window two concurrent refreshes race in.
    refresh_delay: float = 0.0
    clients: dict[str, OAuthClientInformationFull] = field(default_factory=dict)
    pending: dict[str, tuple[str, AuthorizationParams]] = field(default_factory=dict)
    codes: dict[str, AuthorizationCode] = field(default_factory=dict)
    access: dict[str, AccessToken] = field(default_factory=dict)
    refresh: dict[str, RefreshToken] = field(default_factory=dict)
    issued: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    # --- the SDK's provider interface ------------------------------------------------------

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        assert client_info.client_id
        self.clients[client_info.client_id] = client_info
        self.log.append(f"register:{client_info.client_name}")

    async def authorize(
        self, client: OAuthClientInformationFull, params: AuthorizationParams
    ) -> str:
        ticket = secrets.token_urlsafe(16)
        self.pending[ticket] = (str(client.client_id), params)
        self.log.append(f"authorize:S256:{bool(params.code_challenge)}")
        return f"{self.url}/consent?{urlencode({'ticket': ticket})}"

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> AuthorizationCode | None:
        code = self.codes.get(authorization_code)
        return code if code is not None and code.client_id == client.client_id else None

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        self.codes.pop(authorization_code.code, None)
        self.log.append("grant:authorization_code")
        return self._issue(
            str(client.client_id),
            authorization_code.scopes,
            authorization_code.subject,
            authorization_code.resource,
        )

    async def load_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: str
    ) -> RefreshToken | None:
        token = self.refresh.get(refresh_token)
        return token if token is not None and token.client_id == client.client_id else None

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        if self.refresh_delay:
            await anyio.sleep(self.refresh_delay)
        if self.refresh.pop(refresh_token.token, None) is None:
            raise TokenError("invalid_grant", "refresh token already used")
        self.log.append("grant:refresh_token")
        # Rotated, as the SDK's interface recommends: the old refresh token is spent.
        return self._issue(
            str(client.client_id),
            scopes or refresh_token.scopes,
            refresh_token.subject,
            refresh_token.resource,
        )

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        if found is None or (found.expires_at is not None and found.expires_at < time.time()):
            return None
        return found

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        subject = token.subject
        self.log.append(f"revoke:{subject}")
        # Both halves of the grant go, whichever was presented (the interface asks so).
        for store in (self.access, self.refresh):
            for key in [k for k, v in store.items() if v.subject == subject]:
                store.pop(key)

    # --- helpers for tests -----------------------------------------------------------------

    def _issue(
        self, client_id: str, scopes: list[str], subject: str | None, resource: str | None
    ) -> OAuthToken:
        access = f"at_{secrets.token_urlsafe(24)}"
        refresh = f"rt_{secrets.token_urlsafe(24)}"
        self.access[access] = AccessToken(
            token=access,
            client_id=client_id,
            scopes=scopes,
            expires_at=int(time.time()) + self.access_ttl,
            subject=subject,
            resource=resource,
        )
        self.refresh[refresh] = RefreshToken(
            token=refresh, client_id=client_id, scopes=scopes, subject=subject, resource=resource
        )
        self.issued += [access, refresh]
        return OAuthToken(
            access_token=access,
            refresh_token=refresh,
            expires_in=self.access_ttl,
            scope=" ".join(scopes),
        )

    def expire_access_tokens(self) -> None:
        """The AS ends every access token now (as a short lifetime would) without the
        client being told: its next call gets a 401 and must refresh."""
        self.access.clear()

    def revoke_everything_of(self, subject: str) -> None:
        """The account's owner revoked the grant at the AS itself."""
        for store in (self.access, self.refresh):
            for key in [k for k, v in store.items() if v.subject == subject]:
                store.pop(key)

    # --- the consent page ------------------------------------------------------------------

    async def consent(self, request: Request) -> Response:
        if request.method == "GET":
            ticket = request.query_params.get("ticket", "")
            if ticket not in self.pending:
                return HTMLResponse("<p>Unknown request.</p>", status_code=400)
            client_id, _ = self.pending[ticket]
            name = self.clients[client_id].client_name or client_id
            return HTMLResponse(
                "<!doctype html><title>Docs · sign in</title><main>"
                f"<h1>Allow {name} to use your Docs account?</h1>"
                '<form method="post"><input type="hidden" name="ticket" value="'
                f'{ticket}"><label for="account">Docs account</label> '
                '<input id="account" name="account" required> '
                '<button type="submit">Allow</button></form></main>'
            )
        form = await request.form()
        ticket, account = str(form.get("ticket", "")), str(form.get("account", ""))
        found = self.pending.pop(ticket, None)
        if found is None or not account:
            return HTMLResponse("<p>Unknown request.</p>", status_code=400)
        client_id, params = found
        code = f"code_{secrets.token_urlsafe(24)}"
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [SCOPE],
            expires_at=time.time() + CODE_TTL_SECONDS,
            client_id=client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
            subject=account,
        )
        self.log.append(f"consent:{account}")
        return RedirectResponse(
            construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state),
            status_code=302,
        )


class _Verifier:
    """The resource server's `TokenVerifier`: asks the AS's store (same process)."""

    def __init__(self, auth: AuthServer) -> None:
        self.auth = auth

    async def verify_token(self, token: str) -> AccessToken | None:
        return await self.auth.load_access_token(token)


def build_resource_server(auth: AuthServer, issuer: str, resource: str) -> FastMCP:
    mcp = FastMCP(
        "docs-oauth",
        host="127.0.0.1",
        log_level="WARNING",
        token_verifier=_Verifier(auth),
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(issuer),
            resource_server_url=AnyHttpUrl(resource),
            required_scopes=[SCOPE],
            validate_token_resource=True,
        ),
    )

    @mcp.tool(description="Which Docs account this call runs as.")
    def whoami() -> str:
        token = get_access_token()
        return f"account={token.subject if token else ''}"

    @mcp.tool(description="Search the docs.")
    def search(query: str) -> str:
        token = get_access_token()
        return f"Found 1 page for {query!r} in {token.subject if token else '?'}'s docs: Setup."

    return mcp


def _serve(app: Any, port: int) -> tuple[uvicorn.Server, threading.Thread]:
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("an OAuth test server did not start")
        time.sleep(0.02)
    return server, thread


@contextmanager
def oauth_mcp_server(
    access_ttl: int = 3600, transport: str = "streamable_http", registration: bool = True
) -> Iterator[dict[str, Any]]:
    """Yields {"url" (the MCP endpoint), "issuer", "auth" (the `AuthServer`)}; the
    resource server speaks Streamable HTTP or (`transport="sse"`) HTTP+SSE;
    `registration=False`: an AS without RFC 7591 (clients are entered by hand)."""
    as_port, rs_port = free_port(), free_port()
    issuer = f"http://127.0.0.1:{as_port}"
    resource = f"http://127.0.0.1:{rs_port}/{'sse' if transport == 'sse' else 'mcp'}"
    auth = AuthServer(access_ttl=access_ttl, url=issuer)
    as_app = Starlette(
        routes=[
            *create_auth_routes(
                auth,
                AnyHttpUrl(issuer),
                client_registration_options=ClientRegistrationOptions(
                    enabled=registration, valid_scopes=[SCOPE], default_scopes=[SCOPE]
                ),
                revocation_options=RevocationOptions(enabled=True),
            ),
            Route("/consent", auth.consent, methods=["GET", "POST"]),
        ]
    )
    mcp = build_resource_server(auth, issuer, resource)
    rs_app = mcp.sse_app() if transport == "sse" else mcp.streamable_http_app()
    running = [_serve(as_app, as_port), _serve(rs_app, rs_port)]
    try:
        yield {"url": resource, "issuer": issuer, "auth": auth}
    finally:
        for server, thread in running:
            server.should_exit = True
            thread.join(10)
