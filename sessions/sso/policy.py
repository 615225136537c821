"""The sign-in policy: may this person still use a password?"""

from __future__ import annotations

from django.contrib.auth import get_user_model

from sessions.sso.models import SsoPolicy

POLICY_PK = 1


def policy_current() -> SsoPolicy:
    return SsoPolicy.objects.filter(pk=POLICY_PK).first() or SsoPolicy(pk=POLICY_PK)


def password_sign_in_allowed(username: str | None) -> bool:
    """False when SSO is required and `username` is not a named break-glass admin.

    Decided on the submitted username (case as the user model matches it), before any
    password is checked, so the answer says nothing about the password.
    """
    policy = policy_current()
    if not policy.require_sso:
        return True
    if not username:
        return False
    field = get_user_model().USERNAME_FIELD
    return policy.break_glass_users.filter(**{field: username}).exists()
