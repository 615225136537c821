"""A model call's outcome is one transaction (`turn_state.turn_step_commit`), and messages
take their sequence number with one `UPDATE ... RETURNING`: on SQLite (embedded) and on
PostgreSQL (distributed) alike."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from openworker.runtime.agent import titles
from openworker.runtime.store import turn_state
from openworker.runtime.turns import commands
from sessions import services
from sessions.models import Message, Session, Turn

WORKER = "host:1:abcd"


def _running_turn(owner) -> Turn:  # type: ignore[no-untyped-def]
    session = services.session_create(owner=owner)
    turn = Turn.objects.create(session=session, model=session.model)
    services.message_append(
        session_id=session.pk, role="user", content="hi", turn_id=turn.pk, dedupe_key="u"
    )
    turn_state.turn_claim(turn_id=turn.pk, worker=WORKER)
    return Turn.objects.select_related("session").get(pk=turn.pk)


def _commit(turn: Turn, *, key: str = "t:a0", finish: str | None = None, steps: int = 1):
    return turn_state.turn_step_commit(
        turn_id=turn.pk,
        worker=WORKER,
        session_id=turn.session_id,
        message={"content": "hello", "usage": {"input": 10, "output": 2}, "model": "m"},
        dedupe_key=key,
        totals=turn_state.StepTotals(
            usage={"input": 10, "output": 2}, steps=steps, cost=Decimal("0.25")
        ),
        context_tokens=turn_state.context_tokens_of({"input": 10, "cache_read": 5}),
        finish=finish,
        # As the engine does: the step's path tip (the user message, seq 1) is known.
        parent_seq=1,
    )


class StepCommitContract:
    def test_the_last_call_saves_message_totals_context_and_status_together(self, owner):
        turn = _running_turn(owner)
        saved = _commit(turn, finish=Turn.Status.COMPLETED)
        assert saved.counted and saved.ours
        assert saved.message.role == "assistant" and saved.message.content == "hello"
        turn.refresh_from_db()
        assert turn.status == Turn.Status.COMPLETED
        assert turn.finished_at is not None and turn.lease_owner == ""
        assert turn.usage == {"input": 10, "output": 2}
        assert (turn.steps, turn.cost) == (1, Decimal("0.25"))
        session = Session.objects.get(pk=turn.session_id)
        assert session.last_context_tokens == 15
        assert session.next_seq == 3
        assert list(Message.objects.filter(session=session).values_list("seq", "role")) == [
            (1, "user"),
            (2, "assistant"),
        ]

    def test_a_tool_step_keeps_the_turn_running(self, owner):
        turn = _running_turn(owner)
        assert _commit(turn).ours
        turn.refresh_from_db()
        assert turn.status == Turn.Status.RUNNING and turn.lease_owner == WORKER
        assert turn.steps == 1

    def test_a_replayed_step_is_neither_saved_nor_counted_twice_and_leaves_no_gap(self, owner):
        turn = _running_turn(owner)
        first = _commit(turn)
        again = _commit(turn, steps=2)
        assert again.message.pk == first.message.pk and not again.counted and again.ours
        turn.refresh_from_db()
        assert turn.steps == 1
        assert Session.objects.get(pk=turn.session_id).next_seq == 3
        later = services.message_append(session_id=turn.session_id, role="user", content="x")
        assert later.seq == 3
        # The tree is intact too: the replay moved the active leaf nowhere.
        assert later.parent_seq == 2

    def test_a_lost_lease_keeps_the_message_and_says_so(self, owner):
        turn = _running_turn(owner)
        Turn.objects.filter(pk=turn.pk).update(status=Turn.Status.INTERRUPTED, lease_owner="")
        saved = _commit(turn, finish=Turn.Status.COMPLETED)
        assert not saved.ours
        assert Message.objects.filter(pk=saved.message.pk).exists()
        turn.refresh_from_db()
        assert turn.status == Turn.Status.INTERRUPTED and turn.steps == 0

    def test_appending_to_a_missing_session_fails_and_writes_nothing(self, owner):
        import uuid

        # (Nested, an append shares its caller's transaction: the error fails it too.)
        with pytest.raises(Session.DoesNotExist), transaction.atomic():
            services.message_append(session_id=uuid.uuid4(), role="user", content="x")
        assert not Message.objects.exists()

    def test_a_final_commit_is_six_statements(self, owner):
        turn = _running_turn(owner)
        with CaptureQueriesContext(connection) as queries:
            _commit(turn, finish=Turn.Status.COMPLETED)
        sql = [q["sql"].split()[0].upper() for q in queries.captured_queries]
        # BEGIN and COMMIT are not captured; inside a test, atomic() is a savepoint.
        ignored = {"BEGIN", "COMMIT", "SAVEPOINT", "RELEASE"}  # the test's own transaction
        assert [s for s in sql if s not in ignored] == [
            "UPDATE",
            "SELECT",
            "INSERT",
            "UPDATE",
        ], sql

    def test_sending_a_message_is_three_reads_and_four_writes(self, owner):
        session = services.session_create(owner=owner)
        with CaptureQueriesContext(connection) as queries:
            turn = commands.turn_send(session=session, user=owner, text="hello")
        sql = [q["sql"].split()[0].upper() for q in queries.captured_queries]
        ignored = {"BEGIN", "COMMIT", "SAVEPOINT", "RELEASE"}
        assert [s for s in sql if s not in ignored] == [
            "SELECT",  # the model policy: a curated model offered to the user's teams
            "SELECT",  # the user's limits
            "SELECT",  # the sessions of their active turns
            "UPDATE",  # the session's next sequence number (none: the session is gone)
            "INSERT",  # the turn
            "INSERT",  # the message, under the active leaf the UPDATE returned
            "UPDATE",  # the active leaf: the new message
        ], sql
        message = Message.objects.get(turn=turn)
        assert (message.role, message.content, message.seq) == ("user", "hello", 1)
        assert Session.objects.get(pk=session.pk).active_seq == 1

    def test_a_second_send_while_a_turn_runs_is_refused(self, owner):
        session = services.session_create(owner=owner)
        commands.turn_send(session=session, user=owner, text="one")
        with pytest.raises(services.TurnRefused, match="still working"):
            commands.turn_send(session=session, user=owner, text="two")
        assert Message.objects.filter(session=session).count() == 1


@pytest.mark.django_db
class TestOnTheEmbeddedDatabase(StepCommitContract):
    pass


@pytest.mark.distributed
class TestOnPostgres(StepCommitContract):
    @pytest.fixture(autouse=True)
    def _postgres(self, require_distributed, db):  # type: ignore[no-untyped-def]
        assert connection.vendor == "postgresql"


@pytest.mark.django_db
def test_a_title_request_is_made_from_the_messages_in_memory(owner):
    session = services.session_create(owner=owner)
    user = Message(session=session, seq=1, role="user", content="Plan the offsite in Lyon")
    reply = Message(session=session, seq=2, role="assistant", content="Here is a plan")
    request = titles.title_request_for(session, [user, reply])
    assert request is not None
    assert "User: Plan the offsite in Lyon" in request.messages[1]["content"]
    assert "Assistant: Here is a plan" in request.messages[1]["content"]
    assert request.fallback
    session.title = "Mine"
    assert titles.title_request_for(session, [user, reply]) is None


@pytest.mark.django_db
def test_saving_a_title_never_overwrites_one_the_user_set(owner):
    session = services.session_create(owner=owner)
    assert services.session_title_save(session_id=session.pk, title="Model's") == "Model's"
    assert services.session_title_save(session_id=session.pk, title="Other") == "Model's"


def test_usage_totals_add_up_key_by_key():
    assert turn_state.usage_add({"input": 1, "output": 2}, {"input": 3, "cache_read": 4}) == {
        "input": 4,
        "output": 2,
        "cache_read": 4,
    }
    assert turn_state.usage_add(None, None) == {}
    assert turn_state.context_tokens_of(None) is None
    assert turn_state.context_tokens_of({"input": 1, "cache_read": 2, "cache_write": 3}) == 6
