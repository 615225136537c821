"""Embedded mode's SQLite: writers on different connections (the sync thread, the lease
heartbeats' thread, web requests) take the write lock in turn, and readers never wait
for a writer (settings.DATABASES: WAL, IMMEDIATE transactions, a busy timeout). The test
database is a file like `make run`'s (tests/conftest.py), so this holds in every test."""

from __future__ import annotations

import threading
import time

import pytest
from django.contrib.auth.models import Group
from django.db import connection, transaction

pytestmark = pytest.mark.django_db(transaction=True)
HOLD_SECONDS = 0.5


def _hold_the_write_lock(inside: threading.Event, errors: list[BaseException]) -> None:
    try:
        with transaction.atomic():
            Group.objects.create(name="held")
            inside.set()
            time.sleep(HOLD_SECONDS)
    except BaseException as exc:  # reported to the test's thread
        errors.append(exc)
        inside.set()
    finally:
        connection.close()


def test_a_write_that_meets_another_connections_open_write_waits_for_it():
    assert connection.vendor == "sqlite" and not connection.is_in_memory_db()
    inside, errors = threading.Event(), []
    holder = threading.Thread(target=_hold_the_write_lock, args=(inside, errors))
    holder.start()
    assert inside.wait(10)

    started = time.monotonic()
    assert not Group.objects.filter(name="held").exists()  # a reader does not wait
    read_seconds = time.monotonic() - started
    Group.objects.create(name="after")  # waits for the holder's commit, then writes
    write_seconds = time.monotonic() - started
    holder.join(10)

    assert errors == []
    assert read_seconds < HOLD_SECONDS
    assert write_seconds >= HOLD_SECONDS * 0.5
    assert set(Group.objects.values_list("name", flat=True)) == {"held", "after"}
