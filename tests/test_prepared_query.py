"""PreparedQuery: an ORM query compiled once, run with each call's values, its rows as the
ORM would return them (on SQLite here and on PostgreSQL in the distributed phase)."""

from __future__ import annotations

import uuid
from datetime import datetime

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from openworker.prepared_query import AnyOf, PreparedQuery
from sessions.models import Session, Turn


def _turns_of(owner_id: int, model: str):  # type: ignore[no-untyped-def]
    return (
        Turn.objects.filter(session__owner_id=owner_id, model=model, status__in=Turn.ACTIVE)
        .order_by("created_at")
        .values_list("pk", "session_id", "status", "created_at", "cancel_requested")
    )


def _make_turns(owner, teammate) -> None:  # type: ignore[no-untyped-def]
    for user in (owner, teammate):
        for model in ("anthropic:a", "anthropic:b"):
            session = Session.objects.create(owner=user, model=model)
            Turn.objects.create(session=session, model=model)
            Turn.objects.create(session=session, model=model, status=Turn.Status.COMPLETED)
            Turn.objects.create(session=session, model=model, cancel_requested=True)


def _rows_match_the_querysets(owner, teammate) -> None:  # type: ignore[no-untyped-def]
    _make_turns(owner, teammate)
    prepared = PreparedQuery(_turns_of, owner_id=int, model=str)
    for user in (owner, teammate):
        for model in ("anthropic:a", "anthropic:b", "anthropic:none"):
            expected = list(_turns_of(user.pk, model))
            got = prepared.rows(owner_id=user.pk, model=model)
            assert got == [tuple(row) for row in expected]
    rows = prepared.rows(owner_id=owner.pk, model="anthropic:a")
    assert len(rows) == 2
    # Converted as the ORM converts them: SQLite stores these as text and integers.
    turn_id, session_id, _, created_at, cancel_requested = rows[0]
    assert isinstance(turn_id, uuid.UUID) and isinstance(session_id, uuid.UUID)
    assert isinstance(created_at, datetime) and created_at.tzinfo is not None
    assert cancel_requested is False and rows[1][4] is True


def test_a_prepared_query_returns_the_rows_of_the_queryset_it_was_built_from(owner, teammate):  # type: ignore[no-untyped-def]
    _rows_match_the_querysets(owner, teammate)


@pytest.mark.distributed
@pytest.mark.django_db(transaction=True)
def test_a_prepared_query_returns_the_querysets_rows_on_postgresql(owner, teammate):  # type: ignore[no-untyped-def]
    assert connection.vendor == "postgresql"
    _rows_match_the_querysets(owner, teammate)


def test_it_is_compiled_once_and_runs_one_statement_per_call(owner):  # type: ignore[no-untyped-def]
    built = []

    def build(session_id):  # type: ignore[no-untyped-def]
        built.append(session_id)
        return Session.objects.filter(pk=session_id).values_list("owner_id", "model")[:1]

    prepared = PreparedQuery(build, session_id=uuid.UUID)
    sessions = [Session.objects.create(owner=owner, model=f"anthropic:{n}") for n in range(3)]
    with CaptureQueriesContext(connection) as queries:
        for session in sessions:
            assert prepared.first(session_id=session.pk) == (owner.pk, session.model)
        # A UUID given as a string is the same argument.
        assert prepared.first(session_id=str(sessions[0].pk)) == (owner.pk, "anthropic:0")
        assert prepared.first(session_id=uuid.uuid4()) is None
    assert len(built) == 1
    assert len(queries) == 5


def test_an_argument_the_sql_does_not_bind_is_refused_when_compiled(owner):  # type: ignore[no-untyped-def]
    # The slice's bound is written into the SQL: a second value would need other SQL.
    limited = PreparedQuery(
        lambda owner_id, count: Session.objects.filter(owner_id=owner_id).values_list("pk")[:count],
        owner_id=int,
        count=int,
    )
    with pytest.raises(ValueError, match="count"):
        limited.rows(owner_id=owner.pk, count=2)
    ignored = PreparedQuery(
        lambda owner_id, model: Session.objects.filter(owner_id=owner_id).values_list("pk"),
        owner_id=int,
        model=str,
    )
    with pytest.raises(ValueError, match="model"):
        ignored.rows(owner_id=owner.pk, model="anthropic:a")


def test_a_call_must_name_exactly_the_declared_arguments(owner):  # type: ignore[no-untyped-def]
    prepared = PreparedQuery(
        lambda owner_id: Session.objects.filter(owner_id=owner_id).values_list("pk"),
        owner_id=int,
    )
    with pytest.raises(TypeError):
        prepared.rows(user_id=owner.pk)
    by_time = PreparedQuery(
        lambda when: Session.objects.filter(created_at=when).values_list("pk"), when=datetime
    )
    with pytest.raises(TypeError, match=r"int, str or uuid\.UUID"):
        by_time.rows(when=datetime.now())


def test_a_missing_value_binds_as_null_and_matches_no_row(owner):  # type: ignore[no-untyped-def]
    session = Session.objects.create(owner=owner, model="anthropic:a")
    prepared = PreparedQuery(
        lambda owner_id: Session.objects.filter(owner_id=owner_id).values_list("pk"),
        owner_id=int,
    )
    assert prepared.rows(owner_id=owner.pk) == [(session.pk,)]
    assert prepared.rows(owner_id=None) == []


def test_model_instances_come_back_as_the_queryset_makes_them(owner, teammate):  # type: ignore[no-untyped-def]
    _make_turns(owner, teammate)

    def build(owner_id, model):  # type: ignore[no-untyped-def]
        return (
            Turn.objects.select_related("session")
            .filter(session__owner_id=owner_id, model=model)
            .order_by("created_at")
        )

    prepared = PreparedQuery(build, owner_id=int, model=str)
    got = prepared.instances(owner_id=owner.pk, model="anthropic:b")
    expected = list(build(owner.pk, "anthropic:b"))
    assert [turn.pk for turn in got] == [turn.pk for turn in expected]
    for mine, theirs in zip(got, expected, strict=True):
        assert (mine.status, mine.created_at, mine.cancel_requested, mine.usage) == (
            theirs.status,
            theirs.created_at,
            theirs.cancel_requested,
            theirs.usage,
        )
        assert not mine._state.adding and mine._state.db == "default"
    # The related session came with the row: reading it runs no query.
    with CaptureQueriesContext(connection) as queries:
        assert {turn.session.owner_id for turn in got} == {owner.pk}
        assert got[0].session.model == "anthropic:b"
    assert len(queries) == 0
    with pytest.raises(TypeError):
        PreparedQuery(
            lambda owner_id: Session.objects.filter(owner_id=owner_id).values_list("pk"),
            owner_id=int,
        ).instances(owner_id=owner.pk)


def _lists_answer_as_in_does(owner, teammate) -> None:  # type: ignore[no-untyped-def]
    _make_turns(owner, teammate)
    sessions = list(Session.objects.order_by("created_at"))

    def by_owners(owner_ids, model):  # type: ignore[no-untyped-def]
        return (
            Turn.objects.filter(AnyOf(F("session__owner_id"), owner_ids), model=model)
            .order_by("created_at")
            .values_list("pk", "session_id")
        )

    def by_sessions(session_ids):  # type: ignore[no-untyped-def]
        return Session.objects.filter(AnyOf(F("pk"), session_ids)).order_by("created_at")

    def by_models(models):  # type: ignore[no-untyped-def]
        return Session.objects.filter(AnyOf(F("model"), models)).values_list("pk").order_by("pk")

    owners = PreparedQuery(by_owners, owner_ids=list[int], model=str)
    chosen = PreparedQuery(by_sessions, session_ids=list[uuid.UUID])
    named = PreparedQuery(by_models, models=list[str])
    for owner_ids in ([owner.pk], [owner.pk, teammate.pk], [teammate.pk, -1]):
        expected = Turn.objects.filter(session__owner_id__in=owner_ids, model="anthropic:a")
        expected_rows = list(expected.order_by("created_at").values_list("pk", "session_id"))
        assert owners.rows(owner_ids=owner_ids, model="anthropic:a") == expected_rows
        assert list(by_owners(owner_ids, "anthropic:a")) == expected_rows  # the ORM's own
    for picked in (sessions[:1], sessions[1:3], sessions):
        # UUIDs as objects or as strings, as a scalar argument takes them.
        for ids in ([s.pk for s in picked], [str(s.pk) for s in picked]):
            assert [s.pk for s in chosen.instances(session_ids=ids)] == [s.pk for s in picked]
    expected_b = sorted(s.pk for s in sessions if s.model == "anthropic:b")
    assert [pk for (pk,) in named.rows(models=["anthropic:b", "anthropic:z"])] == expected_b
    # No values: no rows, without a query, as `__in=[]` answers.
    with CaptureQueriesContext(connection) as queries:
        assert owners.rows(owner_ids=[], model="anthropic:a") == []
        assert list(by_owners([], "anthropic:a")) == []
    assert len(queries) == 0


def test_a_list_argument_answers_as_an_in_filter_with_sql_compiled_once(owner, teammate):  # type: ignore[no-untyped-def]
    _lists_answer_as_in_does(owner, teammate)


@pytest.mark.distributed
@pytest.mark.django_db(transaction=True)
def test_a_list_argument_answers_as_an_in_filter_on_postgresql(owner, teammate):  # type: ignore[no-untyped-def]
    assert connection.vendor == "postgresql"
    _lists_answer_as_in_does(owner, teammate)


def test_a_batch_of_any_size_runs_the_same_sql(owner, teammate):  # type: ignore[no-untyped-def]
    built = []

    def build(owner_ids):  # type: ignore[no-untyped-def]
        built.append(owner_ids)
        return Session.objects.filter(AnyOf(F("owner_id"), owner_ids)).values_list("pk")

    prepared = PreparedQuery(build, owner_ids=list[int])
    Session.objects.create(owner=owner, model="anthropic:a")
    with CaptureQueriesContext(connection) as queries:
        for size in (1, 2, 5, 40):
            prepared.rows(owner_ids=[owner.pk] + [-n for n in range(1, size)])
    assert len(built) == 1
    assert len({query["sql"].split(" WHERE ")[0] for query in queries}) == 1
    assert len(queries) == 4
