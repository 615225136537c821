"""The admin's side of single sign-on: providers with write-only encrypted secrets, the
provider from the environment, the policy row, and the sign-in page's buttons."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from django.contrib.auth import get_user_model
from django.core.management import call_command

from sessions.sso import selectors
from sessions.sso.models import IdentityProvider, SsoPolicy

SECRET = "s3cret-client-value-0123456789"


@pytest.fixture
def root(db):  # type: ignore[no-untyped-def]
    return get_user_model().objects.create_superuser("root", "root@x.test", "pw-root-12345")


def test_the_admin_stores_the_client_secret_encrypted_and_never_shows_it(client, root):
    client.force_login(root)
    response = client.post(
        "/admin/sso/identityprovider/add/",
        {
            "name": "Corp ID",
            "slug": "corp",
            "issuer": "https://id.corp.test",
            "client_id": "openworker",
            "client_secret": SECRET,
            "scopes": "openid email profile groups",
            "groups_claim": "groups",
            "enabled": "on",
            "group_mappings-TOTAL_FORMS": "0",
            "group_mappings-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 302, response.content[:2000]
    provider = IdentityProvider.objects.get(slug="corp")
    assert SECRET not in provider.client_secret_encrypted
    assert provider.client_secret() == SECRET
    page = client.get(f"/admin/sso/identityprovider/{provider.pk}/change/").content.decode()
    assert SECRET not in page and provider.client_secret_encrypted not in page

    # Saving without typing a secret keeps the stored one.
    client.post(
        f"/admin/sso/identityprovider/{provider.pk}/change/",
        {
            "name": "Corp ID",
            "slug": "corp",
            "issuer": "https://id.corp.test",
            "client_id": "openworker",
            "client_secret": "",
            "scopes": "openid email profile groups",
            "groups_claim": "groups",
            "enabled": "on",
            "group_mappings-TOTAL_FORMS": "0",
            "group_mappings-INITIAL_FORMS": "0",
        },
    )
    provider.refresh_from_db()
    assert provider.client_secret() == SECRET


def test_scopes_without_openid_are_refused(client, root):
    client.force_login(root)
    response = client.post(
        "/admin/sso/identityprovider/add/",
        {
            "name": "X",
            "slug": "x",
            "issuer": "https://id.x.test",
            "client_id": "c",
            "scopes": "email profile",
            "groups_claim": "groups",
            "group_mappings-TOTAL_FORMS": "0",
            "group_mappings-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 200 and b"must include openid" in response.content
    assert not IdentityProvider.objects.exists()


def test_the_provider_from_the_environment_is_offered_with_its_secret_encrypted(
    db, settings, monkeypatch
):
    settings.SSO_ENV_PROVIDER = {
        "slug": "env-idp",
        "name": "Env ID",
        "issuer": "https://id.env.test",
        "client_id": "ow",
        "client_secret": SECRET,
    }
    monkeypatch.setattr(selectors, "_env_synced", False)
    (provider,) = selectors.providers_enabled()
    assert provider.slug == "env-idp" and provider.from_environment
    assert SECRET not in provider.client_secret_encrypted and provider.client_secret() == SECRET


def test_the_sign_in_page_has_a_named_button_per_enabled_provider(client, db):
    for slug, enabled in (("one", True), ("two", True), ("off", False)):
        IdentityProvider.objects.create(
            slug=slug,
            name=slug.title(),
            issuer=f"https://{slug}.test",
            client_id="c",
            enabled=enabled,
        )
    page = client.get("/accounts/login/?next=/sessions/").content.decode()
    assert 'href="/sso/one/start/?next=%2Fsessions%2F">Sign in with One</a>' in page
    assert "Sign in with Two" in page and "Sign in with Off" not in page
    assert 'name="password"' in page  # SSO not required: passwords still work


def test_an_unknown_or_disabled_provider_is_a_plain_404(client, db):
    IdentityProvider.objects.create(
        slug="off", name="Off", issuer="https://off.test", client_id="c", enabled=False
    )
    response = client.get("/sso/off/start/")
    assert response.status_code == 404 and b"Back to the sign-in page" in response.content


def test_require_sso_without_a_policy_row_keeps_passwords(client, db):
    get_user_model().objects.create_user("amy", password="pw-amy-123456")
    assert not SsoPolicy.objects.exists()
    assert client.login(username="amy", password="pw-amy-123456")


def test_rotate_keys_re_encrypts_client_secrets_so_the_old_key_can_go(db, settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.ENCRYPTION_KEYS = [old]
    provider = IdentityProvider(slug="r", name="R", issuer="https://r.test", client_id="c")
    provider.set_client_secret(SECRET)
    provider.save()
    settings.ENCRYPTION_KEYS = [new, old]
    call_command("rotate_keys")
    settings.ENCRYPTION_KEYS = [new]
    provider.refresh_from_db()
    assert provider.client_secret() == SECRET
