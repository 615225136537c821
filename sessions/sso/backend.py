"""The OpenID Connect authentication backend: mozilla-django-oidc, one provider per request.

mozilla-django-oidc does the protocol (state, nonce and PKCE in the session, the code
exchange, the ID token's signature against the provider's JWKS, the nonce check). This
subclass adds what it leaves out or fixes in settings: the provider is chosen per request
(`request.sso_provider`, set by the callback view from the state), its endpoints come from
discovery, and the ID token's issuer, audience, expiry and issue time are checked with a
bounded clock skew. Any failure becomes `request.sso_failure` (a `Failure`), never an
exception out of `authenticate()`.
"""

from __future__ import annotations

import logging
from typing import Any

import jwt
import requests
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from providers.edge import crypto
from sessions.sso import discovery
from sessions.sso.failures import Failure, SignInRefused
from sessions.sso.models import IdentityProvider
from sessions.sso.services import sso_user_sign_in

log = logging.getLogger(__name__)

# Clocks differ between us and the provider; a minute is what most RPs allow, and far
# shorter than any ID token's lifetime.
CLOCK_SKEW_SECONDS = 60
# Asymmetric only: an HS256 token would be "signed" with the client secret, which the
# provider's JWKS cannot vouch for. (RS* and ES* are the families mozilla-django-oidc
# verifies against the JWKS.)
ACCEPTED_ALGS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512")
REQUEST_PROVIDER_ATTR = "sso_provider"
REQUEST_FAILURE_ATTR = "sso_failure"
REQUEST_ID_TOKEN_ATTR = "sso_id_token"  # noqa: S105 (an attribute name)


def is_sso_attempt(request: Any, credentials: dict[str, Any] | None = None) -> bool:
    """django-axes' whitelist (AXES_WHITELIST_CALLABLE): an SSO callback is no password guess.

    Its failures carry no username, so axes would count them all against (no username,
    client IP): a wrong client secret would lock a whole office out of SSO for the
    cool-off period, even after the admin fixed it. Replaying a callback gains nothing
    (state is single-use), so there is nothing to throttle.
    """
    return getattr(request, REQUEST_PROVIDER_ATTR, None) is not None


def provider_settings(
    provider: IdentityProvider, meta: discovery.ProviderMetadata
) -> dict[str, Any]:
    """mozilla-django-oidc's settings for one provider (it reads them through get_settings)."""
    alg = next((a for a in meta.signing_algs if a in ACCEPTED_ALGS), "RS256")
    return {
        "OIDC_OP_AUTHORIZATION_ENDPOINT": meta.authorization_endpoint,
        "OIDC_OP_TOKEN_ENDPOINT": meta.token_endpoint,
        "OIDC_OP_USER_ENDPOINT": meta.userinfo_endpoint,
        "OIDC_OP_JWKS_ENDPOINT": meta.jwks_uri,
        "OIDC_RP_CLIENT_ID": provider.client_id,
        "OIDC_RP_CLIENT_SECRET": provider.client_secret(),
        "OIDC_RP_SIGN_ALGO": alg,
        "OIDC_RP_SCOPES": provider.scopes,
        "OIDC_USE_NONCE": True,
        "OIDC_USE_PKCE": True,
        "OIDC_PKCE_CODE_CHALLENGE_METHOD": "S256",
        "OIDC_AUTHENTICATION_CALLBACK_URL": "sso:callback",
        "OIDC_TIMEOUT": discovery.HTTP_TIMEOUT_SECONDS,
        "OIDC_TOKEN_USE_BASIC_AUTH": "client_secret_post" not in meta.token_auth_methods,
        "OIDC_VERIFY_KID": True,
        "OIDC_ALLOW_UNSECURED_JWT": False,
        "OIDC_CREATE_USER": True,
    }


class ProviderConfigured:
    """Mixin: `get_settings` answers from one provider's settings (set by `configure`)."""

    _conf: dict[str, Any]

    def configure(self, conf: dict[str, Any]) -> None:
        self._conf = conf

    def get_settings(self, attr: str, *args: Any) -> Any:  # type: ignore[override]
        if attr in self._conf:
            return self._conf[attr]
        if args:
            return args[0]
        raise KeyError(attr)


class OidcBackend(ProviderConfigured, OIDCAuthenticationBackend):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The base reads a single provider from settings here; ours is known per request.
        self.UserModel = get_user_model()
        self._conf = {}

    def authenticate(self, request: Any, **kwargs: Any) -> Any:
        provider = getattr(request, REQUEST_PROVIDER_ATTR, None) if request else None
        if provider is None or "nonce" not in kwargs:
            return None  # a password sign-in, or another flow: not ours
        try:
            meta = discovery.metadata_for(provider.issuer)
            self._provider, self._meta = provider, meta
            self.configure(provider_settings(provider, meta))
            for name in (
                "OP_TOKEN_ENDPOINT",
                "OP_USER_ENDPOINT",
                "OP_JWKS_ENDPOINT",
                "RP_CLIENT_ID",
                "RP_CLIENT_SECRET",
                "RP_SIGN_ALGO",
            ):
                setattr(self, f"OIDC_{name}", self._conf[f"OIDC_{name}"])
            self.OIDC_RP_IDP_SIGN_KEY = None
            return super().authenticate(request, **kwargs)
        except SignInRefused as exc:
            failure = exc.failure
        except crypto.DecryptionError:
            failure = Failure.MISCONFIGURED
        except discovery.ProviderUnavailable:
            failure = Failure.PROVIDER_DOWN
        except requests.HTTPError as exc:
            status = exc.response.status_code if exc.response is not None else 0
            # RFC 6749 §5.2: a bad client secret is `invalid_client`, 401 (or 400).
            body = exc.response.text if exc.response is not None else ""
            failure = (
                Failure.CLIENT_REJECTED
                if status == 401 or "invalid_client" in body
                else Failure.BAD_TOKEN
                if 400 <= status < 500
                else Failure.PROVIDER_DOWN
            )
        except requests.RequestException:
            failure = Failure.PROVIDER_DOWN
        except (SuspiciousOperation, jwt.InvalidTokenError, KeyError, ValueError) as exc:
            log.warning("sso: %s token refused: %s", provider.slug, exc)
            failure = Failure.BAD_TOKEN
        log.info("sso: sign-in through %s failed: %s", provider.slug, failure.name)
        setattr(request, REQUEST_FAILURE_ATTR, failure)
        return None

    def verify_token(self, token: str, **kwargs: Any) -> Any:
        # The provider may sign with any algorithm it advertises that we accept; fixing one
        # in advance would refuse a provider that rotated to another.
        alg = jwt.get_unverified_header(token).get("alg")
        if alg not in ACCEPTED_ALGS or alg not in self._meta.signing_algs:
            raise SuspiciousOperation(f"ID token signed with {alg!r}")
        self.OIDC_RP_SIGN_ALGO = alg
        return super().verify_token(token, **kwargs)

    def _verify_jws(self, payload: str, key: Any) -> dict[str, Any]:
        """Signature plus the ID token's own claims (OIDC Core §3.1.3.7), skew bounded."""
        alg = jwt.get_unverified_header(payload).get("alg")
        if alg not in ACCEPTED_ALGS or alg != self.OIDC_RP_SIGN_ALGO:
            raise SuspiciousOperation(f"ID token signed with {alg!r}")
        try:
            claims = jwt.decode(
                payload,
                key,
                algorithms=[alg],
                audience=self.OIDC_RP_CLIENT_ID,
                issuer=self._meta.issuer,
                leeway=CLOCK_SKEW_SECONDS,
                options={"require": ["iss", "aud", "exp", "iat", "sub"]},
            )
        except jwt.InvalidTokenError as exc:
            raise SuspiciousOperation(f"ID token invalid: {type(exc).__name__}") from None
        # §3.1.3.7 (4, 5): a token for several audiences must name us as its authorized party.
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        if len(audiences) > 1 and claims.get("azp") != self.OIDC_RP_CLIENT_ID:
            raise SuspiciousOperation("ID token for several audiences without our azp")
        return claims

    def store_tokens(self, access_token: str, id_token: str) -> None:
        # Kept on the request only: the view encrypts it into the session for sign-out.
        setattr(self.request, REQUEST_ID_TOKEN_ATTR, id_token)

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        claims = dict(payload)
        if self._meta.userinfo_endpoint:
            info = self.get_userinfo(access_token, id_token, payload)
            # OIDC Core §5.3.2: userinfo for another subject must not be used.
            if str(info.get("sub")) != str(payload["sub"]):
                raise SuspiciousOperation("userinfo names another subject")
            claims = {**info, **payload}
        return sso_user_sign_in(provider=self._provider, claims=claims)

    def get_user(self, user_id: Any) -> Any:
        # As ModelBackend: a user deactivated here is signed out at their next request.
        user = super().get_user(user_id)
        return user if user is not None and user.is_active else None
