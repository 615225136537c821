"""The chat workspace's small endpoints: sidebar search and actions (pin, rename, archive,
delete as JSON for the page's scripts), a turn's footer (plain words for how it ended),
the session's workspace files, the theme preference and the favicon.

Every session URL answers 404 to anyone but its owner, as in sessions.views.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.contrib.staticfiles import finders
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET, require_POST

from sessions import presenters, selectors, services, workspace
from sessions.models import Session

# The favicon changes with a release at most: let browsers keep it for a day.
FAVICON_MAX_AGE = 24 * 3600


def workspace_page_data(session: Session) -> dict[str, str]:
    """The chat page's URLs for the workspace scripts (merged into its page data)."""
    base = reverse("chat", args=[session.pk])
    return {
        "sessionUrl": base,
        "filesUrl": reverse("workspace_files", args=[session.pk]),
        "searchUrl": reverse("sidebar_search"),
        "newUrl": reverse("session_new"),
    }


def _own_session(request: HttpRequest, session_id: object) -> Session:
    session = selectors.session_get_for_user(session_id=str(session_id), user=request.user)
    if session is None:
        raise Http404("No such session.")
    return session


@login_required
@require_GET
def sidebar_search(request: HttpRequest) -> JsonResponse:
    results = selectors.session_search_results(user=request.user, query=request.GET.get("q", ""))
    for result in results:
        result["url"] = reverse("chat", args=[result["id"]])
    return JsonResponse({"results": results})


@login_required
@require_POST
def session_pin(request: HttpRequest, session_id: object) -> JsonResponse:
    session = _own_session(request, session_id)
    workspace.session_pin(session=session, pinned=request.POST.get("pinned", "1") == "1")
    return JsonResponse({"id": str(session.pk), "pinned": session.pinned})


@login_required
@require_POST
def session_title(request: HttpRequest, session_id: object) -> JsonResponse:
    session = _own_session(request, session_id)
    title = request.POST.get("title", "")
    if not title.strip():
        return JsonResponse({"error": "Give the session a title."}, status=400)
    services.session_rename(session=session, title=title)
    return JsonResponse({"id": str(session.pk), "title": str(session)})


@login_required
@require_POST
def session_archive_json(request: HttpRequest, session_id: object) -> JsonResponse:
    session = _own_session(request, session_id)
    archived = request.POST.get("archived", "1") == "1"
    services.session_archive(session=session, archived=archived)
    return JsonResponse({"id": str(session.pk), "archived": archived})


@login_required
@require_POST
def session_delete_json(request: HttpRequest, session_id: object) -> JsonResponse:
    session = _own_session(request, session_id)
    key = str(session.pk)
    try:
        services.session_delete(session=session)
    except services.TurnRefused as exc:
        return JsonResponse({"error": str(exc)}, status=409)
    return JsonResponse({"id": key, "deleted": True})


@login_required
@require_GET
def turn_footer(request: HttpRequest, session_id: object, turn_id: object) -> HttpResponse:
    """How a turn ended, rendered as on the page after a reload (the live page asks for it
    when a turn ends, also one that ended while the page was away)."""
    session = _own_session(request, session_id)
    turn = selectors.turn_get_for_session(session=session, turn_id=turn_id)
    if turn is None:
        raise Http404("No such turn.")
    view = presenters.turn_view(turn)
    html = render_to_string("sessions/_turn_footer.html", {"t": view}, request=request)
    return JsonResponse({"status": turn.status, "active": view["active"], "html": html})


@login_required
@require_GET
def workspace_files(request: HttpRequest, session_id: object) -> JsonResponse:
    session = _own_session(request, session_id)
    files = [
        {**item, "url": reverse("workspace_file", args=[session.pk, item["path"]])}
        for item in selectors.workspace_files(session=session)
    ]
    return JsonResponse({"files": files})


@login_required
@require_POST
def theme(request: HttpRequest) -> JsonResponse:
    try:
        chosen = workspace.theme_set(user=request.user, theme=request.POST.get("theme", ""))
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse({"theme": chosen})


@require_GET
@cache_control(max_age=FAVICON_MAX_AGE, public=True)
def favicon(request: HttpRequest) -> FileResponse:
    path = finders.find("favicon.ico")
    if not path:
        raise Http404("No favicon.")
    return FileResponse(open(path, "rb"), content_type="image/x-icon")
