from __future__ import annotations

from django.urls import path

from sessions import views

urlpatterns = [
    path("", views.home, name="home"),
    path(
        "sessions/<uuid:session_id>/attachments/",
        views.attachment_upload,
        name="attachment_upload",
    ),
    path(
        "sessions/<uuid:session_id>/attachments/<uuid:attachment_id>",
        views.attachment_download,
        name="attachment_download",
    ),
    path(
        "sessions/<uuid:session_id>/files/<path:path>",
        views.workspace_file,
        name="workspace_file",
    ),
]
