from __future__ import annotations

from django.urls import path

from sessions.mcp import views

urlpatterns = [
    path(
        "sessions/<uuid:session_id>/tools/",
        views.session_mcp_servers,
        name="session_mcp_servers",
    ),
]
