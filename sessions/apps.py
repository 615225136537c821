from __future__ import annotations

from django.apps import AppConfig


class ChatSessionsConfig(AppConfig):
    name = "sessions"
    # `django.contrib.sessions` already owns the label "sessions".
    label = "chat_sessions"
    verbose_name = "Chat sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from sessions import signals  # noqa: F401 - connects the receivers
