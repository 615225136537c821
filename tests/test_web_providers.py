"""The provider settings page: write-only keys, which profile applies, test connection."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from providers.edge.models import ProviderProfile
from providers.edge.views import connection_test
from sessions.models import UserPreferences
from tests.fakes import Reply, text
from tests.fakes.script import quota_exceeded

SECRET = "sk-test-abcdefghijkl9876"


def test_saving_a_key_stores_it_encrypted_and_shows_only_the_last_four(client, owner):
    client.force_login(owner)
    response = client.post(
        reverse("provider_edit", args=["anthropic"]),
        {"api_key": SECRET, "base_url": "https://proxy.example.test"},
    )
    assert response.status_code == 302
    profile = ProviderProfile.objects.get(owner=owner, provider="anthropic")
    assert SECRET not in profile.api_key_encrypted and profile.api_key() == SECRET
    page = client.get(reverse("provider_settings")).content.decode()
    assert "…9876" in page and SECRET not in page
    form = client.get(reverse("provider_edit", args=["anthropic"])).content.decode()
    assert SECRET not in form and "…9876" in form


def test_an_empty_key_field_keeps_the_stored_key(client, owner):
    client.force_login(owner)
    url = reverse("provider_edit", args=["anthropic"])
    client.post(url, {"api_key": SECRET})
    client.post(url, {"api_key": "", "base_url": ""})
    assert ProviderProfile.objects.get(owner=owner, provider="anthropic").api_key() == SECRET


def test_region_is_asked_only_where_it_matters(client, owner):
    client.force_login(owner)
    assert (
        'name="region"' in client.get(reverse("provider_edit", args=["bedrock"])).content.decode()
    )
    assert (
        'name="region"'
        not in client.get(reverse("provider_edit", args=["openai"])).content.decode()
    )


def test_the_page_says_whose_key_applies(client, owner):
    org = ProviderProfile(owner=None, provider="openai")
    org.set_api_key("sk-org-key-000000001111")
    org.save()
    client.force_login(owner)
    rows = {row["name"]: row for row in client.get(reverse("provider_settings")).context["rows"]}
    assert rows["openai"]["applies"] == "organisation"
    assert rows["anthropic"]["applies"] == "none"
    mine = ProviderProfile(owner=owner, provider="openai")
    mine.save()
    rows = {row["name"]: row for row in client.get(reverse("provider_settings")).context["rows"]}
    assert rows["openai"]["applies"] == "user_without_key"


def test_delete_removes_only_the_users_profile(client, owner, teammate):
    for user in (owner, teammate):
        ProviderProfile.objects.create(owner=user, provider="anthropic")
    client.force_login(owner)
    assert client.get(reverse("provider_delete", args=["anthropic"])).status_code == 200
    client.post(reverse("provider_delete", args=["anthropic"]))
    assert not ProviderProfile.objects.filter(owner=owner).exists()
    assert ProviderProfile.objects.filter(owner=teammate).exists()


def test_unknown_provider_is_404(client, owner):
    client.force_login(owner)
    assert client.get(reverse("provider_edit", args=["nope"])).status_code == 404


def test_posts_need_csrf(owner):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    for url in (
        reverse("provider_edit", args=["anthropic"]),
        reverse("provider_test", args=["anthropic"]),
        reverse("provider_delete", args=["anthropic"]),
        reverse("provider_default_model"),
    ):
        assert client.post(url, {}).status_code == 403


def test_connection_test_passes_through_the_router(client, owner, openai_fake):
    profile = ProviderProfile(owner=owner, provider="deepseek", base_url=openai_fake.base_url)
    profile.set_api_key("test-key")
    profile.save()
    openai_fake.push(Reply(text("OK")))
    client.force_login(owner)
    response = client.post(
        reverse("provider_test", args=["deepseek"]), {"model": "deepseek-chat"}, follow=True
    )
    assert "the connection works" in response.content.decode()
    assert openai_fake.requests[-1].body["model"] == "deepseek-chat"


def test_connection_test_shows_the_friendly_error(client, owner, openai_fake):
    profile = ProviderProfile(owner=owner, provider="deepseek", base_url=openai_fake.base_url)
    profile.set_api_key("test-key")
    profile.save()
    openai_fake.push(Reply(quota_exceeded()))
    client.force_login(owner)
    response = client.post(
        reverse("provider_test", args=["deepseek"]), {"model": "deepseek-chat"}, follow=True
    )
    body = response.content.decode()
    low = body.lower()
    assert "DeepSeek:" in body and ("credit" in low or "quota" in low)
    assert "the connection works" not in body


def test_connection_test_never_echoes_an_unexpected_exception():
    class Exploding:
        def complete(self, **kwargs):
            raise RuntimeError(SECRET)

        def close(self):
            pass

    message = connection_test(user_id=1, model="openai:x", router=Exploding())
    assert message and SECRET not in message


def test_default_model_is_saved_for_new_sessions(client, owner):
    # A custom id runs on the user's own key (the default model policy).
    ProviderProfile.objects.create(owner=owner, provider="ollama", base_url="http://10.0.0.5")
    client.force_login(owner)
    client.post(
        reverse("provider_default_model"), {"model": "__custom__", "custom_model": "ollama:qwen3"}
    )
    assert UserPreferences.objects.get(user=owner).default_model == "ollama:qwen3"


@pytest.mark.parametrize("name", ["provider_settings"])
def test_settings_need_sign_in(client, db, name):
    assert client.get(reverse(name)).status_code == 302
