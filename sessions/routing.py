from __future__ import annotations

from django.urls import re_path

from sessions.consumers import SessionConsumer

websocket_urlpatterns = [
    re_path(r"^ws/sessions/(?P<session_id>[0-9a-fA-F-]{36})/$", SessionConsumer.as_asgi()),
]
