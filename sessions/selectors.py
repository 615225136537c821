"""Reads of chat sessions. Every user-facing read is scoped to an owner: another user's
id is a 404, never a 403 that confirms it exists."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from sessions.models import CompactionCheckpoint, Message, Session, Turn


def session_list(*, user: AbstractBaseUser) -> QuerySet[Session]:
    return Session.objects.filter(owner=user).order_by("-updated_at")


def _uuid(value: object) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def session_get_for_user(*, session_id: str | uuid.UUID, user: AbstractBaseUser) -> Session | None:
    """The session if `user` owns it, else None (never reveals that it exists)."""
    if not getattr(user, "is_authenticated", False):
        return None
    key = _uuid(session_id)
    if key is None:
        return None
    return Session.objects.filter(pk=key, owner=user).first()


def turn_get_for_session(*, session: Session, turn_id: object) -> Turn | None:
    key = _uuid(turn_id)
    if key is None:
        return None
    return Turn.objects.filter(pk=key, session=session).first()


def session_messages(*, session_id: uuid.UUID | str) -> list[Message]:
    return list(Message.objects.filter(session_id=session_id).order_by("seq"))


def session_history(*, session_id: uuid.UUID | str) -> list[dict[str, Any]]:
    """The canonical transcript as dicts, in order."""
    return [m.to_canonical() for m in session_messages(session_id=session_id)]


def active_turns(*, session: Session) -> list[Turn]:
    return list(Turn.objects.filter(session=session, status__in=Turn.ACTIVE).order_by("created_at"))


def message_payload(message: Message) -> dict[str, Any]:
    """A message as it travels on the socket (JSON types only; no provider sidecars)."""
    return {
        "seq": message.seq,
        "role": message.role,
        "content": message.content,
        "tool_calls": message.tool_calls or [],
        "tool_call_id": message.tool_call_id,
        "reasoning": message.reasoning,
        "tool": (message.extras or {}).get("tool") if message.role == "tool" else None,
        "is_error": bool((message.extras or {}).get("is_error"))
        if message.role == "tool"
        else False,
        "usage": message.usage,
        "model": message.model,
        "finish_reason": message.finish_reason,
        "turn": str(message.turn_id) if message.turn_id else None,
    }


def workspace_root(session_id: uuid.UUID | str) -> Path:
    return Path(settings.MEDIA_ROOT) / "workspaces" / str(session_id)


def checkpoint_payload(checkpoint: CompactionCheckpoint) -> dict[str, Any]:
    return {
        "id": checkpoint.pk,
        "boundary_seq": checkpoint.boundary_seq,
        "summary": checkpoint.summary,
        "tokens_before": checkpoint.tokens_before,
        "tokens_after": checkpoint.tokens_after,
    }


def session_checkpoints(*, session: Session) -> list[CompactionCheckpoint]:
    return list(CompactionCheckpoint.objects.filter(session=session).order_by("created_at"))
