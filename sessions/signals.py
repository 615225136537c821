"""Close a user's open sockets when their sign-in stops being valid.

A websocket authenticates once, at the handshake; without this it would outlive a
sign-out, a password change or a deactivation. Sign-out closes the sockets of that
browser session only; a password change or deactivation closes every socket of the user.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import pre_save
from django.dispatch import receiver

from openworker.runtime.live import events

ACCOUNT_CLOSED = "account.closed"


def _close_sockets(user_id: Any, session_key: str | None = None) -> None:
    event: dict[str, Any] = {"type": ACCOUNT_CLOSED}
    if session_key:
        event["session_key"] = session_key
    transaction.on_commit(lambda: events.publish_user(user_id, event))


@receiver(user_logged_out)
def _on_logout(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is not None:
        key = getattr(getattr(request, "session", None), "session_key", None)
        _close_sockets(user.pk, key)


@receiver(pre_save, sender=get_user_model())
def _on_credentials_change(sender: Any, instance: Any, **kwargs: Any) -> None:
    if instance.pk is None:
        return
    before = sender.objects.filter(pk=instance.pk).values("password", "is_active").first()
    if before is None:
        return
    if before["password"] != instance.password or (before["is_active"] and not instance.is_active):
        _close_sockets(instance.pk)
