from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command

from openworker.env import envbool, envint, envlist

REPO = Path(__file__).resolve().parents[1]
PRODUCTION_ENV = {
    "DEBUG": "0",
    "SECRET_KEY": "a-long-random-production-secret-key-" + "x" * 40,
    "OPENWORKER_ENCRYPTION_KEYS": "dGVzdC1vbmx5LWtleS1ub3QtZm9yLXByb2R1Y3Rpb24=",
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/openworker",
    "REDIS_URL": "redis://127.0.0.1:6379/15",
    "ALLOWED_HOSTS": "openworker.example.com",
}


def run_manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DEBUG"}}
    base.pop("SECRET_KEY", None)
    base.pop("OPENWORKER_ENCRYPTION_KEYS", None)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_envbool_rejects_a_typo(monkeypatch):
    monkeypatch.setenv("FLAG", "ture")
    with pytest.raises(ImproperlyConfigured, match="FLAG"):
        envbool("FLAG", default=False)


def test_envbool_reads_common_spellings(monkeypatch):
    monkeypatch.setenv("FLAG", "Yes")
    assert envbool("FLAG", default=False) is True
    monkeypatch.setenv("FLAG", "0")
    assert envbool("FLAG", default=True) is False


def test_envint_rejects_non_numbers_and_values_below_minimum(monkeypatch):
    monkeypatch.setenv("N", "ten")
    with pytest.raises(ImproperlyConfigured, match="integer"):
        envint("N", 1)
    monkeypatch.setenv("N", "0")
    with pytest.raises(ImproperlyConfigured, match="at least 1"):
        envint("N", 5, minimum=1)


def test_envlist_drops_blanks(monkeypatch):
    monkeypatch.setenv("L", "a, b,,c ")
    assert envlist("L") == ["a", "b", "c"]


def test_production_refuses_to_start_without_secret_key():
    env = {k: v for k, v in PRODUCTION_ENV.items() if k != "SECRET_KEY"}
    result = run_manage("check", env=env)
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr


def test_production_refuses_to_start_without_encryption_keys():
    env = {k: v for k, v in PRODUCTION_ENV.items() if k != "OPENWORKER_ENCRYPTION_KEYS"}
    result = run_manage("check", env=env)
    assert result.returncode != 0
    assert "OPENWORKER_ENCRYPTION_KEYS must be set" in result.stderr


def test_half_configured_distributed_mode_is_refused():
    result = run_manage("check", env={"DATABASE_URL": PRODUCTION_ENV["DATABASE_URL"]})
    assert result.returncode != 0
    assert "needs both DATABASE_URL and REDIS_URL" in result.stderr


def test_check_deploy_is_clean_with_production_env():
    result = run_manage("check", "--deploy", "--fail-level", "WARNING", env=PRODUCTION_ENV)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_models_and_migrations_agree(db):
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def test_sessions_app_label_does_not_collide_with_django_sessions():
    from django.apps import apps

    assert apps.get_app_config("chat_sessions").name == "sessions"
    assert apps.get_app_config("sessions").name == "django.contrib.sessions"


def test_celery_is_configured_for_long_io_bound_turns():
    from django.conf import settings

    from openworker.celery import app

    assert app.conf.worker_pool == "threads"
    assert app.conf.task_acks_late is True
    assert app.conf.worker_prefetch_multiplier == 1
    visibility = app.conf.broker_transport_options["visibility_timeout"]
    assert visibility > app.conf.task_time_limit == settings.TURN_TIME_LIMIT_SECONDS
    assert app.conf.task_routes["sessions.tasks.run_turn_task"]["queue"] == "turns"
    assert app.conf.task_routes["openworker.run_turns"]["queue"] == "turns"
    assert app.conf.task_serializer == "json"


def test_provider_timeouts_from_settings_reach_the_transport(settings):
    from openworker.runtime.agent.llm import new_transport

    settings.PROVIDER_CONNECT_TIMEOUT = 3.5
    settings.PROVIDER_READ_TIMEOUT = 42.0
    transport = new_transport()

    async def client_timeout() -> httpx.Timeout:
        # The client a stream on this loop would use (one per event loop).
        client = transport._async_client()
        try:
            return client.timeout
        finally:
            await transport.aclose()

    assert transport.read_timeout == 42.0
    timeout = asyncio.run(client_timeout())
    assert (timeout.connect, timeout.read) == (3.5, 42.0)
    transport.close()


def test_distributed_mode_pools_connections_and_uses_the_restart_safe_broker_transport():
    script = (
        "from django.conf import settings as s; import json; d = s.DATABASES['default'];"
        "print(json.dumps([d['CONN_MAX_AGE'], d['CONN_HEALTH_CHECKS'], d['OPTIONS']['pool'],"
        " s.CELERY_BROKER_TRANSPORT,"
        " s.CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS]))"
    )
    done = run_manage("shell", "-c", script, env={**PRODUCTION_ENV, "DB_POOL_MAX_SIZE": "4"})
    assert done.returncode == 0, done.stderr
    max_age, checks, pool, transport, cancel = json.loads(done.stdout.strip().splitlines()[-1])
    assert (max_age, checks) == (0, True)  # the pool requires 0; checks: psycopg's `check`
    assert pool["max_size"] == 4 and pool["min_size"] <= 4
    assert transport == "openworker.broker:Transport"
    assert cancel is False  # a Redis blip never cancels the running turns
