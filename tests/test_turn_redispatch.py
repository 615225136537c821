"""The database, not the broker, says which turns must run (embedded, in-process).

A queued turn whose task was lost (a Redis restart empties the broker; a failed claim
consumes it) is handed to the runner again by the lease sweeper; a duplicate delivery
is a no-op; Stop on a turn that never started tells every open page at once.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from openworker.runtime.agent.engine import run_turn
from openworker.runtime.store import turn_state
from openworker.runtime.turns import commands, runner, watchdog
from sessions.models import Message, Session, Turn
from tests.fakes import Reply, text
from tests.support.chat import point_provider_at, read_until_status
from tests.test_engine_embedded import open_socket

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "anthropic:claude-test-1"


@pytest.fixture
def lost_tasks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every turn handed to the runner while this is active loses its task (as the
    broker's queue does when Redis restarts empty)."""
    lost: list[str] = []
    monkeypatch.setattr(runner, "_dispatch", lost.extend)
    return lost


def make_session(owner: Any, fake: Any) -> Session:
    point_provider_at(owner, "anthropic", fake.base_url)
    return Session.objects.create(owner=owner, model=MODEL)


def age(turn_id: Any, seconds: float) -> None:
    """The turn was queued (and last handed over) `seconds` ago."""
    past = timezone.now() - timedelta(seconds=seconds)
    Turn.objects.filter(pk=turn_id).update(created_at=past, heartbeat_at=None)


def test_a_stranded_turn_is_handed_over_once_per_interval_whoever_sweeps(
    owner: Any, anthropic_fake: Any, lost_tasks: list[str]
) -> None:
    session = make_session(owner, anthropic_fake)
    turn = commands.turn_send(session=session, user=owner, text="hello")
    assert lost_tasks == [str(turn.pk)]
    # A fresh turn is left alone: its task is on its way.
    assert turn_state.turns_take_stranded() == []
    age(turn.pk, turn_state.REDISPATCH_AFTER_SECONDS + 1)
    # A turn alive in this process (embedded) is never handed over twice.
    assert turn_state.turns_take_stranded(skip=frozenset({str(turn.pk)})) == []
    now = timezone.now()
    assert turn_state.turns_take_stranded(now=now) == [str(turn.pk)]
    # Another process sweeping at the same moment finds nothing to take.
    assert turn_state.turns_take_stranded(now=now) == []
    later = now + timedelta(seconds=turn_state.REDISPATCH_AFTER_SECONDS + 1)
    assert turn_state.turns_take_stranded(now=later) == [str(turn.pk)]


async def test_a_queued_turn_whose_task_was_lost_runs_after_a_sweep_and_a_duplicate_is_a_no_op(
    owner: Any, anthropic_fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    anthropic_fake.push(Reply(text("Back again.")))
    session = await sync_to_async(make_session)(owner, anthropic_fake)
    lost: list[str] = []
    monkeypatch.setattr(runner, "_dispatch", lost.extend)
    turn = await sync_to_async(commands.turn_send)(session=session, user=owner, text="hi")
    monkeypatch.undo()
    assert lost == [str(turn.pk)]
    await sync_to_async(age)(turn.pk, turn_state.REDISPATCH_AFTER_SECONDS + 1)

    runner.embedded_runner.bind(asyncio.get_running_loop())
    assert await watchdog.sweep_once() == 1
    for _ in range(200):
        await turn.arefresh_from_db()
        if turn.status not in Turn.ACTIVE:
            break
        await asyncio.sleep(0.05)
    assert turn.status == "completed", (turn.status, turn.error)
    # The late original task (or another sweeper's) finds nothing to claim.
    await run_turn(str(turn.pk))
    roles = [
        role
        async for role in Message.objects.filter(turn=turn)
        .order_by("seq")
        .values_list("role", flat=True)
    ]
    assert roles == ["user", "assistant"]
    assert await watchdog.sweep_once() == 0
    assert len(anthropic_fake.requests) == 1


async def test_stop_on_a_turn_that_never_started_tells_every_open_page_at_once(
    owner: Any, anthropic_fake: Any, lost_tasks: list[str]
) -> None:
    session = await sync_to_async(make_session)(owner, anthropic_fake)
    first = await open_socket(owner, session)
    second = await open_socket(owner, session)
    await first.send_json_to({"type": "send", "text": "never runs"})
    for ws in (first, second):
        assert (await ws.receive_json_from(timeout=5))["type"] == "message.user"
    turn = await Turn.objects.aget(session=session)
    assert turn.status == "queued"
    await first.send_json_to({"type": "stop", "turn": str(turn.pk)})
    for ws in (first, second):
        events = await read_until_status(ws, timeout=5)
        assert events[-1]["status"] == "cancelled"
        assert events[-1]["turn"] == str(turn.pk)
        await ws.disconnect()
    # Cancelled turns do not count against the user's concurrent-turn limit.
    await sync_to_async(commands.turn_send)(session=session, user=owner, text="again")


def test_a_running_turn_whose_worker_died_does_not_hold_a_place_of_the_users_limit(
    owner: Any, anthropic_fake: Any, lost_tasks: list[str], settings: Any
) -> None:
    settings.MAX_CONCURRENT_TURNS_PER_USER = 1
    first, second = make_session(owner, anthropic_fake), make_session(owner, anthropic_fake)
    turn = commands.turn_send(session=first, user=owner, text="one")
    assert turn_state.turn_claim(turn_id=turn.pk, worker="w1") is not None
    with pytest.raises(commands.TurnRefused, match="replies running"):
        commands.turn_send(session=second, user=owner, text="two")
    # Its worker stops beating: past the lease it no longer counts.
    stale = timezone.now() - timedelta(seconds=turn_state.LEASE_SECONDS + 1)
    Turn.objects.filter(pk=turn.pk).update(heartbeat_at=stale)
    commands.turn_send(session=second, user=owner, text="two")
    # Its own session still waits for the sweeper to end it.
    with pytest.raises(commands.TurnRefused, match="still working"):
        commands.turn_send(session=first, user=owner, text="again")
