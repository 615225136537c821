"""`values_sql.rows_insert`: new rows written out in one INSERT, saved as `bulk_create`
saves them (on SQLite here and on PostgreSQL in the distributed phase)."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from openworker.values_sql import rows_insert
from sessions.models import Message, Session, Turn


def _rows_are_saved_as_bulk_create_saves_them(owner) -> None:  # type: ignore[no-untyped-def]
    sessions = [Session.objects.create(owner=owner, model="anthropic:a") for _ in range(3)]
    turns = [Turn(session=session, model="anthropic:a") for session in sessions]
    with CaptureQueriesContext(connection) as queries:
        rows_insert(turns)
    assert len(queries) == 1
    stored = {turn.pk: turn for turn in Turn.objects.filter(session__in=sessions)}
    assert set(stored) == {turn.pk for turn in turns}  # a UUID key: the caller's
    for turn in turns:
        assert not turn._state.adding and turn._state.db == "default"
        assert stored[turn.pk].status == Turn.Status.QUEUED  # the field's default
        assert stored[turn.pk].created_at == turn.created_at  # auto_now_add, on both
    messages = [
        Message(
            session=session,
            seq=1,
            turn=turn,
            role=Message.Role.ASSISTANT,
            content=[{"type": "text", "text": f"reply {n} ' \" \\ \x7f"}],
            usage={"input": n, "output": 2 * n},
            dedupe_key=None if n == 0 else f"{turn.pk}:a0",
        )
        for n, (session, turn) in enumerate(zip(sessions, turns, strict=True))
    ]
    with CaptureQueriesContext(connection) as queries:
        rows_insert(messages)
    assert len(queries) == 1
    # A key the database made: read back, in order.
    assert all(isinstance(message.pk, int) for message in messages)
    assert len({message.pk for message in messages}) == 3
    for n, message in enumerate(messages):
        row = Message.objects.get(pk=message.pk)
        assert (row.session_id, row.turn_id, row.seq) == (
            sessions[n].pk,
            turns[n].pk,
            1,
        )
        assert row.content == message.content and row.usage == {"input": n, "output": 2 * n}
        assert row.dedupe_key == message.dedupe_key
        assert row.created_at == message.created_at
    rows_insert([])  # nothing to write: no statement
    assert Message.objects.count() == 3


def test_new_rows_are_saved_as_bulk_create_saves_them(owner):  # type: ignore[no-untyped-def]
    _rows_are_saved_as_bulk_create_saves_them(owner)


@pytest.mark.distributed
@pytest.mark.django_db(transaction=True)
def test_new_rows_are_saved_as_bulk_create_saves_them_on_postgresql(owner):  # type: ignore[no-untyped-def]
    assert connection.vendor == "postgresql"
    _rows_are_saved_as_bulk_create_saves_them(owner)


def test_a_row_breaking_a_constraint_writes_none_of_the_batch(owner):  # type: ignore[no-untyped-def]
    session = Session.objects.create(owner=owner, model="anthropic:a")
    Message.objects.create(session=session, seq=1, role=Message.Role.USER, content="hi")
    clashing = [
        Message(session=session, seq=2, role=Message.Role.USER, content="two"),
        Message(session=session, seq=1, role=Message.Role.USER, content="again"),
    ]
    with pytest.raises(IntegrityError), transaction.atomic():
        rows_insert(clashing)
    assert list(Message.objects.values_list("seq", flat=True)) == [1]
