"""The MCP authorization spec's client side, for a web app: each step is one call that a
view or the runtime makes, since the authorization code flow spans two browser requests
(Connect, then the callback) and possibly two processes.

- `probe`: is the server OAuth-protected? (401 + `WWW-Authenticate: Bearer
  resource_metadata=…`, RFC 9728 §5.1);
- `discover`: protected-resource metadata (RFC 9728), then the authorization server's
  metadata (RFC 8414, with the OpenID fallbacks), its issuer checked;
- `register`: dynamic client registration (RFC 7591) where the AS offers it;
- `authorization_request` / `exchange_code`: authorization code with PKCE S256 and the
  RFC 8707 resource indicator; `refresh`; `revoke` (RFC 7009, best effort).

Why not the SDK's `OAuthClientProvider`: it runs the whole flow inside one httpx request
(it awaits a redirect handler and then a callback handler), which a Django view cannot do
across two requests, and it would start that interactive flow in a worker on any 401. The
SDK's helpers for the RFC details (discovery URL order, issuer check, PKCE, registration
request, scope selection) are used as they are, so the rules are written once.

Plain httpx, blocking, through the outbound guard: callers are views and the database
threads of the runtime. No Django models here; secrets are the caller's to encrypt.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
from mcp.client.auth.oauth2 import PKCEParameters
from mcp.client.auth.utils import (
    build_oauth_authorization_server_metadata_discovery_urls,
    build_protected_resource_metadata_discovery_urls,
    create_client_registration_request,
    extract_field_from_www_auth,
    get_client_metadata_scopes,
    validate_metadata_issuer,
)
from mcp.shared.auth import (
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthMetadata,
    OAuthToken,
    ProtectedResourceMetadata,
)
from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url
from mcp.types import LATEST_PROTOCOL_VERSION
from pydantic import ValidationError

from providers.outbound import GuardedTransport, OutboundPolicy

# Each metadata, registration or token request: an AS that is slower than this is down.
REQUEST_TIMEOUT_SECONDS = 10.0
# The body of a metadata or token response; anything bigger is not one.
MAX_RESPONSE_BYTES = 256 * 1024
# RFC 7591 token endpoint authentication methods (names, not secrets).
CLIENT_SECRET_POST = "client_secret_post"  # noqa: S105
CLIENT_SECRET_BASIC = "client_secret_basic"  # noqa: S105


class OAuthError(Exception):
    """A step failed; the message is for people (an admin or the user), never a secret."""


class GrantRefused(OAuthError):
    """The AS refused the grant itself (`invalid_grant`): revoked or expired, so the user
    has to connect again; anything else (the AS down) may pass."""


class ClientRefused(GrantRefused):
    """The AS no longer knows this site's client (`invalid_client`, `unauthorized_client`):
    its registration has to be made again, and every grant under it is gone."""


@dataclass(frozen=True)
class AuthServerInfo:
    """What discovery found: the resource (RFC 8707) and the AS's metadata, as JSON."""

    resource: str
    resource_metadata: dict[str, Any]
    metadata: dict[str, Any]

    @property
    def as_metadata(self) -> OAuthMetadata:
        return OAuthMetadata.model_validate(self.metadata)

    @property
    def scopes(self) -> str | None:
        prm = (
            ProtectedResourceMetadata.model_validate(self.resource_metadata)
            if self.resource_metadata
            else None
        )
        return get_client_metadata_scopes(None, prm, self.as_metadata)

    def to_json(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "resource_metadata": self.resource_metadata,
            "metadata": self.metadata,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AuthServerInfo:
        return cls(data["resource"], data.get("resource_metadata") or {}, data["metadata"])


@dataclass(frozen=True)
class AuthorizationRequest:
    """Where to send the browser, and what the callback must check (`state`) and prove
    (`verifier`, a secret until the code is exchanged)."""

    url: str
    state: str
    verifier: str


def _client(policy: OutboundPolicy) -> httpx.Client:
    return httpx.Client(
        transport=GuardedTransport(policy),
        timeout=REQUEST_TIMEOUT_SECONDS,
        # A redirect would leave the vetted host: metadata and tokens are served in place.
        follow_redirects=False,
    )


def _json(response: httpx.Response) -> dict[str, Any]:
    if len(response.content) > MAX_RESPONSE_BYTES:
        raise OAuthError("the authorization server's answer is too large")
    try:
        body = response.json()
    except ValueError:
        raise OAuthError(
            f"the authorization server's answer is not JSON ({response.status_code})"
        ) from None
    if not isinstance(body, dict):
        raise OAuthError("the authorization server's answer is not a JSON object")
    return body


def probe(url: str, *, policy: OutboundPolicy) -> str | None:
    """None when `url` answers without credentials; else the `resource_metadata` URL its
    401 names ("" when it names none: discovery then tries the well-known URLs)."""
    initialize = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": LATEST_PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "openworker-probe", "version": "1"},
        },
    }
    with _client(policy) as http:
        response = http.post(
            url,
            json=initialize,
            headers={"Accept": "application/json, text/event-stream"},
        )
    challenge = response.headers.get("WWW-Authenticate", "")
    if response.status_code != 401 or not challenge.lower().startswith("bearer"):
        return None
    return extract_field_from_www_auth(response, "resource_metadata") or ""


def discover(
    url: str, *, policy: OutboundPolicy, resource_metadata_url: str | None = None
) -> AuthServerInfo:
    """RFC 9728 then RFC 8414 discovery for the MCP server at `url`."""
    resource = resource_url_from_server_url(url)
    prm: ProtectedResourceMetadata | None = None
    headers = {"MCP-Protocol-Version": LATEST_PROTOCOL_VERSION}
    with _client(policy) as http:
        for candidate in build_protected_resource_metadata_discovery_urls(
            resource_metadata_url or None, url
        ):
            policy.check_url(candidate)
            response = http.get(candidate, headers=headers)
            if response.status_code != 200:
                continue
            try:
                prm = ProtectedResourceMetadata.model_validate(_json(response))
            except ValidationError:
                continue
            break
        if prm is not None:
            # RFC 9728 §3.3: the metadata must be about this resource (or a parent of it).
            if not check_resource_allowed(
                requested_resource=resource, configured_resource=str(prm.resource)
            ):
                raise OAuthError(f"the server's metadata is for another resource ({prm.resource})")
            resource = str(prm.resource)
        issuer = str(prm.authorization_servers[0]) if prm and prm.authorization_servers else None
        metadata: OAuthMetadata | None = None
        for candidate in build_oauth_authorization_server_metadata_discovery_urls(issuer, url):
            policy.check_url(candidate)
            response = http.get(candidate, headers=headers)
            if response.status_code >= 500:
                raise OAuthError(f"the authorization server failed ({response.status_code})")
            if response.status_code != 200:
                continue
            try:
                metadata = OAuthMetadata.model_validate(_json(response))
            except ValidationError:
                continue
            break
    if metadata is None:
        raise OAuthError("no authorization server metadata was found for this server")
    try:
        validate_metadata_issuer(metadata, issuer or _origin(url))
    except Exception as exc:  # the SDK's OAuthFlowError
        raise OAuthError(str(exc)) from None
    if "S256" not in (metadata.code_challenge_methods_supported or ["S256"]):
        raise OAuthError("the authorization server does not offer PKCE with S256")
    return AuthServerInfo(
        resource=resource,
        resource_metadata=prm.model_dump(mode="json", exclude_none=True) if prm else {},
        metadata=metadata.model_dump(mode="json", exclude_none=True),
    )


def _origin(url: str) -> str:
    parsed = httpx.URL(url)
    return f"{parsed.scheme}://{parsed.netloc.decode()}/"


def register(
    info: AuthServerInfo, *, redirect_uri: str, client_name: str, policy: OutboundPolicy
) -> OAuthClientInformationFull:
    """RFC 7591 registration of this site as a client (one per server, shared by users)."""
    metadata = info.as_metadata
    if metadata.registration_endpoint is None:
        raise OAuthError(
            "the authorization server offers no client registration: "
            "an admin has to enter a client ID for this server"
        )
    request = create_client_registration_request(
        metadata,
        OAuthClientMetadata(
            redirect_uris=[redirect_uri],  # type: ignore[list-item]
            client_name=client_name,
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method=CLIENT_SECRET_POST,
            scope=info.scopes,
        ),
        _origin(str(metadata.issuer)),
    )
    policy.check_url(str(request.url))
    with _client(policy) as http:
        response = http.send(request)
    if response.status_code not in (200, 201):
        raise OAuthError(f"client registration was refused ({response.status_code})")
    body = _json(response)
    body.pop("issuer", None)  # the SDK's own field, never taken from the wire
    try:
        client = OAuthClientInformationFull.model_validate(body)
    except ValidationError:
        raise OAuthError("the client registration answer is not valid") from None
    if not client.client_id:
        raise OAuthError("the client registration answer has no client_id")
    return client


def authorization_request(
    info: AuthServerInfo,
    client: OAuthClientInformationFull,
    *,
    redirect_uri: str,
    scope: str | None = None,
) -> AuthorizationRequest:
    """The authorization URL with a fresh `state` and PKCE S256 challenge."""
    pkce = PKCEParameters.generate()
    state = secrets.token_urlsafe(32)
    params = {
        "response_type": "code",
        "client_id": str(client.client_id),
        "redirect_uri": redirect_uri,
        "state": state,
        "code_challenge": pkce.code_challenge,
        "code_challenge_method": "S256",
        "resource": info.resource,
    }
    chosen = scope or info.scopes
    if chosen:
        params["scope"] = chosen
    endpoint = str(info.as_metadata.authorization_endpoint)
    joiner = "&" if "?" in endpoint else "?"
    return AuthorizationRequest(f"{endpoint}{joiner}{urlencode(params)}", state, pkce.code_verifier)


def _authenticate(
    client: OAuthClientInformationFull, data: dict[str, str]
) -> tuple[str, str] | None:
    """The client's credentials for a token or revocation request: HTTP Basic, or in the
    form (`data`, changed in place) for `client_secret_post`; None for a public client."""
    if not client.client_secret:
        return None
    if client.token_endpoint_auth_method == CLIENT_SECRET_BASIC:
        return (str(client.client_id), client.client_secret)
    data["client_secret"] = client.client_secret
    return None


def _token_request(
    info: AuthServerInfo,
    client: OAuthClientInformationFull,
    data: dict[str, str],
    *,
    policy: OutboundPolicy,
) -> OAuthToken:
    data = {**data, "client_id": str(client.client_id), "resource": info.resource}
    auth = _authenticate(client, data)
    endpoint = str(info.as_metadata.token_endpoint)
    with _client(policy) as http:
        response = http.post(endpoint, data=data, auth=auth or httpx.USE_CLIENT_DEFAULT)
    body = _json(response)
    if response.status_code != 200:
        error = str(body.get("error", ""))
        if error == "invalid_grant":
            raise GrantRefused("the authorization server no longer accepts this grant")
        if error in ("invalid_client", "unauthorized_client"):
            raise ClientRefused("the authorization server no longer accepts this site's client")
        raise OAuthError(f"the token request was refused ({response.status_code} {error})".strip())
    try:
        return OAuthToken.model_validate(body)
    except ValidationError:
        raise OAuthError("the token answer is not valid") from None


def exchange_code(
    info: AuthServerInfo,
    client: OAuthClientInformationFull,
    *,
    code: str,
    verifier: str,
    redirect_uri: str,
    policy: OutboundPolicy,
) -> OAuthToken:
    return _token_request(
        info,
        client,
        {
            "grant_type": "authorization_code",
            "code": code,
            "code_verifier": verifier,
            "redirect_uri": redirect_uri,
        },
        policy=policy,
    )


def refresh(
    info: AuthServerInfo,
    client: OAuthClientInformationFull,
    *,
    refresh_token: str,
    policy: OutboundPolicy,
) -> OAuthToken:
    return _token_request(
        info, client, {"grant_type": "refresh_token", "refresh_token": refresh_token}, policy=policy
    )


def revoke(
    info: AuthServerInfo,
    client: OAuthClientInformationFull,
    *,
    token: str,
    hint: str,
    policy: OutboundPolicy,
) -> bool:
    """RFC 7009 revocation where the AS offers it; True when it took it. Never raises: a
    disconnect forgets the tokens here whatever the AS says."""
    endpoint = info.as_metadata.revocation_endpoint
    if endpoint is None:
        return False
    data = {"token": token, "token_type_hint": hint, "client_id": str(client.client_id)}
    auth = _authenticate(client, data)
    try:
        with _client(policy) as http:
            response = http.post(str(endpoint), data=data, auth=auth or httpx.USE_CLIENT_DEFAULT)
    except Exception:
        return False
    return response.status_code == 200
