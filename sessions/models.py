"""The product's data: chat sessions and (as the turn engine lands) their transcripts."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class Session(models.Model):
    """One conversation between a user and the agent."""

    # Random ids: a session URL is not a counter anyone can walk (access is still checked).
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_sessions"
    )
    title = models.CharField(max_length=200, blank=True)
    model = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["owner", "-updated_at"], name="session_owner_recent")]

    def __str__(self) -> str:
        return self.title or f"Session {self.id}"
