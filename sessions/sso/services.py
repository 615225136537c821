"""What a verified sign-in does here: find or make the account, then sync its teams.

Called with claims the backend has already verified (signature, issuer, audience, expiry,
nonce). Accounts are linked by (issuer, sub), never by email alone: an email links an
existing local account only when the provider says it is verified and the admin allowed
linking for that provider.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from openworker.runtime.live import events
from sessions.signals import ACCOUNT_CLOSED
from sessions.sso.failures import Failure, SignInRefused
from sessions.sso.models import GroupMapping, IdentityProvider, SsoIdentity

log = logging.getLogger(__name__)

USERNAME_MAX = 150
# Django's username validator accepts letters, digits and @.+-_ ; anything else becomes "-".
_USERNAME_UNSAFE = re.compile(r"[^\w.@+-]")


def claim_groups(claims: dict[str, Any], claim: str) -> set[str]:
    """The provider groups in `claim`: a list of names, or one space/comma-separated string."""
    value = claims.get(claim)
    if isinstance(value, str):
        return {part for part in re.split(r"[,\s]+", value) if part}
    if isinstance(value, Iterable):
        return {str(part) for part in value if str(part)}
    return set()


def _username_for(claims: dict[str, Any]) -> str:
    User = get_user_model()
    email = str(claims.get("email") or "")
    base = str(claims.get("preferred_username") or email.split("@")[0] or claims["sub"])
    base = _USERNAME_UNSAFE.sub("-", base)[: USERNAME_MAX - 8] or "user"
    candidate, n = base, 1
    while User.objects.filter(username__iexact=candidate).exists():
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def _linkable_account(provider: IdentityProvider, claims: dict[str, Any]) -> Any:
    email = str(claims.get("email") or "").strip()
    if not email:
        return None
    User = get_user_model()
    existing = list(User.objects.filter(email__iexact=email)[:2])
    if not existing:
        return None
    verified = claims.get("email_verified") is True
    if len(existing) > 1 or not (provider.link_by_verified_email and verified):
        raise SignInRefused(Failure.LINK_NOT_ALLOWED, f"local account with {len(existing)} match")
    return existing[0]


def _apply_profile(user: Any, claims: dict[str, Any]) -> list[str]:
    changed = []
    for field, claim in (
        ("email", "email"),
        ("first_name", "given_name"),
        ("last_name", "family_name"),
    ):
        value = claims.get(claim)
        if isinstance(value, str) and value and getattr(user, field) != value[:150]:
            setattr(user, field, value[:150])
            changed.append(field)
    return changed


def user_sockets_close(user_id: int) -> None:
    """After commit, every open socket of the user closes (their teams changed)."""
    transaction.on_commit(lambda: events.publish_user(user_id, {"type": ACCOUNT_CLOSED}))


def teams_sync(*, user: Any, provider: IdentityProvider, provider_groups: set[str]) -> bool:
    """Make the user's mapped teams match their provider groups; True if a team was lost.

    Only teams some mapping of this provider names are touched: a team the admin gave by
    hand stays.
    """
    mappings = list(
        GroupMapping.objects.filter(provider=provider).values_list("claim_value", "group_id")
    )
    managed = {group_id for _, group_id in mappings}
    wanted = {group_id for value, group_id in mappings if value in provider_groups}
    current = set(user.groups.filter(id__in=managed).values_list("id", flat=True))
    if wanted - current:
        user.groups.add(*(wanted - current))
    lost = current - wanted
    if lost:
        user.groups.remove(*lost)
        user_sockets_close(user.pk)
    return bool(lost)


def _first_sign_in(provider: IdentityProvider, claims: dict[str, Any], subject: str) -> SsoIdentity:
    with transaction.atomic():  # a savepoint: a lost race rolls back only this
        user = _linkable_account(provider, claims)
        if user is None:
            User = get_user_model()
            user = User(username=_username_for(claims))
            user.set_unusable_password()
            _apply_profile(user, claims)
            user.save()
            log.info("sso: created user %s from %s", user.pk, provider.slug)
        else:
            log.info("sso: linked existing user %s to %s by verified email", user.pk, provider.slug)
        return SsoIdentity.objects.create(
            user=user, provider=provider, issuer=provider.issuer, subject=subject
        )


@transaction.atomic
def sso_user_sign_in(*, provider: IdentityProvider, claims: dict[str, Any]) -> AbstractBaseUser:
    """The local account for these verified claims, created or linked on first sign-in."""
    subject = str(claims["sub"])
    identity = (
        SsoIdentity.objects.select_for_update()
        .select_related("user")
        .filter(issuer=provider.issuer, subject=subject)
        .first()
    )
    if identity is None:
        try:
            identity = _first_sign_in(provider, claims, subject)
        except IntegrityError:
            # The same person's other tab won the race (or a username was taken meanwhile):
            # use the link it made, or let them simply try again.
            identity = (
                SsoIdentity.objects.select_related("user")
                .filter(issuer=provider.issuer, subject=subject)
                .first()
            )
            if identity is None:
                raise SignInRefused(Failure.BAD_STATE, "first sign-in raced") from None
    user = identity.user
    if not user.is_active:
        raise SignInRefused(Failure.DEACTIVATED, f"user {user.pk} inactive")

    changed = _apply_profile(user, claims)
    groups = claim_groups(claims, provider.groups_claim)
    if provider.staff_group and not user.is_superuser:
        is_staff = provider.staff_group in groups
        if user.is_staff != is_staff:
            user.is_staff = is_staff
            changed.append("is_staff")
    if changed:
        user.save(update_fields=changed)
    teams_sync(user=user, provider=provider, provider_groups=groups)
    identity.provider = provider
    identity.last_sign_in_at = timezone.now()
    identity.save(update_fields=["provider", "last_sign_in_at"])
    return user
