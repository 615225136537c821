"""`make run` is safe by default: DEBUG off in both modes unless asked for, and every
error a user can reach is a styled page that says what happened, never a traceback."""

from __future__ import annotations

import pytest
from django.test import Client, RequestFactory
from django.urls import reverse
from django.views.defaults import server_error

from sessions.models import UserPreferences
from tests.test_settings import run_manage

DEBUG_PAGE_MARKERS = ("Traceback", "URLconf", "DEBUG = True", "Django tried these URL")


def assert_friendly(body: str) -> None:
    assert "Back to your sessions" in body
    for marker in DEBUG_PAGE_MARKERS:
        assert marker not in body


def test_embedded_mode_runs_with_debug_off_unless_asked():
    code = "from django.conf import settings; print('DEBUG', settings.DEBUG)"
    assert "DEBUG False" in run_manage("shell", "-c", code, env={}).stdout
    assert "DEBUG True" in run_manage("shell", "-c", code, env={"DEBUG": "1"}).stdout


def test_embedded_mode_without_debug_serves_plain_http_and_its_static_files():
    code = (
        "from django.conf import settings as s; "
        "print(s.SECURE_SSL_REDIRECT, s.SESSION_COOKIE_SECURE, s.WHITENOISE_USE_FINDERS)"
    )
    assert "False False True" in run_manage("shell", "-c", code, env={}).stdout


@pytest.mark.django_db
def test_an_unknown_page_is_a_styled_404_without_the_url_list(client, owner):
    client.force_login(owner)
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert "There is nothing here" in response.content.decode()
    assert_friendly(response.content.decode())


@pytest.mark.django_db
def test_a_server_error_is_a_styled_500(rf: RequestFactory):
    response = server_error(rf.get("/"))
    assert response.status_code == 500
    assert "Something went wrong on our side" in response.content.decode()
    assert_friendly(response.content.decode())


@pytest.mark.django_db
def test_a_disallowed_host_is_a_styled_400(client):
    response = client.get(reverse("login"), HTTP_HOST="evil.example")
    assert response.status_code == 400
    assert "could not be read" in response.content.decode()
    assert_friendly(response.content.decode())


@pytest.mark.django_db
def test_a_form_without_its_csrf_token_is_a_styled_403(owner):
    client = Client(enforce_csrf_checks=True)
    response = client.post(reverse("login"), {"username": "x", "password": "y"})
    assert response.status_code == 403
    assert "That form has expired" in response.content.decode()
    assert_friendly(response.content.decode())


@pytest.mark.django_db
def test_a_locked_out_sign_in_is_a_styled_429_that_says_when(client, owner, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT + 1):
        response = client.post(
            reverse("login"), {"username": owner.username, "password": "wrong-password"}
        )
    assert response.status_code == 429
    body = response.content.decode()
    assert "Too many sign-in attempts" in body
    assert "Try again in" in body
    assert_friendly(body)


@pytest.mark.django_db
def test_an_error_page_follows_the_users_theme_and_else_the_system(client, owner):
    UserPreferences.objects.create(user=owner, theme=UserPreferences.Theme.DARK)
    client.force_login(owner)
    assert 'data-theme="dark"' in client.get("/no-such-page/").content.decode()
    client.logout()
    assert 'data-theme="system"' in client.get("/no-such-page/").content.decode()
    # No request, no user: the page follows the browser rather than fail again.
    assert 'data-theme="system"' in server_error(RequestFactory().get("/")).content.decode()
