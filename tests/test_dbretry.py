"""`openworker.dbretry.write`: a turn's write is retried while the database is briefly
away, never for other errors, and gives up after its deadline (embedded, SQLite).
The failures are injected at the database layer: an execute wrapper on the connection
that runs the write raises the OperationalError a dropped server gives."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, OperationalError, connection

from openworker.runtime.store import dbretry
from sessions import services
from sessions.models import Message, Session

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dbretry, "FIRST_WAIT_SECONDS", 0.01)
    monkeypatch.setattr(dbretry, "MAX_WAIT_SECONDS", 0.02)


def failing_writes(count: int) -> Any:
    """The first `count` INSERTs on the connection fail as a dropped server would."""
    state = {"left": count, "failed": 0}

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.lstrip().upper().startswith("INSERT") and state["left"] > 0:
            state["left"] -= 1
            state["failed"] += 1
            raise OperationalError("server closed the connection unexpectedly")
        return execute(sql, params, many, context)

    return state, wrapper


def append_through(wrapper: Any, **kwargs: Any) -> Any:
    with connection.execute_wrapper(wrapper):
        return services.message_append(**kwargs)


async def test_a_write_that_meets_a_dropped_connection_is_retried_and_commits_once(owner):
    session = await Session.objects.acreate(owner=owner)
    state, wrapper = failing_writes(2)
    message = await dbretry.write(
        append_through,
        wrapper=wrapper,
        session_id=session.pk,
        role="assistant",
        content="the whole reply",
        dedupe_key="t:a1",
    )
    assert state["failed"] == 2
    assert message.content == "the whole reply"
    assert await Message.objects.filter(session=session).acount() == 1


async def test_a_lasting_outage_gives_up_after_the_deadline(owner, monkeypatch):
    monkeypatch.setattr(dbretry, "WRITE_RETRY_SECONDS", 0.3)
    session = await Session.objects.acreate(owner=owner)
    state, wrapper = failing_writes(10_000)
    with pytest.raises(OperationalError):
        await dbretry.write(
            append_through, wrapper=wrapper, session_id=session.pk, role="assistant", content="x"
        )
    # Retried (how often depends on how fast this machine is), then given up: not the
    # 10,000 failures a retry without a deadline would meet.
    assert 2 <= state["failed"] < 10_000
    assert await Message.objects.filter(session=session).acount() == 0


async def test_an_error_that_is_not_the_connections_is_not_retried(owner):
    calls = []

    def broken(**_: Any) -> None:
        calls.append(1)
        raise IntegrityError("duplicate key")

    with pytest.raises(IntegrityError):
        await dbretry.write(broken)
    assert calls == [1]
