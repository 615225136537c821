"""Reads of chat sessions. Every read is scoped to an owner: another user's id is a 404."""

from __future__ import annotations

import uuid

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from sessions.models import Session


def session_list(*, user: AbstractBaseUser) -> QuerySet[Session]:
    return Session.objects.filter(owner=user).order_by("-updated_at")


def session_get_for_user(*, session_id: str | uuid.UUID, user: AbstractBaseUser) -> Session | None:
    """The session if `user` owns it, else None (never reveals that it exists)."""
    if not getattr(user, "is_authenticated", False):
        return None
    try:
        key = uuid.UUID(str(session_id))
    except ValueError:
        return None
    return Session.objects.filter(pk=key, owner=user).first()
