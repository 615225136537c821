"""Every text input of every view: NUL characters, unpaired surrogates and oversize
values are a 400 with a message naming the field (JSON for the pages' fetch calls), in
both run modes, never a database error (openworker.middleware.InputValidationMiddleware).
"""

from __future__ import annotations

import pytest
from django.test import Client, RequestFactory
from django.urls import reverse

from openworker.middleware import MAX_FIELD_CHARS, request_input_problem, text_problem
from sessions.models import Session

MODES = [
    pytest.param("embedded", id="embedded"),
    pytest.param("distributed", id="distributed", marks=pytest.mark.distributed),
]
BAD_VALUES = {
    "nul": ("a\x00b", "contains a NUL character"),
    "oversize": ("x" * (MAX_FIELD_CHARS + 1), f"longer than {MAX_FIELD_CHARS:,} characters"),
}


def endpoints(session: Session) -> list[tuple[str, str, str, bool]]:
    """(method, url, field, answers JSON) for every text input a signed-in user can send."""
    sid = [session.pk]
    return [
        ("get", reverse("home"), "q", False),
        ("get", reverse("home"), "page", False),
        ("post", reverse("session_new"), "model", False),
        ("post", reverse("session_new"), "custom_model", False),
        ("post", reverse("session_model", args=sid), "custom_model", True),
        ("post", reverse("session_rename", args=sid), "title", False),
        ("post", reverse("session_rename", args=sid), "next", False),
        ("post", reverse("session_archive", args=sid), "archived", False),
        ("get", reverse("session_messages", args=sid), "after", True),
        ("post", reverse("provider_default_model"), "custom_model", False),
        ("post", reverse("provider_edit", args=["anthropic"]), "api_key", False),
        ("post", reverse("provider_edit", args=["anthropic"]), "base_url", False),
        ("post", reverse("provider_test", args=["anthropic"]), "model", False),
        ("post", reverse("password_change"), "old_password", False),
    ]


@pytest.fixture
def signed_in(owner) -> Client:
    client = Client()
    client.force_login(owner)
    return client


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", list(BAD_VALUES))
@pytest.mark.django_db
def test_every_text_input_refuses_bad_text_with_a_400_naming_the_field(
    signed_in, owner, mode, kind, settings
):
    assert settings.DISTRIBUTED is (mode == "distributed")
    session = Session.objects.create(owner=owner, model="m", title="Kept")
    value, reason = BAD_VALUES[kind]
    for method, url, field, answers_json in endpoints(session):
        response = getattr(signed_in, method)(url, {"title": "t", field: value})
        where = f"{method} {url} {field}"
        assert response.status_code == 400, where
        if answers_json:
            assert reason in response.json()["error"], where
        else:
            body = response.content.decode().replace("&#x27;", "'")
            assert reason in body and f"'{field}'" in body, where
    session.refresh_from_db()
    assert session.title == "Kept" and session.model == "m"
    assert Session.objects.filter(owner=owner).count() == 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.django_db
def test_sign_in_with_a_nul_in_the_username_is_a_400(client, mode, settings):
    assert settings.DISTRIBUTED is (mode == "distributed")
    response = client.post(reverse("login"), {"username": "ad\x00min", "password": "x"})
    assert response.status_code == 400
    assert "contains a NUL character" in response.content.decode()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.django_db
def test_a_nul_in_a_url_path_part_is_a_400_not_a_crash(signed_in, owner, mode, settings):
    assert settings.DISTRIBUTED is (mode == "distributed")
    session = Session.objects.create(owner=owner, model="m")
    response = signed_in.get(f"/sessions/{session.pk}/files/a%00b.txt")
    assert response.status_code == 400


def test_unpaired_surrogates_are_refused_wherever_they_come_from():
    assert "not valid text" in (text_problem("The field 'title'", "a\ud800b") or "")
    request = RequestFactory().get("/")
    assert "not valid text" in (request_input_problem(request, {"path": "x\udc80"}) or "")


def test_ordinary_text_passes(rf: RequestFactory):
    request = rf.post("/", {"title": "Quarterly plan — Ünïcode ✓ 🚀", "n": "3"})
    assert request_input_problem(request, {}) is None


@pytest.mark.django_db
def test_a_next_that_is_not_a_path_falls_back_instead_of_failing(signed_in, owner):
    # Found by the PostgreSQL fuzz suite: `redirect()` took a bare word for a URL name.
    session = Session.objects.create(owner=owner, model="m", title="Kept")
    for target in ("mmmm", "home", "admin:index", "//evil.example/", "https://evil.example/"):
        response = signed_in.post(
            reverse("session_archive", args=[session.pk]), {"archived": "0", "next": target}
        )
        assert response.status_code == 302
        assert response["Location"] == reverse("home"), target
