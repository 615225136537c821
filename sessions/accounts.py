"""Account actions admins take on users: deactivate, invite by link, reset-password link.

Links carry Django's password-reset token: signed with SECRET_KEY, expiring after
`PASSWORD_RESET_TIMEOUT`, and single-use because the token hashes the password, which
setting a password changes. An invited user has an unusable password until they follow
the link, so they cannot sign in before choosing one.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.tokens import default_token_generator
from django.contrib.sessions.models import Session as BrowserSession
from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from openworker.runtime.turns import commands
from sessions.audit import audit_record
from sessions.models import AuditLog, Turn


def set_password_path(user: Any) -> str:
    """Path of the single-use, expiring link where `user` chooses a password."""
    uidb64 = urlsafe_base64_encode(force_bytes(user.pk))
    token = default_token_generator.make_token(user)
    return reverse("account_set_password", kwargs={"uidb64": uidb64, "token": token})


def user_invite(
    *, actor: Any, username: str, email: str = "", groups: Any = (), is_staff: bool = False
) -> tuple[Any, str]:
    """Create an account without a usable password; return it and its invite link path."""
    user_model = get_user_model()
    with transaction.atomic():
        user = user_model(username=username, email=email, is_staff=is_staff)
        user.set_unusable_password()
        user.save()
        if groups:
            user.groups.set(groups)
        audit_record(actor=actor, action=AuditLog.Action.INVITE, target_user=user)
    return user, set_password_path(user)


def user_password_reset_link(*, actor: Any, user: Any) -> str:
    """A set-password link for an existing user (the old password keeps working until used)."""
    audit_record(actor=actor, action=AuditLog.Action.PASSWORD_RESET, target_user=user)
    return set_password_path(user)


def user_deactivate(*, actor: Any, user: Any, reason: str = "") -> int:
    """Deactivate `user`: no sign-in, browser sessions deleted, open sockets closed, running
    turns stopped. Returns the number of turns asked to stop.

    Saving `is_active=False` makes `sessions.signals` publish `account.closed` to every
    socket of the user once the transaction commits.
    """
    with transaction.atomic():
        user.is_active = False
        user.save(update_fields=["is_active"])
        _delete_browser_sessions(user.pk)
        audit_record(
            actor=actor, action=AuditLog.Action.DEACTIVATE, target_user=user, reason=reason
        )
    stopped = 0
    for turn in Turn.objects.filter(session__owner_id=user.pk, status__in=Turn.ACTIVE):
        commands.turn_request_stop(turn=turn)
        stopped += 1
    return stopped


def _delete_browser_sessions(user_id: Any) -> None:
    """Delete the database-backed browser sessions signed in as `user_id`.

    Session data is encoded, so each live row is decoded to find its user; deactivation is
    rare and admin-initiated, so a scan of unexpired sessions is acceptable.
    """
    wanted = str(user_id)
    doomed = [
        row.pk
        for row in BrowserSession.objects.filter(expire_date__gt=timezone.now()).iterator()
        if str(row.get_decoded().get("_auth_user_id")) == wanted
    ]
    BrowserSession.objects.filter(pk__in=doomed).delete()
