from __future__ import annotations

import os
from collections.abc import Iterator

# The collector as CPython ships it (openworker/gc_tuning.py): in this process and in
# the Daphne and Celery processes the distributed tests start, which inherit it.
os.environ.setdefault("OPENWORKER_GC_TUNING", "0")

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.backends.signals import connection_created

from tests.fakes.fixtures import anthropic_fake, openai_fake  # noqa: F401
from tests.support import procs


def _readers_do_not_wait_for_writers(sender, connection, **kwargs):  # type: ignore[no-untyped-def]
    """The embedded phase's test database is SQLite in memory, in shared-cache mode, where
    a read that meets another connection's open write (a turn's heartbeat on its own
    thread) fails at once with "database table is locked": the busy timeout does not
    cover shared-cache table locks. `make run`'s file database is in WAL mode, where a
    reader never waits for a writer; uncommitted reads give the test database the same
    property (readers may see a write in flight, which no test relies on)."""
    if connection.vendor == "sqlite" and connection.is_in_memory_db():
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA read_uncommitted = 1")


connection_created.connect(_readers_do_not_wait_for_writers)


@pytest.fixture
def owner(db):  # type: ignore[no-untyped-def]
    return get_user_model().objects.create_user("alice", password="alice-pass-123")


@pytest.fixture
def teammate(db):  # type: ignore[no-untyped-def]
    return get_user_model().objects.create_user("bob", password="bob-pass-123")


@pytest.fixture
def require_distributed() -> None:
    if not settings.DISTRIBUTED:
        pytest.fail("distributed tests need DATABASE_URL and REDIS_URL (see `make test`)")


@pytest.fixture(scope="module")
def distributed_env(django_db_setup, django_db_blocker) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Environment for Daphne/Celery processes sharing the test database and Redis."""
    if not settings.DISTRIBUTED:
        pytest.fail("distributed tests need DATABASE_URL and REDIS_URL (see `make test`)")
    with django_db_blocker.unblock():
        url = procs.database_url_for(connection.settings_dict)
    return {"DATABASE_URL": url, "REDIS_URL": settings.REDIS_URL}


@pytest.fixture(scope="module")
def daphne_server(distributed_env: dict[str, str]) -> Iterator[str]:
    with procs.daphne(distributed_env) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def celery_worker(distributed_env: dict[str, str]) -> Iterator[procs.Proc]:
    with procs.celery_worker(distributed_env) as proc:
        yield proc


@pytest.fixture(autouse=True)
def _no_background_sweeper(request):  # type: ignore[no-untyped-def]
    """In-process tests drive `watchdog.sweep_once()` themselves."""
    if not request.config.pluginmanager.hasplugin("django"):
        return
    settings = request.getfixturevalue("settings")
    settings.LEASE_SWEEPER = False
    # Titling by model would spend a scripted fake reply; tests that want it turn it on.
    settings.AUTO_TITLE = False
