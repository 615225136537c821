"""HTTP views of chat sessions. They adapt requests and call services and selectors;
every session URL answers 404 to anyone but its owner."""

from __future__ import annotations

import mimetypes

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from openworker.tools.workspace import WorkspacePathError, workspace_path
from sessions import attachments, selectors
from sessions.models import Session


def _own_session(request: HttpRequest, session_id: object) -> Session:
    session = selectors.session_get_for_user(session_id=str(session_id), user=request.user)
    if session is None:
        raise Http404("No such session.")
    return session


@login_required
def home(request: HttpRequest) -> HttpResponse:
    sessions = selectors.session_list(user=request.user)[:50]
    return render(request, "sessions/home.html", {"sessions": sessions})


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
