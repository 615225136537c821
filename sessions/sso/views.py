"""Sign-in page, the SSO start and callback, and sign-out through the provider.

Views adapt the request and hand the protocol to mozilla-django-oidc's views (configured per
provider) and the account rules to `services`; a failure anywhere renders `sso/error.html`
in plain words with its status, never a 500.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from django.contrib.auth import views as auth_views
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from providers.edge import crypto
from sessions.sso import discovery, policy, selectors
from sessions.sso.backend import (
    REQUEST_FAILURE_ATTR,
    REQUEST_ID_TOKEN_ATTR,
    REQUEST_PROVIDER_ATTR,
    ProviderConfigured,
    provider_settings,
)
from sessions.sso.failures import Failure
from sessions.sso.models import IdentityProvider

log = logging.getLogger(__name__)

# Session keys: which provider a state belongs to, and (after sign-in) which provider and
# the encrypted ID token, for RP-initiated sign-out's id_token_hint.
SESSION_STATES = "sso_states"
SESSION_PROVIDER = "sso_provider"
SESSION_ID_TOKEN = "sso_id_token"  # noqa: S105 (a session key)
LOCAL_FORM_PARAM = "local"


def failure_page(
    request: HttpRequest, failure: Failure, provider: IdentityProvider | None = None
) -> HttpResponse:
    context = {
        "failure": failure.name.lower(),
        "message": failure.message(provider.name if provider else ""),
        "retry_url": reverse("sso:start", args=[provider.slug])
        if provider and failure in _RETRYABLE
        else "",
    }
    return render(request, "sso/error.html", context, status=failure.status)


_RETRYABLE = {Failure.PROVIDER_DOWN, Failure.BAD_STATE, Failure.BAD_TOKEN, Failure.DENIED}


class SignInView(auth_views.LoginView):
    """Django's sign-in, plus a button per provider; the password form hides under require-SSO."""

    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        current = policy.policy_current()
        local_requested = (
            self.request.GET.get(LOCAL_FORM_PARAM) == "1" or self.request.method == "POST"
        )
        context["sso_providers"] = selectors.providers_enabled()
        context["sso_required"] = current.require_sso
        context["password_form_shown"] = not current.require_sso or local_requested
        context["next_query"] = (
            urlencode({"next": context.get("next") or ""}) if context.get("next") else ""
        )
        return context


class SsoStartView(ProviderConfigured, OIDCAuthenticationRequestView):
    """Redirect to the provider's authorization endpoint (state, nonce, PKCE S256)."""

    def __init__(self, **kwargs: Any) -> None:
        # The base reads one provider's endpoints from settings; ours come per request.
        super(OIDCAuthenticationRequestView, self).__init__(**kwargs)
        self._conf = {}

    def get(self, request: HttpRequest, slug: str) -> HttpResponse:  # type: ignore[override]
        provider = selectors.provider_enabled(slug)
        if provider is None:
            return failure_page(request, Failure.UNKNOWN_PROVIDER)
        try:
            meta = discovery.metadata_for(provider.issuer)
        except discovery.ProviderUnavailable as exc:
            log.warning("sso: %s unavailable at start: %s", slug, exc)
            return failure_page(request, Failure.PROVIDER_DOWN, provider)
        try:
            conf = provider_settings(provider, meta)
        except crypto.DecryptionError:
            return failure_page(request, Failure.MISCONFIGURED, provider)
        self.configure(conf)
        self.OIDC_OP_AUTH_ENDPOINT = meta.authorization_endpoint
        self.OIDC_RP_CLIENT_ID = provider.client_id
        response = super().get(request)
        state = parse_qs(urlsplit(response["Location"]).query)["state"][0]
        states = request.session.get(SESSION_STATES) or {}
        # Bounded like mozilla-django-oidc's own state table (OIDC_MAX_STATES).
        states = dict(list(states.items())[-49:])
        states[state] = provider.slug
        request.session[SESSION_STATES] = states
        return response


class SsoCallbackView(ProviderConfigured, OIDCAuthenticationCallbackView):
    """The redirect URI to register: `/sso/callback/` (one for every provider)."""

    def __init__(self, **kwargs: Any) -> None:
        super(OIDCAuthenticationCallbackView, self).__init__(**kwargs)
        self._conf = {"LOGIN_REDIRECT_URL": "home"}
        self.provider: IdentityProvider | None = None

    def get(self, request: HttpRequest) -> HttpResponse:  # type: ignore[override]
        state = request.GET.get("state", "")
        states = dict(request.session.get(SESSION_STATES) or {})
        slug = states.pop(state, None)
        request.session[SESSION_STATES] = states
        self.provider = selectors.provider_enabled(slug) if slug else None
        if self.provider is None or state not in (request.session.get("oidc_states") or {}):
            return failure_page(request, Failure.BAD_STATE, self.provider)
        setattr(request, REQUEST_PROVIDER_ATTR, self.provider)
        if request.GET.get("error"):
            log.info("sso: %s answered error=%s", slug, request.GET.get("error")[:64])
        try:
            return super().get(request)
        except SuspiciousOperation:
            return failure_page(request, Failure.BAD_STATE, self.provider)

    def login_failure(self) -> HttpResponse:
        if self.request.GET.get("error"):
            failure = Failure.DENIED
        else:
            failure = getattr(self.request, REQUEST_FAILURE_ATTR, None) or Failure.BAD_TOKEN
            if getattr(self, "user", None) is not None and not self.user.is_active:
                failure = Failure.DEACTIVATED
        return failure_page(self.request, failure, self.provider)

    def login_success(self) -> HttpResponse:
        response = super().login_success()
        session = self.request.session
        session[SESSION_PROVIDER] = self.provider.slug
        id_token = getattr(self.request, REQUEST_ID_TOKEN_ATTR, "")
        session[SESSION_ID_TOKEN] = crypto.encrypt(id_token) if id_token else ""
        session.pop("oidc_login_next", None)
        return response


def end_session_url(request: HttpRequest) -> str:
    """The provider's RP-initiated logout URL for this browser session, or ""."""
    slug = request.session.get(SESSION_PROVIDER)
    provider = selectors.provider_enabled(slug) if slug else None
    if provider is None:
        return ""
    try:
        meta = discovery.metadata_for(provider.issuer)
    except discovery.ProviderUnavailable:
        return ""  # still sign out here; the provider's session ends on its own
    if not meta.end_session_endpoint:
        return ""
    params = {
        "client_id": provider.client_id,
        "post_logout_redirect_uri": request.build_absolute_uri(reverse("login")),
    }
    token = request.session.get(SESSION_ID_TOKEN)
    if token:
        with contextlib.suppress(crypto.DecryptionError):  # rotated away: sign out without
            params["id_token_hint"] = crypto.decrypt(token)
    return f"{meta.end_session_endpoint}?{urlencode(params)}"


class SignOutView(auth_views.LogoutView):
    """Django's sign-out, then the provider's end-session endpoint when it offers one."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        provider_logout = end_session_url(request)
        response = super().post(request, *args, **kwargs)
        return HttpResponseRedirect(provider_logout) if provider_logout else response
