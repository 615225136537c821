"""A user's choice of the MCP servers a session uses (only servers shared with one of
their teams are offered, and the service checks again on save), and their OAuth
connections: Connect, the authorization server's callback, Disconnect."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from openworker.runtime.agent.tools.mcp import discover_and_store
from sessions import selectors
from sessions.mcp import connections, services
from sessions.mcp.models import SessionMcpServer


@login_required
def session_mcp_servers(request: HttpRequest, session_id: object) -> HttpResponse:
    session = selectors.session_get_for_user(session_id=str(session_id), user=request.user)
    if session is None:
        raise Http404("No such session.")
    available = list(services.mcp_servers_for_user(user=request.user))
    unconnected = connections.mcp_servers_needing_connection(user=request.user, servers=available)
    if request.method == "POST":
        try:
            chosen = [int(value) for value in request.POST.getlist("server")]
            services.session_mcp_servers_set(session=session, server_ids=chosen)
        except (ValueError, services.McpChoiceError):
            return render(
                request,
                "mcp/session_servers.html",
                {
                    "session": session,
                    "servers": available,
                    "chosen": set(),
                    "unconnected": unconnected,
                    "error": "You can't use that MCP server.",
                },
                status=400,
            )
        messages.success(request, "Tools updated for this session.")
        return redirect(reverse("chat", args=[session.pk]))
    chosen_ids = set(
        SessionMcpServer.objects.filter(session=session).values_list("server_id", flat=True)
    )
    return render(
        request,
        "mcp/session_servers.html",
        {
            "session": session,
            "servers": available,
            "chosen": chosen_ids,
            "unconnected": unconnected,
        },
    )


# --- OAuth connections (Settings) -------------------------------------------------------


def _settings_url() -> str:
    return f"{reverse('provider_settings')}#mcp-connections"


@login_required
@require_GET
def mcp_connect(request: HttpRequest, server_id: int) -> HttpResponse:
    """Connect: to the server's authorization server, which comes back to the callback.

    A link (GET), as SSO's sign-in is: the CSP's `form-action 'self'` would stop a form
    whose answer redirects to another origin. It only starts a flow: nothing is granted
    until the person approves at the AS and the callback's `state` matches this session's.
    """
    redirect_uri = request.build_absolute_uri(reverse("mcp_oauth_callback"))
    try:
        url, pending = connections.mcp_connect_start(
            user=request.user, server_id=server_id, redirect_uri=redirect_uri
        )
    except connections.ConnectError as exc:
        messages.error(request, str(exc))
        return redirect(_settings_url())
    request.session[connections.PENDING_KEY] = connections.pending_add(
        request.session.get(connections.PENDING_KEY), pending
    )
    return redirect(url)


@login_required
def mcp_oauth_callback(request: HttpRequest) -> HttpResponse:
    """Where the authorization server sends the browser back with `code` and `state`."""
    pending, rest = connections.pending_take(
        request.session.get(connections.PENDING_KEY), request.GET.get("state", "")
    )
    request.session[connections.PENDING_KEY] = rest
    try:
        server = connections.mcp_connect_finish(
            user=request.user,
            pending=pending,
            state=request.GET.get("state", ""),
            code=request.GET.get("code", ""),
            error=request.GET.get("error", ""),
        )
    except connections.ConnectError as exc:
        messages.error(request, str(exc))
        return redirect(_settings_url())
    # The tool list is the server's, shared by every user: the first connection fills it.
    tools, _ = discover_and_store(server, user_id=request.user.pk)
    count = f" ({len(tools)} tools)" if tools is not None else ""
    messages.success(request, f"{server.label} is connected{count}.")
    return redirect(_settings_url())


@login_required
@require_POST
def mcp_disconnect(request: HttpRequest, server_id: int) -> HttpResponse:
    server = connections.mcp_connection_disconnect(user=request.user, server_id=server_id)
    if server is not None:
        messages.success(request, f"{server.label} is disconnected.")
    return redirect(_settings_url())
