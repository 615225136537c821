"""Writes of the chat workspace page: pinning a session and the user's theme."""

from __future__ import annotations

from typing import Any

from sessions.models import Session, UserPreferences


def session_pin(*, session: Session, pinned: bool) -> Session:
    session.pinned = pinned
    # Not `updated_at`: pinning is not activity, so the session keeps its age group.
    Session.objects.filter(pk=session.pk).update(pinned=pinned)
    return session


def theme_set(*, user: Any, theme: str) -> str:
    """Remember the user's theme (system / light / dark); an unknown value is refused."""
    if theme not in UserPreferences.Theme.values:
        raise ValueError("Choose system, light or dark.")
    UserPreferences.objects.update_or_create(user=user, defaults={"theme": theme})
    return theme
