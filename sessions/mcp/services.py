"""MCP servers as the product's data: who may use which, a session's choice, the tool
cache, and the call record. Reads and writes only; the runtime does the talking."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import IntegrityError, transaction
from django.db.models import F, QuerySet, prefetch_related_objects
from django.utils import timezone

from openworker.prepared_query import AnyOf, PreparedQuery
from providers.errors import ProviderError
from providers.outbound import OutboundPolicy
from sessions.attachments import AttachmentRejected, attachment_create
from sessions.mcp.models import McpCall, McpServer, SessionMcpServer
from sessions.models import Session

# What the record keeps of why a call failed (never the result itself).
MAX_DETAIL_CHARS = 300


class McpChoiceError(ValueError):
    """A user asked for a server they may not use."""


def outbound_policy() -> OutboundPolicy:
    """The same outbound rules as provider base URLs."""
    return OutboundPolicy.from_env(embedded=not settings.DISTRIBUTED)


def mcp_url_refusal(url: str) -> str | None:
    """Why the outbound policy refuses `url` (private, loopback, metadata…), else None."""
    try:
        outbound_policy().check_url(url)
    except ProviderError as exc:
        return str(exc)
    return None


def mcp_servers_for_user(*, user: Any) -> QuerySet[McpServer]:
    """Enabled servers shared with one of the user's teams."""
    return McpServer.objects.filter(enabled=True, teams__user=user).distinct().order_by("name")


def session_mcp_servers(*, session_id: uuid.UUID | str, owner: Any) -> list[McpServer]:
    """The servers a session uses that its owner may still use (a team change counts at
    once: the choice alone grants nothing)."""
    servers = _SESSION_SERVERS.instances(
        session_id=session_id, owner_id=getattr(owner, "pk", owner)
    )
    if servers:
        prefetch_related_objects(servers, "tool_policies")
    return servers


def sessions_using_servers(*, session_ids: list[Any]) -> set[str]:
    """Of `session_ids`, those that chose any MCP server (as strings): one query for a
    burst of turn starts, most of whose sessions use none."""
    return {str(session_id) for (session_id,) in _CHOSEN.rows(session_ids=list(session_ids))}


# Compiled once for a burst of any size (openworker.prepared_query).
_CHOSEN = PreparedQuery(
    lambda session_ids: SessionMcpServer.objects.filter(
        AnyOf(F("session_id"), session_ids)
    ).values_list("session_id"),
    session_ids=list[uuid.UUID],
)


def _session_servers_query(session_id: uuid.UUID, owner_id: int) -> QuerySet[McpServer]:
    chosen = SessionMcpServer.objects.filter(session_id=session_id).values("server_id")
    return mcp_servers_for_user(user=owner_id).filter(pk__in=chosen)


# Every turn start asks (most sessions use no server): compiled once
# (openworker.prepared_query).
_SESSION_SERVERS = PreparedQuery(_session_servers_query, session_id=uuid.UUID, owner_id=int)


def session_mcp_servers_set(*, session: Any, server_ids: list[int]) -> list[McpServer]:
    """Replace a session's choice of servers; refuses one its owner may not use."""
    allowed = {s.pk: s for s in mcp_servers_for_user(user=session.owner)}
    unknown = [sid for sid in server_ids if sid not in allowed]
    if unknown:
        raise McpChoiceError("You can't use that MCP server.")
    with transaction.atomic():
        SessionMcpServer.objects.filter(session=session).exclude(server_id__in=server_ids).delete()
        for sid in server_ids:
            SessionMcpServer.objects.get_or_create(session=session, server_id=sid)
    return [allowed[sid] for sid in sorted(set(server_ids))]


def mcp_tools_cache_save(
    *, server_id: int, tools: list[dict[str, Any]] | None, error: str = ""
) -> None:
    """Store a discovery's result (`tools` None on failure keeps the last good list)."""
    fields: dict[str, Any] = {"tools_error": error[:500]}
    if tools is not None:
        fields.update(tools_cache=tools, tools_refreshed_at=timezone.now())
    McpServer.objects.filter(pk=server_id).update(**fields)


def mcp_call_start(
    *,
    user_id: int | None,
    session_id: uuid.UUID | str,
    turn_id: uuid.UUID | str | None,
    call_id: str,
    server_id: int,
    server_name: str,
    tool: str,
    arguments: dict[str, Any] | None,
) -> McpCall | None:
    """Record a call before it leaves. None when this turn already recorded this call: it
    was started before (a crash, a retried turn) and must not run again unasked."""
    try:
        with transaction.atomic():
            return McpCall.objects.create(
                user_id=user_id,
                session_id=session_id,
                turn_id=turn_id,
                call_id=call_id,
                server_id=server_id,
                server_name=server_name,
                tool=tool,
                arguments=arguments,
            )
    except IntegrityError:
        return None


def mcp_call_mark_interrupted(*, turn_id: uuid.UUID | str, call_id: str) -> str:
    """The earlier attempt's outcome, recording a still-`started` one as interrupted."""
    call = McpCall.objects.filter(turn_id=turn_id, call_id=call_id).first()
    if call is None:
        return ""
    if call.outcome == McpCall.Outcome.STARTED:
        call.outcome = McpCall.Outcome.INTERRUPTED
        call.save(update_fields=["outcome"])
    return call.outcome


def mcp_call_finish(
    *,
    call_pk: uuid.UUID,
    outcome: str,
    duration_ms: int,
    result_bytes: int | None,
    detail: str = "",
) -> None:
    McpCall.objects.filter(pk=call_pk).update(
        outcome=outcome,
        duration_ms=duration_ms,
        result_bytes=result_bytes,
        detail=detail[:MAX_DETAIL_CHARS],
    )


def mcp_image_store(
    *, user_id: int | None, session_id: uuid.UUID | str, data: bytes, name: str
) -> str | None:
    """Keep an image a tool returned as the session owner's attachment (the same sniffing
    and size limit as an upload); its id, or None when it is refused."""
    session = Session.objects.select_related("owner").get(pk=session_id)
    if user_id is not None and session.owner_id != user_id:
        return None
    try:
        attachment = attachment_create(
            owner=session.owner, session=session, upload=SimpleUploadedFile(name, data)
        )
    except AttachmentRejected:
        return None
    return str(attachment.pk)
