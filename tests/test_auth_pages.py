from __future__ import annotations

import pytest
from django.urls import NoReverseMatch, reverse


def test_sign_in_page_renders_a_labelled_form(client, db):
    response = client.get(reverse("login"))
    assert response.status_code == 200
    body = response.content.decode()
    assert '<label for="id_username">' in body and '<label for="id_password">' in body


def test_anonymous_visitor_is_sent_to_sign_in(client, db):
    response = client.get(reverse("home"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_valid_credentials_sign_in_and_show_the_session_list(client, owner):
    response = client.post(
        reverse("login"), {"username": "alice", "password": "alice-pass-123"}, follow=True
    )
    assert response.status_code == 200
    assert b"Your sessions" in response.content
    assert response.context["user"] == owner


def test_wrong_password_is_refused_with_a_message(client, owner):
    response = client.post(reverse("login"), {"username": "alice", "password": "nope"})
    assert response.status_code == 200
    assert b"didn't match" in response.content
    assert "_auth_user_id" not in client.session


def test_sign_out_is_a_post_and_ends_the_session(client, owner):
    client.force_login(owner)
    assert client.get(reverse("logout")).status_code == 405
    response = client.post(reverse("logout"))
    assert response.status_code == 302
    assert "_auth_user_id" not in client.session


def test_password_change_requires_the_old_password(client, owner):
    client.force_login(owner)
    url = reverse("password_change")
    bad = client.post(
        url,
        {
            "old_password": "wrong",
            "new_password1": "N3w-pass-long!",
            "new_password2": "N3w-pass-long!",
        },
    )
    assert bad.status_code == 200
    good = client.post(
        url,
        {
            "old_password": "alice-pass-123",
            "new_password1": "N3w-pass-long!",
            "new_password2": "N3w-pass-long!",
        },
    )
    assert good.status_code == 302
    owner.refresh_from_db()
    assert owner.check_password("N3w-pass-long!")


def test_there_is_no_open_sign_up():
    for name in ("signup", "register", "django_registration_register"):
        with pytest.raises(NoReverseMatch):
            reverse(name)


def test_pages_carry_a_strict_content_security_policy(client, db):
    csp = client.get(reverse("login"))["Content-Security-Policy"]
    assert "script-src 'self'" in csp
    assert "unsafe-inline" not in csp


def test_home_lists_only_the_users_own_sessions(client, owner, teammate):
    from sessions.models import Session

    Session.objects.create(owner=owner, title="Alice's plan")
    Session.objects.create(owner=teammate, title="Bob's secret")
    client.force_login(owner)
    body = client.get(reverse("home")).content.decode()
    assert "Alice&#x27;s plan" in body
    assert "Bob" not in body.replace("bob", "")  # neither the title nor the owner
