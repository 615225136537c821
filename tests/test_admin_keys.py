"""Organisation keys in the admin are write-only, and `rotate_keys` lets an old master key
be retired: add a new key in front, rotate, remove the old one, everything decrypts."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.core.management.base import CommandError

from providers.edge import crypto
from providers.edge.models import ProviderProfile

pytestmark = pytest.mark.django_db
CANARY = "sk-CANARY-admin-0123456789abcdef"


def org_profile(provider: str = "openai", key: str = CANARY) -> ProviderProfile:
    profile = ProviderProfile(owner=None, provider=provider)
    profile.set_api_key(key)
    profile.save()
    return profile


def test_the_key_set_in_the_admin_is_stored_encrypted_and_never_shown(admin_client):
    response = admin_client.post(
        "/admin/providers/providerprofile/add/",
        {"provider": "anthropic", "api_key": CANARY, "base_url": "", "region": ""},
    )
    assert response.status_code == 302, response.content
    profile = ProviderProfile.objects.get(provider="anthropic", owner__isnull=True)
    assert profile.api_key() == CANARY
    assert CANARY not in profile.api_key_encrypted
    for url in (
        "/admin/providers/providerprofile/",
        f"/admin/providers/providerprofile/{profile.pk}/change/",
    ):
        page = admin_client.get(url)
        assert page.status_code == 200
        assert CANARY.encode() not in page.content
        assert profile.api_key_encrypted.encode() not in page.content
    assert b"cdef" in admin_client.get("/admin/providers/providerprofile/").content


def test_an_empty_key_field_keeps_the_stored_key_and_clear_removes_it(admin_client):
    profile = org_profile()
    url = f"/admin/providers/providerprofile/{profile.pk}/change/"
    admin_client.post(url, {"provider": "openai", "api_key": "", "base_url": "", "region": ""})
    profile.refresh_from_db()
    assert profile.api_key() == CANARY
    admin_client.post(
        url, {"provider": "openai", "api_key": "", "clear_key": "on", "base_url": "", "region": ""}
    )
    profile.refresh_from_db()
    assert profile.api_key() == "" and profile.key_last4 == ""


def test_users_own_profiles_are_not_managed_here(admin_client, owner):
    mine = ProviderProfile(owner=owner, provider="openai")
    mine.set_api_key(CANARY)
    mine.save()
    assert admin_client.get(f"/admin/providers/providerprofile/{mine.pk}/change/").status_code in (
        302,
        404,
    )


def test_a_second_org_profile_for_the_same_provider_is_refused(admin_client):
    org_profile()
    response = admin_client.post(
        "/admin/providers/providerprofile/add/",
        {"provider": "openai", "api_key": "sk-other-key-123456", "base_url": "", "region": ""},
    )
    assert response.status_code == 200
    assert ProviderProfile.objects.filter(provider="openai", owner__isnull=True).count() == 1


def test_the_rotation_drill_retires_the_old_key(settings, owner):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.ENCRYPTION_KEYS = [old]
    org = org_profile()
    user_profile = ProviderProfile(owner=owner, provider="anthropic")
    user_profile.set_api_key("sk-user-key-abcdefgh")
    user_profile.save()

    settings.ENCRYPTION_KEYS = [new, old]  # 1. add the new key in front
    call_command("rotate_keys")  # 2. rotate
    settings.ENCRYPTION_KEYS = [new]  # 3. remove the old key

    org.refresh_from_db()
    user_profile.refresh_from_db()
    assert org.api_key() == CANARY
    assert user_profile.api_key() == "sk-user-key-abcdefgh"


def test_without_rotation_removing_the_old_key_breaks_decryption(settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.ENCRYPTION_KEYS = [old]
    org = org_profile()
    settings.ENCRYPTION_KEYS = [new]
    org.refresh_from_db()
    with pytest.raises(crypto.DecryptionError):
        org.api_key()


def test_rotation_reports_a_row_no_key_can_read_and_leaves_it(settings):
    settings.ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    stranded = org_profile()
    settings.ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    readable = org_profile(provider="anthropic", key="sk-readable-key-1234")
    before = ProviderProfile.objects.get(pk=stranded.pk).api_key_encrypted
    with pytest.raises(CommandError, match="could not be decrypted"):
        call_command("rotate_keys")
    assert ProviderProfile.objects.get(pk=stranded.pk).api_key_encrypted == before
    readable.refresh_from_db()
    assert readable.api_key() == "sk-readable-key-1234"
