"""A user's choice of the MCP servers a session uses (only servers shared with one of
their teams are offered, and the service checks again on save)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from sessions import selectors
from sessions.mcp import services
from sessions.mcp.models import SessionMcpServer


@login_required
def session_mcp_servers(request: HttpRequest, session_id: object) -> HttpResponse:
    session = selectors.session_get_for_user(session_id=str(session_id), user=request.user)
    if session is None:
        raise Http404("No such session.")
    available = list(services.mcp_servers_for_user(user=request.user))
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
        {"session": session, "servers": available, "chosen": chosen_ids},
    )
