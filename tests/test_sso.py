"""Sign-in through a real OpenID Provider (oidc-provider on loopback), end to end.

The Django test client plays our side, an httpx client plays the person's browser at the
provider and answers its own login and consent pages: no part of the protocol is faked.
"""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlsplit

import httpx
import jwt
import pytest
from asgiref.sync import async_to_sync
from axes.models import AccessAttempt
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import SuspiciousOperation

from openworker.runtime.live import events
from sessions.sso import discovery
from sessions.sso.backend import OidcBackend, provider_settings
from sessions.sso.models import GroupMapping, SsoIdentity, SsoPolicy
from tests.oidc.provider import drive, rsa_jwk

# The real OP and its row here (fixtures `oidc_op`, `idp`).
pytest_plugins = ("tests.oidc.fixtures",)

User = get_user_model()


def start(client, slug="corp", **params):  # type: ignore[no-untyped-def]
    response = client.get(f"/sso/{slug}/start/", params)
    assert response.status_code == 302, response.content[:500]
    return response["Location"]


def sign_in(client, op, login, **kw):  # type: ignore[no-untyped-def]
    authorize = start(client)
    with op.browser() as browser:
        callback = drive(browser, authorize, login=login, **kw)
    parts = urlsplit(callback)
    return client.get(parts.path, parse_qs(parts.query))


def test_authorize_request_uses_pkce_state_and_nonce(client, idp, oidc_op):
    query = parse_qs(urlsplit(start(client)).query)
    assert query["code_challenge_method"] == ["S256"]
    assert len(query["code_challenge"][0]) >= 43
    assert query["state"] and query["nonce"]
    assert query["redirect_uri"] == ["http://testserver/sso/callback/"]


def test_first_sign_in_creates_the_account_linked_by_issuer_and_sub(client, idp, oidc_op):
    oidc_op.set_account("ada", email="ada@corp.test", email_verified=True, given_name="Ada")
    response = sign_in(client, oidc_op, "ada")
    assert response.status_code == 302 and response["Location"] == "/"
    identity = SsoIdentity.objects.get(issuer=oidc_op.issuer, subject="ada")
    assert identity.user.email == "ada@corp.test" and identity.user.first_name == "Ada"
    assert not identity.user.has_usable_password()
    assert client.get("/").status_code == 200


def test_returning_sign_in_reuses_the_same_account(client, idp, oidc_op):
    oidc_op.set_account("bob", email="bob@corp.test", email_verified=True)
    sign_in(client, oidc_op, "bob")
    first = SsoIdentity.objects.get(subject="bob").user_id
    client.logout()
    oidc_op.set_account("bob", email="bob.new@corp.test", email_verified=True)
    assert sign_in(client, oidc_op, "bob").status_code == 302
    assert User.objects.filter(sso_identities__subject="bob").count() == 1
    assert User.objects.get(pk=first).email == "bob.new@corp.test"


def test_existing_local_account_is_linked_only_by_verified_email_when_allowed(client, idp, oidc_op):
    local = User.objects.create_user("carol", "carol@corp.test", "pw-carol-123")
    oidc_op.set_account("carol-sub", email="carol@corp.test", email_verified=True)
    refused = sign_in(client, oidc_op, "carol-sub")
    assert refused.status_code == 403 and b"already exists" in refused.content
    assert not SsoIdentity.objects.exists()

    idp.link_by_verified_email = True
    idp.save()
    oidc_op.set_account("carol-sub", email="carol@corp.test", email_verified=False)
    assert sign_in(client, oidc_op, "carol-sub").status_code == 403

    oidc_op.set_account("carol-sub", email="carol@corp.test", email_verified=True)
    assert sign_in(client, oidc_op, "carol-sub").status_code == 302
    assert SsoIdentity.objects.get(subject="carol-sub").user_id == local.pk


def test_group_claims_map_to_teams_and_a_removed_group_loses_the_team(
    client, idp, oidc_op, django_capture_on_commit_callbacks
):
    eng, ops, manual = (Group.objects.create(name=n) for n in ("Engineering", "Ops", "Manual"))
    GroupMapping.objects.create(provider=idp, claim_value="eng", group=eng)
    GroupMapping.objects.create(provider=idp, claim_value="ops", group=ops)
    idp.staff_group = "admins"
    idp.save()
    oidc_op.set_account("dan", email="dan@corp.test", groups=["eng", "ops", "admins"])
    sign_in(client, oidc_op, "dan")
    dan = User.objects.get(sso_identities__subject="dan")
    assert set(dan.groups.values_list("name", flat=True)) == {"Engineering", "Ops"}
    assert dan.is_staff
    dan.groups.add(manual)  # given by hand: not the provider's to take away

    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(events.user_group(dan.pk), channel)
    client.logout()
    oidc_op.set_account("dan", email="dan@corp.test", groups=["eng"])
    with django_capture_on_commit_callbacks(execute=True):
        sign_in(client, oidc_op, "dan")
    dan.refresh_from_db()
    assert set(dan.groups.values_list("name", flat=True)) == {"Engineering", "Manual"}
    assert not dan.is_staff
    message = async_to_sync(layer.receive)(channel)
    assert message["event"]["type"] == "account.closed"


def test_require_sso_refuses_passwords_except_for_break_glass_admins(client, idp, oidc_op):
    User.objects.create_user("eve", "eve@corp.test", "pw-eve-12345")
    root = User.objects.create_superuser("root", "root@corp.test", "pw-root-12345")
    policy = SsoPolicy.objects.create(pk=1, require_sso=True)
    policy.break_glass_users.add(root)

    page = client.get("/accounts/login/").content.decode()
    assert "Sign in with Corp ID" in page and 'name="password"' not in page
    assert 'name="password"' in client.get("/accounts/login/?local=1").content.decode()

    refused = client.post("/accounts/login/", {"username": "eve", "password": "pw-eve-12345"})
    assert refused.status_code == 200 and "_auth_user_id" not in client.session
    assert b"open only to the named administrators" in refused.content
    assert not client.login(username="eve", password="pw-eve-12345")
    admin_refused = client.post("/admin/login/", {"username": "eve", "password": "pw-eve-12345"})
    assert "_auth_user_id" not in client.session and admin_refused.status_code == 200

    allowed = client.post("/accounts/login/", {"username": "root", "password": "pw-root-12345"})
    assert allowed.status_code == 302 and client.session["_auth_user_id"] == str(root.pk)


def test_sign_out_ends_the_local_session_and_goes_to_the_providers_end_session(
    client, idp, oidc_op
):
    oidc_op.set_account("fay", email="fay@corp.test")
    sign_in(client, oidc_op, "fay")
    response = client.post("/accounts/logout/")
    assert "_auth_user_id" not in client.session
    location = urlsplit(response["Location"])
    assert f"{location.scheme}://{location.netloc}" == oidc_op.issuer
    query = parse_qs(location.query)
    assert query["post_logout_redirect_uri"] == ["http://testserver/accounts/login/"]
    claims = jwt.decode(query["id_token_hint"][0], options={"verify_signature": False})
    assert claims["sub"] == "fay"
    # The provider accepts it (a real RP-initiated logout page, not an error).
    ended = httpx.get(response["Location"])
    assert ended.status_code == 200, ended.text[:800]
    assert "logout" in ended.text.lower()


def test_a_user_deactivated_here_cannot_sign_in_through_the_provider(client, idp, oidc_op):
    oidc_op.set_account("gus", email="gus@corp.test")
    sign_in(client, oidc_op, "gus")
    client.logout()
    User.objects.filter(sso_identities__subject="gus").update(is_active=False)
    response = sign_in(client, oidc_op, "gus")
    assert response.status_code == 403 and b"deactivated" in response.content
    assert "_auth_user_id" not in client.session


def test_a_deactivated_users_open_sso_session_ends_at_the_next_request(client, idp, oidc_op):
    oidc_op.set_account("gil", email="gil@corp.test")
    sign_in(client, oidc_op, "gil")
    assert client.get("/").status_code == 200
    gil = User.objects.get(sso_identities__subject="gil")
    gil.is_active = False
    gil.save()
    response = client.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_sign_in_returns_to_a_local_next_page_never_to_another_site(client, idp, oidc_op):
    oidc_op.set_account("ned", email="ned@corp.test")
    for next_url, landing in (("/settings/", "/settings/"), ("https://evil.test/", "/")):
        authorize = start(client, next=next_url)
        with oidc_op.browser() as browser:
            callback = drive(browser, authorize, login="ned")
        parts = urlsplit(callback)
        assert client.get(parts.path, parse_qs(parts.query))["Location"] == landing
        client.logout()


def test_a_wrong_state_is_a_plain_page_not_a_sign_in(client, idp, oidc_op):
    oidc_op.set_account("hal", email="hal@corp.test")
    authorize = start(client)
    with oidc_op.browser() as browser:
        callback = drive(browser, authorize, login="hal")
    query = parse_qs(urlsplit(callback).query)
    query["state"] = ["forged-state"]
    response = client.get("/sso/callback/", query)
    assert response.status_code == 400 and b"start again" in response.content
    assert b"Back to the sign-in page" in response.content
    assert "_auth_user_id" not in client.session


def test_a_wrong_nonce_is_refused(client, idp, oidc_op):
    oidc_op.set_account("ivy", email="ivy@corp.test")
    authorize = start(client)
    session = client.session
    state = parse_qs(urlsplit(authorize).query)["state"][0]
    states = session["oidc_states"]
    states[state]["nonce"] = "not-the-nonce-the-provider-saw"
    session["oidc_states"] = states
    session.save()
    with oidc_op.browser() as browser:
        callback = drive(browser, authorize, login="ivy")
    parts = urlsplit(callback)
    response = client.get(parts.path, parse_qs(parts.query))
    assert response.status_code == 400 and b"could not be verified" in response.content
    assert not SsoIdentity.objects.exists()


def test_denied_consent_is_a_plain_page(client, idp, oidc_op):
    oidc_op.set_account("jay", email="jay@corp.test")
    response = sign_in(client, oidc_op, "jay", consent=False)
    assert response.status_code == 403 and b"cancelled or refused" in response.content


def test_a_wrong_client_secret_is_a_plain_page(client, idp, oidc_op):
    idp.set_client_secret("not-the-secret")
    idp.save()
    oidc_op.set_account("kim", email="kim@corp.test")
    response = sign_in(client, oidc_op, "kim")
    assert response.status_code == 502 and b"client id or secret" in response.content


def test_failed_sso_callbacks_never_lock_the_office_out(client, idp, oidc_op, settings):
    oidc_op.set_account("max", email="max@corp.test")
    idp.set_client_secret("not-the-secret")
    idp.save()
    for _ in range(settings.AXES_FAILURE_LIMIT + 1):
        assert sign_in(client, oidc_op, "max").status_code == 502
    assert not AccessAttempt.objects.exists()
    idp.set_client_secret(oidc_op.client_secret)  # the admin fixes it: SSO works at once
    idp.save()
    assert sign_in(client, oidc_op, "max").status_code == 302


def test_a_secret_the_key_ring_cannot_read_is_a_plain_page(client, idp, oidc_op):
    idp.client_secret_encrypted = "gAAAAAB-not-under-this-key-ring"
    idp.save()
    response = client.get("/sso/corp/start/")
    assert response.status_code == 503 and b"enter it again" in response.content


def test_the_provider_being_down_is_a_plain_page(client, idp, oidc_op):
    oidc_op.set_account("lee", email="lee@corp.test")
    authorize = start(client)
    with oidc_op.browser() as browser:
        callback = drive(browser, authorize, login="lee")
    oidc_op.stop()
    discovery.forget(idp.issuer)
    parts = urlsplit(callback)
    mid_flow = client.get(parts.path, parse_qs(parts.query))
    assert mid_flow.status_code == 502 and b"reach Corp ID" in mid_flow.content
    at_start = client.get("/sso/corp/start/")
    assert at_start.status_code == 502 and b"Try again" in at_start.content
    oidc_op.start()


def _backend_for(idp):  # type: ignore[no-untyped-def]
    backend = OidcBackend()
    meta = discovery.metadata_for(idp.issuer)
    backend._provider, backend._meta = idp, meta
    backend.configure(provider_settings(idp, meta))
    backend.OIDC_RP_CLIENT_ID = idp.client_id
    backend.OIDC_RP_SIGN_ALGO = "RS256"
    backend.OIDC_RP_IDP_SIGN_KEY = None
    backend.OIDC_OP_JWKS_ENDPOINT = meta.jwks_uri
    return backend


def _token(key, kid, issuer, **overrides):  # type: ignore[no-untyped-def]
    now = int(time.time())
    claims = {
        "iss": issuer,
        "aud": "openworker",
        "sub": "mallory",
        "iat": now,
        "exp": now + 300,
        "nonce": "n",
    }
    claims.update(overrides)
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})


def test_id_tokens_are_checked_against_the_providers_jwks(idp, oidc_op):
    backend = _backend_for(idp)
    kid = oidc_op.signing_jwk["kid"]
    genuine = _token(oidc_op.signing_key, kid, oidc_op.issuer)
    assert backend.verify_token(genuine, nonce="n")["sub"] == "mallory"

    forged_key, _ = rsa_jwk(kid)
    with pytest.raises(SuspiciousOperation):
        backend.verify_token(_token(forged_key, kid, oidc_op.issuer), nonce="n")
    expired = _token(
        oidc_op.signing_key,
        kid,
        oidc_op.issuer,
        iat=int(time.time()) - 7200,
        exp=int(time.time()) - 120,
    )
    with pytest.raises(SuspiciousOperation):
        backend.verify_token(expired, nonce="n")
    within_skew = _token(oidc_op.signing_key, kid, oidc_op.issuer, exp=int(time.time()) - 20)
    assert backend.verify_token(within_skew, nonce="n")
    with pytest.raises(SuspiciousOperation):
        backend.verify_token(
            _token(oidc_op.signing_key, kid, oidc_op.issuer, aud="someone-else"), nonce="n"
        )
    with pytest.raises(SuspiciousOperation):
        backend.verify_token(genuine, nonce="another")
    shared = _token(oidc_op.signing_key, kid, oidc_op.issuer, aud=["openworker", "other-app"])
    with pytest.raises(SuspiciousOperation):
        backend.verify_token(shared, nonce="n")
    ours = _token(
        oidc_op.signing_key, kid, oidc_op.issuer, aud=["openworker", "other-app"], azp="openworker"
    )
    assert backend.verify_token(ours, nonce="n")["azp"] == "openworker"
