"""Brute force against the sign-in form is throttled (django-axes), sessions expire, and
`check --deploy` is clean with production settings."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from tests.security.figures import record

pytestmark = pytest.mark.django_db


def attempt(client: Client, username: str, password: str, ip: str = "203.0.113.9") -> Any:
    return client.post(
        "/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=ip
    )


def test_the_right_password_is_refused_once_the_failure_limit_is_reached(owner: Any) -> None:
    client = Client()
    limit = settings.AXES_FAILURE_LIMIT
    for i in range(limit):
        response = attempt(client, "alice", f"guess-{i}")
        assert response.status_code in {200, 429}
    response = attempt(client, "alice", "alice-pass-123")
    assert response.status_code == 429
    assert "_auth_user_id" not in client.session
    record("throttle.attempts", limit + 1, "sign-in attempts: locked out at the limit")


def test_a_lockout_is_per_user_and_address(owner: Any, teammate: Any) -> None:
    for i in range(settings.AXES_FAILURE_LIMIT):
        attempt(Client(), "alice", f"guess-{i}")
    # Bob from the same address and Alice from elsewhere still sign in.
    assert attempt(Client(), "bob", "bob-pass-123").status_code == 302
    assert attempt(Client(), "alice", "alice-pass-123", ip="198.51.100.7").status_code == 302


def test_success_before_the_limit_resets_the_count(owner: Any) -> None:
    for i in range(settings.AXES_FAILURE_LIMIT - 1):
        attempt(Client(), "alice", f"guess-{i}")
    assert attempt(Client(), "alice", "alice-pass-123").status_code == 302
    for i in range(settings.AXES_FAILURE_LIMIT - 1):
        attempt(Client(), "alice", f"again-{i}")
    assert attempt(Client(), "alice", "alice-pass-123").status_code == 302


def test_the_lockout_ends_after_the_cool_off(owner: Any) -> None:
    from axes.models import AccessAttempt

    for i in range(settings.AXES_FAILURE_LIMIT):
        attempt(Client(), "alice", f"guess-{i}")
    AccessAttempt.objects.update(attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME * 2)
    assert attempt(Client(), "alice", "alice-pass-123").status_code == 302


def test_a_session_older_than_its_age_is_signed_out(owner: Any) -> None:
    from django.contrib.sessions.models import Session as DjangoSession

    client = Client()
    client.force_login(owner)
    assert client.get("/").status_code == 200
    assert settings.SESSION_COOKIE_AGE <= 14 * 24 * 3600
    DjangoSession.objects.update(expire_date=timezone.now() - timedelta(seconds=1))
    response = client.get("/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_check_deploy_is_clean_with_production_settings() -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DEBUG"}}
    env.update(
        DEBUG="0",
        DATABASE_URL="postgres://u@127.0.0.1:5432/x",
        REDIS_URL="redis://127.0.0.1:6379/0",
        SECRET_KEY="a-production-like-secret-key-" + "x" * 40 + "-not-used",
        OPENWORKER_ENCRYPTION_KEYS="dGVzdC1vbmx5LWtleS1ub3QtZm9yLXByb2R1Y3Rpb24=",
        ALLOWED_HOSTS="openworker.example.com",
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=settings.BASE_DIR,
    )
    assert result.returncode == 0, result.stdout + result.stderr
