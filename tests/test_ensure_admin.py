from __future__ import annotations

from io import StringIO

from django.contrib.auth import get_user_model
from django.core.management import call_command


def test_first_run_creates_an_admin_whose_printed_password_signs_in(db, client):
    out = StringIO()
    call_command("ensure_admin", stdout=out)
    text = out.getvalue()
    password = text.split("password: ")[1].split()[0]
    user = get_user_model().objects.get(username="admin")
    assert user.is_superuser and user.is_staff
    assert client.login(username="admin", password=password)


def test_later_runs_create_nothing_and_print_no_password(db, owner):
    out = StringIO()
    call_command("ensure_admin", stdout=out)
    assert "password:" not in out.getvalue()
    assert get_user_model().objects.count() == 1


def test_password_can_come_from_the_environment(db, monkeypatch, client):
    monkeypatch.setenv("OPENWORKER_ADMIN_PASSWORD", "scripted-pass-42")
    call_command("ensure_admin", stdout=StringIO())
    assert client.login(username="admin", password="scripted-pass-42")
