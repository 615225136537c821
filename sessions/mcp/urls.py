from __future__ import annotations

from django.urls import path

from sessions.mcp import views

urlpatterns = [
    path(
        "sessions/<uuid:session_id>/tools/",
        views.session_mcp_servers,
        name="session_mcp_servers",
    ),
    path(
        "settings/connections/<int:server_id>/connect",
        views.mcp_connect,
        name="mcp_connect",
    ),
    path("settings/connections/callback", views.mcp_oauth_callback, name="mcp_oauth_callback"),
    path(
        "settings/connections/<int:server_id>/disconnect",
        views.mcp_disconnect,
        name="mcp_disconnect",
    ),
]
