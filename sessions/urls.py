from __future__ import annotations

from django.urls import path

from sessions import views, workspace_views

urlpatterns = [
    path("", views.home, name="home"),
    path("favicon.ico", workspace_views.favicon, name="favicon"),
    path("sessions/search", workspace_views.sidebar_search, name="sidebar_search"),
    path("account/theme", workspace_views.theme, name="theme"),
    path("sessions/<uuid:session_id>/pin", workspace_views.session_pin, name="session_pin"),
    path("sessions/<uuid:session_id>/title", workspace_views.session_title, name="session_title"),
    path(
        "sessions/<uuid:session_id>/archive.json",
        workspace_views.session_archive_json,
        name="session_archive_json",
    ),
    path(
        "sessions/<uuid:session_id>/delete.json",
        workspace_views.session_delete_json,
        name="session_delete_json",
    ),
    path(
        "sessions/<uuid:session_id>/turns/<uuid:turn_id>/footer",
        workspace_views.turn_footer,
        name="turn_footer",
    ),
    path(
        "sessions/<uuid:session_id>/files/",
        workspace_views.workspace_files,
        name="workspace_files",
    ),
    path("sessions/new", views.session_new, name="session_new"),
    path("sessions/import", views.session_import, name="session_import"),
    path("sessions/export.zip", views.export_all, name="export_all"),
    path("sessions/<uuid:session_id>/", views.chat, name="chat"),
    path("sessions/<uuid:session_id>/messages", views.session_messages, name="session_messages"),
    path("sessions/<uuid:session_id>/model", views.session_model, name="session_model"),
    path("sessions/<uuid:session_id>/rename", views.session_rename, name="session_rename"),
    path("sessions/<uuid:session_id>/archive", views.session_archive, name="session_archive"),
    path("sessions/<uuid:session_id>/delete", views.session_delete, name="session_delete"),
    path("sessions/<uuid:session_id>/export.json", views.export_json, name="export_json"),
    path("sessions/<uuid:session_id>/export.md", views.export_markdown, name="export_markdown"),
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
