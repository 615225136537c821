from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

# The collector as CPython ships it (openworker/gc_tuning.py): in this process and in
# the Daphne and Celery processes the distributed tests start, which inherit it.
os.environ.setdefault("OPENWORKER_GC_TUNING", "0")

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection

from tests.fakes.fixtures import anthropic_fake, openai_fake  # noqa: F401
from tests.support import procs


@pytest.fixture(scope="session")
def django_db_modify_db_settings(  # type: ignore[no-untyped-def]
    request, tmp_path_factory, django_db_modify_db_settings_parallel_suffix
):
    """The embedded phase's test database is a SQLite file, as `make run`'s is: WAL,
    IMMEDIATE transactions and the busy timeout (settings.DATABASES) then hold in tests as
    they do in the product. Django's default, SQLite in memory in shared-cache mode, fails
    a write that meets another connection's open write (a turn's heartbeat on its own
    thread) at once with "database table is locked": the busy timeout does not cover
    shared-cache table locks, so tests failed on a collision the product waits out.
    (Depends on pytest-django's parallel suffix as the fixture it replaces does.)"""
    database = settings.DATABASES["default"]
    if database["ENGINE"] != "django.db.backends.sqlite3":
        return
    # In memory all the same where the machine has a tmpfs: a file on disk made the
    # embedded phase about a fifth slower (each transactional test empties every table).
    shared_memory = Path("/dev/shm")
    if shared_memory.is_dir() and os.access(shared_memory, os.W_OK):
        folder = Path(tempfile.mkdtemp(prefix="openworker-tests-", dir=shared_memory))
        request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    else:
        folder = tmp_path_factory.mktemp("sqlite")
    database.setdefault("TEST", {})["NAME"] = str(folder / "test.sqlite3")


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
