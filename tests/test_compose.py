"""No docker engine runs here, so the compose file is checked by reading it."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def load() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_compose_runs_the_distributed_shape():
    services = load()["services"]
    assert set(services) == {"postgres", "redis", "migrate", "web", "worker"}


def test_web_is_daphne_and_worker_is_celery_with_threads_on_the_turns_queue():
    services = load()["services"]
    # Daphne, through the launcher whose access log leaves query strings out.
    assert services["web"]["command"][:3] == ["python", "-m", "openworker.web_server"]
    assert "openworker.asgi:application" in services["web"]["command"]
    worker = services["worker"]["command"]
    assert worker[:4] == ["celery", "-A", "openworker", "worker"]
    assert worker[worker.index("--pool") + 1] == "threads"
    assert "turns" in worker[worker.index("--queues") + 1].split(",")
    assert services["migrate"]["command"] == ["python", "manage.py", "migrate", "--noinput"]


def test_every_app_service_gets_database_redis_and_secrets_from_env():
    services = load()["services"]
    pg = services["postgres"]["environment"]
    for name in ("migrate", "web", "worker"):
        env = services[name]["environment"]
        assert env["DATABASE_URL"] == (
            f"postgres://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:5432/{pg['POSTGRES_DB']}"
        )
        assert env["REDIS_URL"].startswith("redis://redis:6379/")
        # Secrets are required from the environment, never baked into the file.
        assert env["SECRET_KEY"].startswith("${SECRET_KEY:?")
        assert env["OPENWORKER_ENCRYPTION_KEYS"].startswith("${OPENWORKER_ENCRYPTION_KEYS:?")
        assert "build" in services[name]


def test_app_waits_for_migrations_and_healthy_services():
    services = load()["services"]
    migrate_deps = services["migrate"]["depends_on"]
    assert migrate_deps["postgres"]["condition"] == "service_healthy"
    assert migrate_deps["redis"]["condition"] == "service_healthy"
    for name in ("web", "worker"):
        assert (
            services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        )


def test_dockerfile_serves_the_asgi_app_as_a_non_root_user():
    text = (REPO / "Dockerfile").read_text()
    assert "openworker.asgi:application" in text
    assert "\nUSER openworker" in text
    assert "collectstatic" in text


def test_web_and_worker_share_the_media_volume():
    services = load()["services"]
    for name in ("web", "worker"):
        assert "media:/srv/media" in services[name]["volumes"]
        assert services[name]["environment"]["MEDIA_ROOT"] == "/srv/media"


def test_redis_keeps_the_broker_across_a_restart_and_never_evicts():
    redis = load()["services"]["redis"]
    command = redis["command"]
    assert command[0] == "redis-server"
    option = {command[i]: command[i + 1] for i in range(1, len(command) - 1, 2)}
    assert option["--appendonly"] == "yes"
    assert option["--appendfsync"] in {"everysec", "always"}
    assert option["--maxmemory-policy"] == "noeviction"
    assert any(volume.endswith(":/data") for volume in redis["volumes"])
    assert redis["volumes"][0].split(":")[0] in load()["volumes"]
