"""MCP servers' tools as `Tool`s of a session's registry.

`session_registry(session_id)` is the built-in tools plus every cached tool of the servers
the session uses (and its owner may still use); each MCP tool's policy is the admin's
per-tool override, else the server's default, and the engine enforces it like any other
tool's. A call is recorded before it leaves (`McpCall`), which is also how a call a crash
interrupted is recognised when the turn is retried: it is reported to the model and the
user, never sent again unasked.

Calls go through the running loop's pool of open sessions (`mcp_pool`), keyed by the
server and whose credentials the session carries (`credentials_identity`). A server that
says its tools changed (`tools/list_changed`) during a call is listed again on the same
session; the new list is stored and replaces the server's tools in the turn's registry,
so the turn's next model call offers them.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import functools
import hashlib
import hmac
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from django.urls import reverse
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from mcp import types

from openworker.runtime.agent.tools import mcp_client, mcp_pool
from openworker.runtime.agent.tools.base import Policy, Tool, ToolContext, ToolResult
from openworker.runtime.agent.tools.mcp_auth import UserTokenAuth
from openworker.runtime.agent.tools.mcp_names import (
    is_strict_compatible,
    neutral_schema,
    tool_name,
)
from openworker.runtime.agent.tools.registry import ToolRegistry, default_registry
from openworker.runtime.store.dbcall import db as _db
from sessions.mcp import connections as mcp_connections
from sessions.mcp import services as mcp_services
from sessions.mcp.models import McpCall, McpConnection, McpServer
from sessions.models import Session

logger = logging.getLogger(__name__)

# The model needs to know what a tool is for, not an essay: long descriptions eat context.
MAX_DESCRIPTION_CHARS = 1024

INTERRUPTED_MESSAGE = (
    "This call to {tool} on {server} was interrupted by a server restart before its result "
    "was saved, so it was not sent again: it may or may not have taken effect. Tell the user "
    "and ask whether to call it again."
)
LOST_MESSAGE = (
    "The connection to {server} ended while this call to {tool} was running, so it was not "
    "sent again: it may or may not have taken effect. Tell the user and ask whether to call "
    "it again."
)
NOT_CONNECTED_MESSAGE = (
    "This tool needs the user's own {server} account, and they have not connected it yet. "
    "Tell the user to connect {server} in Settings ({link}), then ask again."
)
CONNECTION_ENDED_MESSAGE = (
    "The user's connection to {server} has ended (it was revoked or expired at {server}). "
    "Tell the user to connect {server} again in Settings ({link}), then ask again."
)
# Whose credentials a session carries when the server has one secret for everyone.
SERVER_CREDENTIALS = "server"
# ... and when each user connects their own account (OAuth): `user:<id>`.
USER_CREDENTIALS = "user:{user_id}"
_FINGERPRINT_KEY = os.urandom(32)


def settings_link() -> str:
    """Where a user connects their accounts (the Settings page's connections section)."""
    return f"{reverse('provider_settings')}#mcp-connections"


def server_spec(server: McpServer, *, auth: UserTokenAuth | None = None) -> mcp_client.ServerSpec:
    """How to reach `server` (headers decrypted here, in memory only)."""
    return mcp_client.ServerSpec(
        name=server.name,
        transport=server.transport,  # type: ignore[arg-type]
        url=server.url,
        command=server.command,
        args=tuple(server.args or ()),
        headers=server.request_headers(),
        outbound=mcp_services.outbound_policy(),
        auth=auth,
    )


def user_auth(
    server: McpServer, user_id: int | None, *, blocking_caller: bool = False
) -> tuple[UserTokenAuth, int] | None:
    """The user's own token for an OAuth server, renewing itself through the database,
    and its connection's id (None when they have not connected). Runs where database
    access is allowed. `blocking_caller`: the client runs on a private loop of a blocking
    caller (a view), whose database thread is the caller's own and busy waiting, so a
    renewal runs on a thread of its own rather than on the runtime's database threads."""
    token = mcp_connections.mcp_connection_token(user_id=user_id, server_id=server.pk)
    if token is None:
        return None
    connection_id = token.connection_id
    refresh = (
        functools.partial(asyncio.to_thread, mcp_connections.mcp_connection_refresh)
        if blocking_caller
        else _db(mcp_connections.mcp_connection_refresh)
    )

    async def renew(stale: str) -> tuple[str, float | None] | None:
        fresh = await refresh(connection_id=connection_id, stale_access=stale)
        return None if fresh is None else (fresh.access, fresh.expires_at)

    auth = UserTokenAuth(token.access, expires_at=token.expires_at, renew=renew)
    return auth, connection_id


def _connection_credentials(connection_id: int) -> str:
    # The connection, not its token: a pooled session's token renews itself in place,
    # while a new connection (Disconnect, then Connect) must open a new session.
    return f"connection-{connection_id}"


def spec_for_user(
    server: McpServer, user_id: int | None
) -> tuple[mcp_client.ServerSpec, str] | None:
    """`(server_spec carrying the user's token for an OAuth server, the credentials part
    of its pool fingerprint)`; None when the server needs their connection and there is
    none."""
    if not server.oauth:
        return server_spec(server), ""
    found = user_auth(server, user_id)
    if found is None:
        return None
    auth, connection_id = found
    return server_spec(server, auth=auth), _connection_credentials(connection_id)


def spec_fingerprint(spec: mcp_client.ServerSpec) -> str:
    """What a pooled session to the server was opened with: any edit of the server (URL,
    command, arguments, headers, secret) gives another fingerprint, so the old session is
    not reused. Keyed with a secret of this process's own, so the digest of a bearer token
    is worth nothing outside it."""
    material = json.dumps(
        [spec.transport, spec.url, spec.command, list(spec.args), sorted(spec.headers.items())]
    )
    return hmac.new(_FINGERPRINT_KEY, material.encode(), hashlib.sha256).hexdigest()


def pool_fingerprint(spec: mcp_client.ServerSpec, credentials: str = "") -> str:
    """`<server>.<credentials>`: the server's part is what the sweep checks against the
    database (`_pooled_current`); the second is for credentials of a caller's own (a
    user's token), whose change must open a new session too."""
    return f"{spec_fingerprint(spec)}.{credentials}"


def credentials_identity(server: McpServer, ctx: ToolContext) -> str:
    """Whose credentials a session to `server` carries, the second half of its pool key:
    the server's own secret, shared by everyone the server is shared with, or on an OAuth
    server the calling user's own token."""
    if server.oauth:
        return USER_CREDENTIALS.format(user_id=ctx.user_id)
    return SERVER_CREDENTIALS


def _pooled_current(pooled: dict[mcp_pool.PoolKey, str]) -> set[mcp_pool.PoolKey]:
    """The pooled sessions whose server is still enabled and unchanged (one query)."""
    ids = {int(key.server) for key in pooled}
    current = {
        str(server.pk): spec_fingerprint(server_spec(server))
        for server in McpServer.objects.filter(pk__in=ids, enabled=True)
    }
    # A user's session lives only as long as their connection: a Disconnect or an
    # admin's revoke closes it within a sweep, so its token leaves memory too.
    connected = {
        USER_CREDENTIALS.format(user_id=user_id): _connection_credentials(pk)
        for pk, user_id in McpConnection.objects.filter(server_id__in=ids).values_list(
            "pk", "user_id"
        )
    }
    kept = set()
    for key, fingerprint in pooled.items():
        server_part, _, credentials = fingerprint.partition(".")
        if current.get(key.server) != server_part:
            continue
        if key.identity != SERVER_CREDENTIALS and connected.get(key.identity) != credentials:
            continue
        kept.add(key)
    return kept


async def _store_listed(key: mcp_pool.PoolKey, tools: list[dict[str, Any]]) -> None:
    await _db(mcp_services.mcp_tools_cache_save)(server_id=int(key.server), tools=tools)


def _bind_pool(pool: mcp_pool.McpPool) -> None:
    pool.validate = _db(_pooled_current)
    pool.tools_listed = _store_listed


mcp_pool.on_new_pool(_bind_pool)


async def refresh_server_tools(server: McpServer) -> list[dict[str, Any]] | None:
    """Discover `server`'s tools now and store them; None (and the error kept) on failure."""
    spec = await _db(server_spec)(server)
    try:
        tools = await mcp_client.discover(spec)
    except Exception as exc:
        logger.warning("MCP discovery of %s failed: %s", server.name, type(exc).__name__)
        await _db(mcp_services.mcp_tools_cache_save)(
            server_id=server.pk, tools=None, error=_error_text(exc)
        )
        return None
    await _db(mcp_services.mcp_tools_cache_save)(server_id=server.pk, tools=tools)
    return tools


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _error_text(exc.exceptions[0])
    return f"{type(exc).__name__}: {exc}"[:300]


class McpTool(Tool):
    """One tool of one MCP server. Built per turn from the server's cached discovery."""

    def __init__(
        self,
        server: McpServer,
        listed: dict[str, Any],
        policy: Policy,
        toolset: _ServerTools | None = None,
    ) -> None:
        self.server = server
        self.toolset = toolset
        self.remote_name = str(listed["name"])
        self.name = tool_name(server.name, self.remote_name)  # type: ignore[misc]
        self.description = (listed.get("description") or "")[:MAX_DESCRIPTION_CHARS]  # type: ignore[misc]
        self.parameters = neutral_schema(listed.get("inputSchema"))  # type: ignore[misc]
        self.default_policy = policy  # type: ignore[misc]
        try:
            Draft202012Validator.check_schema(self.parameters)
            self._validator = Draft202012Validator(self.parameters)  # type: ignore[misc]
        except SchemaError:
            # The server's schema is not one we can check against: let the server judge.
            self._validator = Draft202012Validator({"type": "object"})  # type: ignore[misc]

    def definition(self) -> dict[str, Any]:
        out = super().definition()
        out["description"] = f"[{self.server.label}] {self.description}".strip()
        if is_strict_compatible(self.parameters):
            out["strict"] = True
        return out

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raise NotImplementedError("MCP tools run on the event loop: use arun")

    async def arun(self, args: Any, ctx: ToolContext) -> ToolResult:
        problem = self.argument_error(args)
        if problem is not None:
            return ToolResult(problem, is_error=True)
        server = self.server
        record = await _db(mcp_services.mcp_call_start)(
            user_id=ctx.user_id,
            session_id=ctx.session_id,
            turn_id=ctx.turn_id,
            call_id=ctx.call_id or "",
            server_id=server.pk,
            server_name=server.name,
            tool=self.remote_name,
            arguments=None if server.sensitive else args,
        )
        if record is None:
            await _db(mcp_services.mcp_call_mark_interrupted)(
                turn_id=ctx.turn_id, call_id=ctx.call_id or ""
            )
            return ToolResult(
                INTERRUPTED_MESSAGE.format(tool=self.remote_name, server=server.label),
                is_error=True,
            )
        started = time.monotonic()
        outcome, result, detail, size = McpCall.Outcome.ERROR, None, "", None
        try:
            outcome, result, detail, size = await self._call(args, ctx)
        except Exception as exc:
            logger.warning("MCP call %s/%s failed", server.name, self.remote_name, exc_info=True)
            detail = _error_text(exc)
            result = ToolResult(
                f"Error: the MCP server {server.label} could not be reached or failed "
                f"({type(exc).__name__}).",
                is_error=True,
            )
        finally:
            await _db(mcp_services.mcp_call_finish)(
                call_pk=record.pk,
                outcome=outcome,
                duration_ms=int((time.monotonic() - started) * 1000),
                result_bytes=size,
                detail=detail,
            )
        assert result is not None
        return result

    async def _connection_ended(self, ctx: ToolContext) -> bool:
        """Whether the call failed because the user's OAuth grant is gone: a renewal the
        authorization server refused removes the connection (`mcp_connection_refresh`)."""
        if not self.server.oauth:
            return False
        token = await _db(mcp_connections.mcp_connection_token)(
            user_id=ctx.user_id, server_id=self.server.pk
        )
        return token is None

    def _connection_ended_result(self) -> tuple[str, ToolResult, str, int | None]:
        label = self.server.label
        message = CONNECTION_ENDED_MESSAGE.format(server=label, link=settings_link())
        return McpCall.Outcome.ERROR, ToolResult(message, is_error=True), "connection ended", None

    async def _call(
        self, args: dict[str, Any], ctx: ToolContext
    ) -> tuple[str, ToolResult, str, int | None]:
        server = self.server
        found = await _db(spec_for_user)(server, ctx.user_id)
        if found is None:
            message = NOT_CONNECTED_MESSAGE.format(server=server.label, link=settings_link())
            return McpCall.Outcome.ERROR, ToolResult(message, is_error=True), "not connected", None
        spec, credentials = found

        def opener(on_changed: mcp_client.ToolsChanged, undelivered: set[Any]) -> Any:
            return mcp_client.connect(spec, on_tools_changed=on_changed, undelivered=undelivered)

        try:
            pooled = await mcp_pool.pool().call_tool(
                mcp_pool.PoolKey(str(server.pk), credentials_identity(server, ctx)),
                pool_fingerprint(spec, credentials),
                opener,
                self.remote_name,
                args,
                timeout=float(server.timeout_seconds),
                cancel=ctx.cancel,
                stdio=spec.transport == "stdio",
            )
        except Exception:
            if await self._connection_ended(ctx):
                return self._connection_ended_result()
            raise
        end = pooled.outcome
        if end.end in ("lost", "unsent") and await self._connection_ended(ctx):
            return self._connection_ended_result()
        if pooled.tools is not None:
            # The server changed its tool list while answering: stored for the next
            # turns, and offered from this turn's next model call on.
            await _db(mcp_services.mcp_tools_cache_save)(server_id=server.pk, tools=pooled.tools)
            if self.toolset is not None:
                self.toolset.replace(pooled.tools)
        if end.end in ("lost", "unsent"):
            return (
                McpCall.Outcome.INTERRUPTED if end.end == "lost" else McpCall.Outcome.ERROR,
                ToolResult(
                    LOST_MESSAGE.format(tool=self.remote_name, server=server.label)
                    if end.end == "lost"
                    else f"Error: the MCP server {server.label} could not be reached.",
                    is_error=True,
                ),
                "connection lost during the call" if end.end == "lost" else "not delivered",
                None,
            )
        if end.end == "timeout":
            return (
                McpCall.Outcome.TIMEOUT,
                ToolResult(
                    f"Error: {server.label} did not answer within {server.timeout_seconds} "
                    "seconds; the call was cancelled.",
                    is_error=True,
                ),
                "",
                None,
            )
        if end.end == "cancelled":
            return (
                McpCall.Outcome.CANCELLED,
                ToolResult("The user stopped this call.", is_error=True),
                "",
                None,
            )
        assert end.result is not None
        rendered = render_result(end.result)
        size = rendered.size
        if size > server.max_result_bytes:
            return (
                McpCall.Outcome.OVERSIZE,
                ToolResult(
                    f"Error: the result was {size} bytes, over the {server.max_result_bytes}-byte "
                    "limit for this server; ask for less (a narrower query or fewer items).",
                    is_error=True,
                ),
                "",
                size,
            )
        if end.result.isError:
            text = rendered.text
            return McpCall.Outcome.ERROR, ToolResult(text, is_error=True), text[:300], size
        content = await _content_for_model(rendered, ctx, server.name)
        return McpCall.Outcome.OK, ToolResult(content), "", size


@dataclass(frozen=True)
class RenderedResult:
    """A tool result as the model will get it: text, images (mime, bytes), total size."""

    text: str
    images: list[tuple[str, bytes]]
    size: int


def render_result(result: types.CallToolResult) -> RenderedResult:
    """Text blocks are joined; structured content is added as JSON when no text block
    carries it; each image is named in the text and kept for the model (images counted
    decoded in the size)."""
    parts: list[str] = []
    images: list[tuple[str, bytes]] = []
    size = 0
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
            size += len(block.text.encode())
        elif isinstance(block, types.ImageContent):
            try:
                raw = base64.b64decode(block.data, validate=True)
            except ValueError:
                parts.append(f"[image: {block.mimeType}, not valid base64]")
                continue
            size += len(raw)
            images.append((block.mimeType, raw))
            parts.append(f"[image: {block.mimeType}, {len(raw)} bytes]")
        elif isinstance(block, types.EmbeddedResource):
            resource = block.resource
            body = getattr(resource, "text", None)
            if body is not None:
                parts.append(body)
                size += len(body.encode())
            else:
                parts.append(f"[resource {resource.uri}: {resource.mimeType or 'binary'}]")
        elif isinstance(block, types.ResourceLink):
            parts.append(f"[resource {block.uri}]")
        elif isinstance(block, types.AudioContent):
            parts.append(f"[audio: {block.mimeType}]")
    if result.structuredContent is not None and not any(
        isinstance(b, types.TextContent) for b in result.content
    ):
        structured = json.dumps(result.structuredContent, ensure_ascii=False, sort_keys=True)
        parts.append(structured)
        size += len(structured.encode())
    return RenderedResult("\n".join(parts) or "(no content)", images, size)


async def _content_for_model(
    rendered: RenderedResult, ctx: ToolContext, server_name: str
) -> str | list[dict[str, Any]]:
    """Plain text, or text plus image parts: each image is stored as the owner's
    attachment and referenced (`attachment:<id>`), so the history inlines it for a vision
    model and degrades it to the placeholder for the others, as it does an upload."""
    if not rendered.images:
        return rendered.text
    content: list[dict[str, Any]] = [{"type": "text", "text": rendered.text}]
    for index, (mime, data) in enumerate(rendered.images):
        ref = await _db(mcp_services.mcp_image_store)(
            user_id=ctx.user_id,
            session_id=ctx.session_id,
            data=data,
            name=f"{server_name}-{ctx.call_id or 'call'}-{index}.{mime.rpartition('/')[2]}",
        )
        if ref is None:
            content.append({"type": "text", "text": f"[image ({mime}) could not be kept]"})
        else:
            content.append({"type": "image_url", "image_url": {"url": f"attachment:{ref}"}})
    return content


def _policy_for(server: McpServer, remote_name: str) -> Policy:
    for row in server.tool_policies.all():
        if row.tool == remote_name:
            return row.policy  # type: ignore[return-value]
    return server.default_policy  # type: ignore[return-value]


class _ServerTools:
    """One server's tools in one registry, replaced together when the server lists
    others mid-turn."""

    def __init__(self, registry: ToolRegistry, server: McpServer) -> None:
        self.registry = registry
        self.server = server
        self.names: list[str] = []

    def replace(self, listed: list[dict[str, Any]]) -> None:
        for name in self.names:
            self.registry.unregister(name)
        self.names = []
        for item in listed:
            tool = McpTool(self.server, item, _policy_for(self.server, str(item.get("name"))), self)
            if tool.name in self.registry:
                logger.warning("MCP tool name %s collides; skipped", tool.name)
                continue
            self.registry.register(tool)
            self.names.append(tool.name)


def session_registry(*, session_id: Any, owner_id: int | None = None) -> ToolRegistry:
    """The built-in tools plus the MCP tools of the servers this session uses: one query
    when the session uses none (the engine passes the owner it already has), two when it
    does (the servers, their per-tool policies)."""
    registry = default_registry()
    if owner_id is None:
        owner_id = Session.objects.values_list("owner_id", flat=True).get(pk=session_id)
    for server in mcp_services.session_mcp_servers(session_id=session_id, owner=owner_id):
        _ServerTools(registry, server).replace(server.tools_cache or [])
    return registry


def session_registries(sessions: list[tuple[Any, int]]) -> list[ToolRegistry]:
    """`session_registry` for each (session id, owner id) of a burst of turn starts, in
    order: one query for the lot when none of them uses an MCP server."""
    if len(sessions) <= 1:  # a lone start: the query compiled once
        return [session_registry(session_id=sid, owner_id=owner) for sid, owner in sessions]
    using = mcp_services.sessions_using_servers(session_ids=[sid for sid, _ in sessions])
    return [
        session_registry(session_id=sid, owner_id=owner)
        if str(sid) in using
        else default_registry()
        for sid, owner in sessions
    ]


def discover_and_store(
    server: McpServer, *, user_id: int | None = None
) -> tuple[list[dict[str, Any]] | None, str]:
    """Blocking discovery for the admin and for a user who just connected: `(tools, "")`,
    or `(None, error)` with the last good list kept. An OAuth server is listed with
    `user_id`'s own token (the list is shared: it is the server's, not the user's). The
    SDK runs on a loop of its own thread, whatever the caller's is."""
    if server.oauth:
        found = user_auth(server, user_id, blocking_caller=True)
        if found is None:
            return None, "each user connects their own account: connect yours in Settings first"
        spec = server_spec(server, auth=found[0])
    else:
        spec = server_spec(server)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            tools = pool.submit(asyncio.run, mcp_client.discover(spec)).result()
        except Exception as exc:
            error = _error_text(exc)
            mcp_services.mcp_tools_cache_save(server_id=server.pk, tools=None, error=error)
            return None, error
    mcp_services.mcp_tools_cache_save(server_id=server.pk, tools=tools)
    return tools, ""
