"""HTTP views of chat sessions. They adapt requests and call services and selectors;
every session URL answers 404 to anyone but its owner."""

from __future__ import annotations

import logging
import mimetypes
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import (
    FileResponse,
    Http404,
    HttpRequest,
    HttpResponse,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from openworker.middleware import answers_json
from openworker.runtime.agent.degradation import degradation_note
from openworker.runtime.agent.llm import router_for_user
from openworker.runtime.agent.tools.workspace import WorkspacePathError, workspace_path
from sessions import attachments, export, importing, presenters, selectors, services
from sessions.models import Session, Turn
from sessions.search import normalise_query
from sessions.workspace_views import workspace_page_data

logger = logging.getLogger(__name__)

# Sessions per page of the list: a screenful on a laptop, two thumbs' worth on a phone.
SESSIONS_PER_PAGE = 25


def _own_session(request: HttpRequest, session_id: object) -> Session:
    session = selectors.session_get_for_user(session_id=str(session_id), user=request.user)
    if session is None:
        raise Http404("No such session.")
    return session


def _router(user: Any) -> Any:
    return router_for_user(user.pk)


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    query = request.GET.get("q", "")
    archived = request.GET.get("archived") == "1"
    sessions = selectors.session_list_page(user=request.user, query=query, archived=archived)
    page = Paginator(sessions, SESSIONS_PER_PAGE).get_page(request.GET.get("page"))
    default_model = selectors.new_session_model(user=request.user)
    return render(
        request,
        "sessions/home.html",
        {
            "page": page,
            "sessions": page.object_list,
            "query": _clean_query(query),
            "archived": archived,
            "picker": presenters.model_picker(request.user, default_model),
        },
    )


def _clean_query(query: str) -> str:
    return normalise_query(query)


@login_required
@require_POST
def session_new(request: HttpRequest) -> HttpResponse:
    model = presenters.chosen_model(request.POST) or selectors.new_session_model(user=request.user)
    try:
        model = services.model_check(user=request.user, model=model)
    except services.TurnRefused as exc:
        messages.error(request, str(exc))
        return redirect("home")
    session = services.session_create(owner=request.user, model=model)
    return redirect("chat", session_id=session.pk)


@login_required
@require_GET
def chat(request: HttpRequest, session_id: object) -> HttpResponse:
    session = _own_session(request, session_id)
    rows, has_more = selectors.messages_window(session=session)
    last_turn = selectors.session_last_turn(session=session)
    turn_ids = {m.turn_id for m in rows}
    turns = selectors.turns_by_id(session=session, turn_ids=turn_ids)
    if last_turn is not None:
        turns.setdefault(str(last_turn.pk), last_turn)
    first_seq = rows[0].seq if rows else 0
    last_seq = rows[-1].seq if rows else 0
    checkpoints = (
        selectors.checkpoints_between(
            session=session, first_seq=first_seq, last_seq=last_seq, shown=rows
        )
        if rows
        else []
    )
    last_active = last_turn is not None and last_turn.status in Turn.ACTIVE
    items = presenters.build_items(
        session, rows, turns, checkpoints, closed_last_turn=not last_active
    )
    caps = _router(request.user).capabilities(session.model)
    cost = selectors.session_cost(session=session)
    last_turn_view = presenters.turn_view(last_turn) if last_turn is not None else None
    # The last turn's footer is already among the items when its messages are in view.
    show_last_turn = (
        last_turn_view is not None
        and not last_active
        and not any(m.turn_id == last_turn.pk for m in rows)  # type: ignore[union-attr]
    )
    page_data = {
        "session": str(session.pk),
        "socket": f"/ws/sessions/{session.pk}/",
        "messagesUrl": reverse("session_messages", args=[session.pk]),
        "modelUrl": reverse("session_model", args=[session.pk]),
        "uploadUrl": reverse("attachment_upload", args=[session.pk]),
        "firstSeq": first_seq,
        "lastSeq": last_seq,
        # The active leaf the page shows: sent back as `leaf` with branch commands.
        "activeLeaf": session.active_seq,
        "hasMore": has_more,
        "model": session.model,
        "caps": presenters.caps_payload(caps),
        "contextTokens": session.last_context_tokens,
        "sessionCost": str(cost) if cost is not None else None,
        "lastTurn": last_turn_view if last_turn_view and last_turn_view["retryable"] else None,
        "maxAttachmentBytes": settings.MAX_ATTACHMENT_BYTES,
        **workspace_page_data(session),
    }
    return render(
        request,
        "sessions/chat.html",
        {
            "session": session,
            "items": items,
            "has_more": has_more,
            "page_data": page_data,
            "picker": presenters.model_picker(request.user, session.model),
            "caps": caps,
            "context_window": caps.context_window,
            "context_tokens": session.last_context_tokens,
            "context_pct": _percent(session.last_context_tokens, caps.context_window),
            "session_cost": presenters.format_cost(cost) if cost else None,
            "last_turn": last_turn_view if show_last_turn else None,
            "has_usable_key": selectors.model_provider(session.model)
            in selectors.providers_with_keys(user=request.user),
        },
    )


def _percent(tokens: int | None, window: int | None) -> int | None:
    if not tokens or not window:
        return None
    return min(100, round(100 * tokens / window))


@answers_json
@login_required
@require_GET
def session_messages(request: HttpRequest, session_id: object) -> JsonResponse:
    """Server-rendered HTML of stored messages.

    `?after=<seq>`: each message after it, keyed by seq (the live page fetches a message
    the socket announced, rendered by the same code as the page). `?before=<seq>`: the
    window of older messages as one fragment ("load earlier"). `?leaf=<seq>` (alone, or
    with either): along the path ending there instead of the active path.
    """
    session = _own_session(request, session_id)
    after = _int_param(request, "after")
    before = _int_param(request, "before")
    # `?leaf=<seq>`: the path ending there (a branch the page switches to); without it
    # the active path. With neither after nor before: that path's latest window.
    leaf = _int_param(request, "leaf")
    if leaf is not None and after is None and before is None:
        rows, more = selectors.messages_window(session=session, leaf=leaf or None)
        return JsonResponse(
            {
                "messages": [_message_json(session, m) for m in rows],
                "more": more,
                "leaf": leaf,
                "first_seq": rows[0].seq if rows else 0,
            }
        )
    if after is not None:
        rows, more = selectors.messages_window(session=session, after=after, leaf=leaf)
        return JsonResponse(
            {
                "messages": [_message_json(session, m) for m in rows],
                "more": more,
            }
        )
    if before is None:
        return JsonResponse({"error": "Give after or before (a sequence number)."}, status=400)
    rows, more = selectors.messages_window(session=session, before=before, leaf=leaf)
    turns = selectors.turns_by_id(session=session, turn_ids={m.turn_id for m in rows})
    checkpoints = (
        selectors.checkpoints_between(
            session=session, first_seq=rows[0].seq, last_seq=rows[-1].seq, shown=rows
        )
        if rows
        else []
    )
    items = presenters.build_items(session, rows, turns, checkpoints, closed_last_turn=True)
    return JsonResponse(
        {
            "html": presenters.render_items(items),
            "first_seq": rows[0].seq if rows else before,
            "has_more": more,
        }
    )


def _message_json(session: Any, message: Any) -> dict[str, Any]:
    return {
        "seq": message.seq,
        "role": message.role,
        "turn": str(message.turn_id) if message.turn_id else None,
        "parent": message.parent_seq,
        "siblings": getattr(message, "siblings", None) or [message.seq],
        "html": presenters.render_message_html(session, message),
    }


def _int_param(request: HttpRequest, name: str) -> int | None:
    value = request.GET.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise Http404("Bad sequence number.") from None
    return max(0, number)


@answers_json
@login_required
@require_POST
def session_model(request: HttpRequest, session_id: object) -> JsonResponse:
    """Switch the session's model; say what the new model cannot read of this session."""
    session = _own_session(request, session_id)
    model = presenters.chosen_model(request.POST)
    try:
        services.session_set_model(session=session, model=model)
    except services.TurnRefused as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    caps = _router(request.user).capabilities(session.model)
    note = degradation_note(selectors.attachment_kinds(session=session), caps) or ""
    if caps.reasoning is not True and session.messages.exclude(reasoning="").exists():
        # Reasoning is display-only and never sent to any model; what changes is that
        # this model's replies come without it.
        note += " — this model shows no reasoning"
    return JsonResponse(
        {
            "model": session.model,
            "caps": presenters.caps_payload(caps),
            "caps_label": presenters.caps_label(caps),
            "note": _note_words(note),
        }
    )


def _note_words(note: str | None) -> str | None:
    """degradation_note is a status-line suffix (" — earlier images ..."): as a sentence."""
    if not note:
        return None
    parts = [part.strip() for part in note.split(" — ") if part.strip()]
    return "; ".join(parts).capitalize() + "."


def _safe_next(request: HttpRequest, fallback: str) -> str:
    """A local path to go back to, else `fallback`. Only a path: `redirect()` would take
    a bare word for a URL name (and a name it cannot reverse is a 500)."""
    target = request.POST.get("next") or request.GET.get("next") or ""
    if target.startswith("/") and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return fallback


@login_required
@require_http_methods(["GET", "POST"])
def session_rename(request: HttpRequest, session_id: object) -> HttpResponse:
    session = _own_session(request, session_id)
    if request.method == "POST":
        title = request.POST.get("title", "")
        if not title.strip():
            return render(
                request,
                "sessions/rename.html",
                {"session": session, "error": "Give the session a title."},
                status=400,
            )
        services.session_rename(session=session, title=title)
        return redirect(_safe_next(request, reverse("chat", args=[session.pk])))
    return render(request, "sessions/rename.html", {"session": session})


@login_required
@require_POST
def session_archive(request: HttpRequest, session_id: object) -> HttpResponse:
    session = _own_session(request, session_id)
    archived = request.POST.get("archived", "1") == "1"
    services.session_archive(session=session, archived=archived)
    messages.success(request, "Session archived." if archived else "Session restored.")
    return redirect(_safe_next(request, reverse("home")))


@login_required
@require_http_methods(["GET", "POST"])
def session_delete(request: HttpRequest, session_id: object) -> HttpResponse:
    session = _own_session(request, session_id)
    if request.method == "POST":
        try:
            services.session_delete(session=session)
        except services.TurnRefused as exc:
            messages.error(request, str(exc))
            return redirect("chat", session_id=session.pk)
        messages.success(request, "Session deleted.")
        return redirect("home")
    return render(request, "sessions/delete.html", {"session": session})


def _download_name(session: Session, extension: str) -> str:
    stem = export._slug(session.title) if session.title else "session"
    return f"{stem}-{str(session.pk)[:8]}.{extension}"


def _guarded(chunks: Iterator[Any]) -> Iterator[Any]:
    """An export stream that ends (truncated, logged) rather than hangs if a stored row
    defeats the exporter: the download stops instead of the browser waiting forever."""
    try:
        yield from chunks
    except Exception:
        logger.exception("export stream failed")


def _attachment_response(response: StreamingHttpResponse, filename: str) -> StreamingHttpResponse:
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_GET
def export_json(request: HttpRequest, session_id: object) -> StreamingHttpResponse:
    session = _own_session(request, session_id)
    response = StreamingHttpResponse(
        _guarded(export.session_json_chunks(session)),
        content_type="application/json; charset=utf-8",
    )
    return _attachment_response(response, _download_name(session, "json"))


@login_required
@require_GET
def export_markdown(request: HttpRequest, session_id: object) -> StreamingHttpResponse:
    session = _own_session(request, session_id)
    response = StreamingHttpResponse(
        _guarded(export.session_markdown_chunks(session)),
        content_type="text/markdown; charset=utf-8",
    )
    return _attachment_response(response, _download_name(session, "md"))


@login_required
@require_GET
def export_all(request: HttpRequest) -> StreamingHttpResponse:
    sessions = Session.objects.filter(owner=request.user).order_by("created_at")
    response = StreamingHttpResponse(
        _guarded(export.archive_chunks(sessions.iterator(chunk_size=100))),
        content_type="application/zip",
    )
    return _attachment_response(response, "openworker-sessions.zip")


@login_required
@require_http_methods(["GET", "POST"])
def session_import(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return render(request, "sessions/import.html")
    upload = request.FILES.get("file")
    error = None
    if upload is None:
        error = "Choose an exported JSON file."
    elif upload.size is None or upload.size > importing.MAX_IMPORT_BYTES:
        error = f"Imports are limited to {importing.MAX_IMPORT_BYTES // (1024 * 1024)} MB."
    else:
        try:
            parsed = importing.parse_import(upload.read(importing.MAX_IMPORT_BYTES + 1))
        except importing.ImportRejected as exc:
            error = str(exc)
    if error is not None:
        return render(request, "sessions/import.html", {"error": error}, status=400)
    model, note = _import_model(request.user, parsed.model)
    session = services.session_import(
        owner=request.user,
        title=parsed.title or "Imported session",
        model=model,
        messages=parsed.messages,
        attachments=parsed.attachments,
        parents=parsed.parents,
        active_leaf=parsed.active_leaf,
    )
    messages.success(request, "Session imported." + (f" {note}" if note else ""))
    return redirect("chat", session_id=session.pk)


def _import_model(user: Any, model: str) -> tuple[str, str]:
    """The exported model if the model policy lets this user run it, else their default
    (the session still imports whole; the page says why the model changed)."""
    if not model:
        return selectors.user_default_model(user=user), ""
    try:
        return services.model_check(user=user, model=model), ""
    except services.TurnRefused as exc:
        fallback = selectors.user_default_model(user=user)
        return fallback, f"It uses {fallback}: {exc}"


@answers_json
@login_required
@require_POST
def attachment_upload(request: HttpRequest, session_id: object) -> JsonResponse:
    session = _own_session(request, session_id)
    declared = int(request.META.get("CONTENT_LENGTH") or 0)
    # Refuse before reading: a huge body never reaches the disk.
    if declared > settings.MAX_ATTACHMENT_BYTES + 64 * 1024:
        return JsonResponse({"error": "The file is too large."}, status=413)
    upload = request.FILES.get("file")
    if upload is None:
        return JsonResponse({"error": "Choose a file to attach."}, status=400)
    try:
        attachment = attachments.attachment_create(
            owner=request.user, session=session, upload=upload
        )
    except attachments.AttachmentRejected as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse(attachments.attachment_payload(attachment), status=201)


@login_required
@require_GET
def attachment_download(
    request: HttpRequest, session_id: object, attachment_id: object
) -> FileResponse:
    session = _own_session(request, session_id)
    attachment = session.attachments.filter(pk=attachment_id, owner=request.user).first()
    if attachment is None:
        raise Http404("No such attachment.")
    response = FileResponse(
        attachment.file.open("rb"), content_type=attachment.mime, filename=attachment.name
    )
    # Never rendered by the browser as a page of ours (an SVG/HTML upload cannot run).
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    return response


@login_required
@require_GET
def workspace_file(request: HttpRequest, session_id: object, path: str) -> FileResponse:
    session = _own_session(request, session_id)
    root = selectors.workspace_root(session.pk)
    try:
        target = workspace_path(root, path)
    except WorkspacePathError:
        raise Http404("No such file.") from None
    if not target.is_file():
        raise Http404("No such file.")
    mime = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
    response = FileResponse(target.open("rb"), as_attachment=True, filename=target.name)
    response["Content-Type"] = mime
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    return response
