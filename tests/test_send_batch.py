"""A burst of sends is written together (`commands.turns_send`, gathered per event loop
by `runtime.turns.send_batch`): each send answered as `turn_send` answers it alone, the
writes of the lot in one transaction of four statements, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from openworker.runtime.turns import commands, send_batch
from sessions import services
from sessions.models import Message, Session, Turn, UserLimits
from tests.support.chat import point_provider_at

MODEL = "anthropic:claude-test-1"
IGNORED = {"BEGIN", "COMMIT", "SAVEPOINT", "RELEASE"}


def _user_with_session(name: str, *, history: bool = False) -> tuple[Any, Session]:
    user = get_user_model().objects.create_user(name, password=None)
    point_provider_at(user, "anthropic", "http://127.0.0.1:9")
    session = services.session_create(owner=user, model=MODEL)
    if history:  # an earlier exchange: the new message goes under its reply
        turn = commands.turn_send(session=session, user=user, text="earlier")
        services.message_append(
            session_id=session.pk, turn_id=turn.pk, role="assistant", content="reply"
        )
        Turn.objects.filter(pk=turn.pk).update(status=Turn.Status.COMPLETED)
        session.refresh_from_db()
    return user, session


def _a_burst_is_written_together() -> None:
    senders = [_user_with_session(f"user-{i}", history=i % 2 == 0) for i in range(8)]
    before = {
        session.pk: (session.next_seq, session.active_seq)
        for session in Session.objects.filter(pk__in=[s.pk for _, s in senders])
    }
    with CaptureQueriesContext(connection) as queries:
        results = commands.turns_send(
            sends=[
                commands.SendRequest(session=session, user=user, text=f"hello {i}")
                for i, (user, session) in enumerate(senders)
            ]
        )
    statements = [q["sql"] for q in queries.captured_queries]
    kinds = [sql.split()[0].upper() for sql in statements]
    writes = [sql for sql, kind in zip(statements, kinds, strict=True) if kind != "SELECT"]
    writes = [sql for sql in writes if sql.split()[0].upper() not in IGNORED]
    # The writes of all eight: the sessions' numbers, the turns, the messages, the leaves.
    assert [sql.split()[0].upper() for sql in writes] == ["UPDATE", "INSERT", "INSERT", "UPDATE"]
    assert Turn._meta.db_table in writes[1] and Message._meta.db_table in writes[2], writes
    # The reads: the model policy per send, the limits and the active turns for all.
    assert kinds.count("SELECT") <= len(senders) + 2, statements

    assert all(isinstance(turn, Turn) for turn in results)
    for (_, session), turn, i in zip(senders, results, range(len(senders)), strict=True):
        assert isinstance(turn, Turn)
        stored = Turn.objects.get(pk=turn.pk)
        assert stored.status == Turn.Status.QUEUED and stored.session_id == session.pk
        message = Message.objects.get(turn=turn, role="user")
        next_seq, active = before[session.pk]
        assert message.seq == next_seq and message.parent_seq == active
        assert message.content == f"hello {i}" and message.dedupe_key == f"{turn.pk}:user"
        session.refresh_from_db()
        assert (session.next_seq, session.active_seq) == (next_seq + 1, message.seq)

    # The same as a lone send writes.
    user, alone = _user_with_session("alone", history=True)
    turn = commands.turn_send(session=alone, user=user, text="hello")
    message = Message.objects.get(turn=turn, role="user")
    alone.refresh_from_db()
    assert message.parent_seq == message.seq - 1 and alone.active_seq == message.seq


@pytest.mark.django_db
def test_a_burst_of_sends_is_written_in_four_statements_on_sqlite() -> None:
    _a_burst_is_written_together()


@pytest.mark.distributed
@pytest.mark.django_db(transaction=True)
def test_a_burst_of_sends_is_written_in_four_statements_on_postgresql(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert connection.vendor == "postgresql"
    from openworker.runtime.turns import runner

    monkeypatch.setattr(runner, "_dispatch", lambda turn_ids: None)
    monkeypatch.setattr(commands.events, "publish_many", lambda notices: None)
    _a_burst_is_written_together()


@pytest.mark.django_db
def test_each_refused_send_of_a_batch_is_refused_alone_and_the_others_are_written() -> None:
    alice, first = _user_with_session("alice")
    bob, other = _user_with_session("bob")
    limited, one = _user_with_session("carol")
    two = services.session_create(owner=limited, model=MODEL)
    UserLimits.objects.create(user=limited, max_concurrent_turns=1)
    results = commands.turns_send(
        sends=[
            commands.SendRequest(session=first, user=alice, text="hi"),
            commands.SendRequest(session=other, user=alice, text="not mine"),
            commands.SendRequest(session=other, user=bob, text="x" * 10**6),
            commands.SendRequest(session=other, user=bob, text="   "),
            commands.SendRequest(session=first, user=alice, text="again"),
            commands.SendRequest(session=one, user=limited, text="one"),
            commands.SendRequest(session=two, user=limited, text="two"),
            commands.SendRequest(session=other, user=bob, text="bob's"),
        ]
    )
    said = [r if isinstance(r, Turn) else str(r) for r in results]
    assert isinstance(said[0], Turn)
    assert said[1] == "Unknown session."
    assert said[2].startswith("Messages are limited to")
    assert said[3] == "Type a message or attach a file."
    assert said[4] == "This session is still working on the previous message."
    assert isinstance(said[5], Turn)
    assert said[6] == "You already have 1 replies running; wait for one to finish."
    assert isinstance(said[7], Turn)
    written = Message.objects.filter(role="user").order_by("content")
    assert [m.content for m in written] == ["bob's", "hi", "one"]
    assert Turn.objects.count() == 3


def _a_deleted_session_refuses_only_its_send() -> None:
    senders = [_user_with_session(f"user-{i}") for i in range(3)]
    gone = senders[1][1]
    Session.objects.filter(pk=gone.pk).delete()  # the socket still holds the object
    results = commands.turns_send(
        sends=[commands.SendRequest(session=s, user=u, text="hi") for u, s in senders]
    )
    assert isinstance(results[0], Turn) and isinstance(results[2], Turn)
    assert isinstance(results[1], commands.TurnRefused)
    assert str(results[1]) == "Unknown session."
    assert Message.objects.filter(role="user").count() == 2


@pytest.mark.django_db
def test_a_session_deleted_before_the_write_refuses_only_its_own_send() -> None:
    _a_deleted_session_refuses_only_its_send()


@pytest.mark.distributed
@pytest.mark.django_db(transaction=True)
def test_a_session_deleted_before_the_write_refuses_only_its_own_send_on_postgresql(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from openworker.runtime.turns import runner

    monkeypatch.setattr(runner, "_dispatch", lambda turn_ids: None)
    monkeypatch.setattr(commands.events, "publish_many", lambda notices: None)
    _a_deleted_session_refuses_only_its_send()


# --- the batcher: sends that arrive while one batch is written go in the next ----------


class _FakeWrites:
    """Stands in for the socket database call: records each batch, the first one held
    until released, and answers each send by its text."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.release = asyncio.Event()
        self.fail = False

    def __call__(self, fn: Any) -> Any:
        assert fn is commands.turns_send

        async def call(*, sends: list[commands.SendRequest]) -> list[Any]:
            self.batches.append([send.text for send in sends])
            if len(self.batches) == 1:
                await self.release.wait()
            if self.fail:
                raise ConnectionError("database away")
            return [
                commands.TurnRefused("no") if send.text == "refuse" else f"turn:{send.text}"
                for send in sends
            ]

        return call


def _request(text: str) -> commands.SendRequest:
    return commands.SendRequest(session=None, user=None, text=text)  # type: ignore[arg-type]


def test_sends_arriving_while_a_batch_is_written_go_together_in_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writes = _FakeWrites()
    monkeypatch.setattr(send_batch, "socket_db", writes)

    async def burst() -> list[Any]:
        batcher = send_batch.SendBatcher()
        first = asyncio.ensure_future(batcher.send(_request("a")))
        await asyncio.sleep(0)  # the first call starts, alone
        rest = [asyncio.ensure_future(batcher.send(_request(t))) for t in ("b", "refuse", "d")]
        await asyncio.sleep(0)
        writes.release.set()
        return await asyncio.gather(first, *rest, return_exceptions=True)

    results = asyncio.run(burst())
    assert writes.batches == [["a"], ["b", "refuse", "d"]]
    assert results[0] == "turn:a" and results[1] == "turn:b" and results[3] == "turn:d"
    assert isinstance(results[2], commands.TurnRefused)


def test_a_failed_batch_call_fails_each_of_its_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    writes = _FakeWrites()
    writes.fail = True
    writes.release.set()
    monkeypatch.setattr(send_batch, "socket_db", writes)

    async def burst() -> list[Any]:
        batcher = send_batch.SendBatcher()
        sends = [asyncio.ensure_future(batcher.send(_request(t))) for t in ("a", "b")]
        return await asyncio.gather(*sends, return_exceptions=True)

    results = asyncio.run(burst())
    assert writes.batches == [["a", "b"]]
    assert all(isinstance(r, ConnectionError) for r in results)


def test_a_batch_is_at_most_max_batch_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    writes = _FakeWrites()
    writes.release.set()
    monkeypatch.setattr(send_batch, "socket_db", writes)
    monkeypatch.setattr(send_batch, "MAX_BATCH", 3)

    async def burst() -> list[Any]:
        batcher = send_batch.SendBatcher()
        sends = [asyncio.ensure_future(batcher.send(_request(str(i)))) for i in range(7)]
        return await asyncio.gather(*sends)

    assert asyncio.run(burst()) == [f"turn:{i}" for i in range(7)]
    assert [len(b) for b in writes.batches] == [3, 3, 1]


@pytest.mark.django_db(transaction=True)
def test_a_bursts_turns_go_to_the_workers_together_in_messages_of_at_most_twenty(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    from openworker.runtime.turns import runner, tasks

    settings.DISTRIBUTED = True
    one, many = [], []
    monkeypatch.setattr(tasks.run_turn_task, "delay", one.append)
    monkeypatch.setattr(tasks.run_turns_task, "delay", many.append)
    monkeypatch.setattr(commands.events, "publish_many", lambda notices: None)
    senders = [_user_with_session(f"user-{i}") for i in range(45)]
    results = commands.turns_send(
        sends=[commands.SendRequest(session=s, user=u, text="hi") for u, s in senders]
    )
    ids = [str(turn.pk) for turn in results]

    # After the commit, in order: 20, 20 and 5 turns, one message each.
    assert one == []
    assert [len(chunk) for chunk in many] == [20, 20, 5]
    assert [turn_id for chunk in many for turn_id in chunk] == ids
    # A turn alone keeps the one-turn task (the name older deploys' messages carry).
    user, session = _user_with_session("alone")
    turn = commands.turn_send(session=session, user=user, text="hi")
    assert one == [str(turn.pk)] and len(many) == 3
    # Nothing leaves before the commit: a rolled-back write sends nothing.
    with pytest.raises(RuntimeError), transaction.atomic():
        runner.turns_enqueue(ids[:3])
        raise RuntimeError
    assert len(many) == 3
