"""Leases of running turns: `runtime.store.turn_state.turns_heartbeat` renews many turns in
one database call, and `runtime.store.leases.LeaseKeeper` beats for every turn of an event
loop and tells each turn what the reply said.

The `turns_heartbeat` tests run on SQLite in the embedded phase and again on PostgreSQL
in the distributed phase (its UPDATE is hand-written SQL)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from openworker.runtime.store import turn_state
from openworker.runtime.store.leases import Lease, LeaseKeeper
from openworker.runtime.store.turn_state import HeartbeatReply, LeaseBeat
from sessions.models import Session, Turn

ME, OTHER = "worker-me", "worker-other"
LONG_AGO = timezone.now() - timedelta(hours=1)


@pytest.fixture(
    params=[
        pytest.param("embedded", id="sqlite"),
        pytest.param("distributed", id="postgresql", marks=pytest.mark.distributed),
    ]
)
def database(request: pytest.FixtureRequest, db: Any) -> str:
    if request.param == "distributed":
        request.getfixturevalue("require_distributed")
        assert connection.vendor == "postgresql"
    return connection.vendor


@pytest.fixture
def session(owner: Any, database: str) -> Session:
    return Session.objects.create(owner=owner, model="anthropic:claude-test-1")


def turn(session: Session, *, owner: str = ME, **fields: Any) -> Turn:
    values = {
        "status": Turn.Status.RUNNING,
        "lease_owner": owner,
        "heartbeat_at": LONG_AGO,
        "partial_text": "stored text",
        "partial_reasoning": "stored reasoning",
        **fields,
    }
    return Turn.objects.create(session=session, model=session.model, **values)


def beat(row: Turn, worker: str = ME, text: str | None = None, reasoning: str | None = None):
    return LeaseBeat(
        turn_id=str(row.pk), worker=worker, partial_text=text, partial_reasoning=reasoning
    )


def state(row: Turn) -> tuple[Any, ...]:
    row.refresh_from_db()
    return (row.status, row.lease_owner, row.heartbeat_at, row.partial_text, row.partial_reasoning)


# --- turns_heartbeat --------------------------------------------------------------------


def test_owned_turns_are_renewed_and_partials_written_only_when_given(session: Session) -> None:
    written, kept, emptied = turn(session), turn(session), turn(session)
    replies = turn_state.turns_heartbeat(
        beats=[
            beat(written, text="new text", reasoning="new reasoning"),
            beat(kept),  # unchanged since the last beat: None leaves the row alone
            beat(emptied, text="", reasoning=""),  # empty is a value, not "unchanged"
        ]
    )
    assert replies == {
        str(row.pk): HeartbeatReply(owned=True, cancel_requested=False)
        for row in (written, kept, emptied)
    }
    for row in (written, kept, emptied):
        row.refresh_from_db()
        assert row.heartbeat_at > LONG_AGO
        assert (row.status, row.lease_owner) == (Turn.Status.RUNNING, ME)
    assert (written.partial_text, written.partial_reasoning) == ("new text", "new reasoning")
    assert (kept.partial_text, kept.partial_reasoning) == ("stored text", "stored reasoning")
    assert (emptied.partial_text, emptied.partial_reasoning) == ("", "")


def test_a_turn_swept_or_owned_by_another_worker_is_not_ours_and_not_touched(
    session: Session,
) -> None:
    swept = turn(session)  # its heartbeat stopped long ago: the sweeper took it
    assert [t.pk for t in turn_state.turns_expire_leases()] == [swept.pk]
    stolen = turn(session, owner=OTHER)
    finished = turn(session, status=Turn.Status.COMPLETED)  # our name, no longer running
    gone = uuid.uuid4()
    before = {row.pk: state(row) for row in (stolen, swept, finished)}

    replies = turn_state.turns_heartbeat(
        beats=[beat(row, text="mine?", reasoning="mine?") for row in (stolen, swept, finished)]
        + [LeaseBeat(turn_id=str(gone), worker=ME, partial_text="x", partial_reasoning="x")]
    )
    not_ours = HeartbeatReply(owned=False, cancel_requested=False)
    assert replies == {
        str(stolen.pk): not_ours,
        str(swept.pk): not_ours,
        str(finished.pk): not_ours,
        str(gone): not_ours,
    }
    assert {row.pk: state(row) for row in (stolen, swept, finished)} == before
    assert not Turn.objects.filter(pk=gone).exists()


def test_a_requested_stop_is_reported_to_the_lease_holder_only(session: Session) -> None:
    stopping = turn(session, cancel_requested=True)
    running = turn(session)
    others_stopping = turn(session, owner=OTHER, cancel_requested=True)
    replies = turn_state.turns_heartbeat(
        beats=[beat(stopping), beat(running), beat(others_stopping)]
    )
    assert replies[str(stopping.pk)] == HeartbeatReply(owned=True, cancel_requested=True)
    assert replies[str(running.pk)] == HeartbeatReply(owned=True, cancel_requested=False)
    assert replies[str(others_stopping.pk)] == HeartbeatReply(owned=False, cancel_requested=False)


def test_a_heartbeat_of_many_turns_is_two_statements(session: Session) -> None:
    # One lock-and-read and one UPDATE ... FROM (VALUES ...): the worker beats for all its
    # turns every second, and a statement per turn cost its streams.
    rows = [turn(session) for _ in range(20)]
    with CaptureQueriesContext(connection) as queries:
        replies = turn_state.turns_heartbeat(
            beats=[beat(row, text=f"text {n}") for n, row in enumerate(rows)]
        )
    statements = [
        q["sql"] for q in queries if not q["sql"].upper().startswith(("SAVEPOINT", "RELEASE"))
    ]
    assert len(statements) == 2
    assert all(reply.owned for reply in replies.values())
    assert [state(row)[3] for row in rows] == [f"text {n}" for n in range(len(rows))]


def test_no_beats_is_no_query(session: Session) -> None:
    with CaptureQueriesContext(connection) as queries:
        assert turn_state.turns_heartbeat(beats=[]) == {}
    assert len(queries) == 0


def test_fifty_turns_take_as_many_queries_as_one(session: Session) -> None:
    one = turn(session)
    with CaptureQueriesContext(connection) as queries_for_one:
        turn_state.turns_heartbeat(beats=[beat(one, text="1", reasoning="1")])

    ours = [turn(session) for _ in range(40)]
    theirs = [turn(session, owner=OTHER) for _ in range(10)]
    beats = [beat(row, text=f"text {i}", reasoning="r") for i, row in enumerate(ours + theirs)]
    with CaptureQueriesContext(connection) as queries_for_fifty:
        replies = turn_state.turns_heartbeat(beats=beats)

    # At most: savepoint, the one (executemany) UPDATE, release, the SELECT.
    assert len(queries_for_fifty) == len(queries_for_one) <= 4
    assert [replies[str(row.pk)].owned for row in ours + theirs] == [True] * 40 + [False] * 10
    renewed = Turn.objects.filter(pk__in=[row.pk for row in ours], heartbeat_at__gt=LONG_AGO)
    assert sorted(renewed.values_list("partial_text", flat=True)) == sorted(
        f"text {i}" for i in range(40)
    )
    untouched = Turn.objects.filter(pk__in=[row.pk for row in theirs])
    assert set(untouched.values_list("heartbeat_at", "partial_text")) == {(LONG_AGO, "stored text")}


# --- LeaseKeeper (with a recording turns_heartbeat) ---------------------------------------


class Heartbeats:
    """Stands in for `turn_state.turns_heartbeat`: records every call's beats and answers
    from `replies` (turn id → HeartbeatReply; owned and not stopping otherwise)."""

    def __init__(self) -> None:
        self.calls: list[list[LeaseBeat]] = []
        self.replies: dict[str, HeartbeatReply] = {}
        self.fail_next = False
        self.hold: threading.Event | None = None  # when set: block until released
        self.entered = threading.Event()

    def __call__(self, *, beats: list[LeaseBeat]) -> dict[str, HeartbeatReply]:
        self.calls.append(list(beats))
        self.entered.set()
        if self.hold is not None:
            assert self.hold.wait(10)
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("database away")
        fine = HeartbeatReply(owned=True, cancel_requested=False)
        return {b.turn_id: self.replies.get(b.turn_id, fine) for b in beats}


@pytest.fixture
def heartbeats(monkeypatch: pytest.MonkeyPatch) -> Heartbeats:
    fake = Heartbeats()
    monkeypatch.setattr(turn_state, "turns_heartbeat", fake)
    return fake


class Turnish:
    """What a running turn gives its lease: its partials, and what it was told."""

    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self.text, self.reasoning = "", ""
        self.lost = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.told: list[str] = []

    def lease(self) -> Lease:
        return Lease(
            turn_id=self.turn_id,
            worker=ME,
            partials=lambda: (self.text, self.reasoning),
            on_lost=lambda: (self.told.append("lost"), self.lost.set()),
            on_cancel=lambda: (self.told.append("cancel"), self.cancelled.set()),
        )


async def test_lost_and_stopped_turns_are_told_by_the_keepers_own_beat(
    heartbeats: Heartbeats,
) -> None:
    # The ticker thread starts with the first hold and beats after one interval: at 10 ms a
    # busy machine could let it beat between two holds (a flake seen once), so 200 ms.
    keeper = LeaseKeeper(interval=0.2)
    lost, stopped, fine = Turnish("lost"), Turnish("stopped"), Turnish("fine")
    heartbeats.replies = {
        "lost": HeartbeatReply(owned=False, cancel_requested=False),
        "stopped": HeartbeatReply(owned=True, cancel_requested=True),
    }
    for t in (lost, stopped, fine):
        keeper.hold(t.lease())

    await asyncio.wait_for(asyncio.gather(lost.lost.wait(), stopped.cancelled.wait()), 10)
    assert lost.told == ["lost"]  # told once: a lost lease is released, not beaten again
    assert "lost" not in stopped.told and fine.told == []
    # All three went in one call.
    assert {b.turn_id for b in heartbeats.calls[0]} == {"lost", "stopped", "fine"}

    # The lost turn is no longer beaten; the others are.
    calls_before = len(heartbeats.calls)
    while len(heartbeats.calls) < calls_before + 2:
        await asyncio.sleep(0.01)
    assert {b.turn_id for b in heartbeats.calls[-1]} == {"stopped", "fine"}
    keeper.release("stopped")
    keeper.release("fine")


async def test_a_released_lease_is_not_beaten(heartbeats: Heartbeats) -> None:
    keeper = LeaseKeeper(interval=3600)  # beats driven by the test
    ending, running = Turnish("ending"), Turnish("running")
    keeper.hold(ending.lease())
    keeper.hold(running.lease())
    keeper.release("ending")
    await keeper.beat()
    assert [b.turn_id for b in heartbeats.calls[-1]] == ["running"]
    keeper.release("running")


async def test_a_lease_released_while_its_beat_was_in_flight_is_not_told(
    heartbeats: Heartbeats,
) -> None:
    keeper = LeaseKeeper(interval=3600)
    ended = Turnish("ended")
    keeper.hold(ended.lease())
    heartbeats.replies = {"ended": HeartbeatReply(owned=False, cancel_requested=False)}
    heartbeats.hold = threading.Event()
    beating = asyncio.create_task(keeper.beat())
    await asyncio.to_thread(heartbeats.entered.wait, 10)
    keeper.release("ended")  # the turn finished meanwhile; its row says "not running"
    heartbeats.hold.set()
    await beating
    assert ended.told == []


async def test_an_unchanged_partial_is_not_sent_again(heartbeats: Heartbeats) -> None:
    keeper = LeaseKeeper(interval=3600)
    streaming = Turnish("streaming")
    keeper.hold(streaming.lease())

    streaming.text, streaming.reasoning = "Hel", "thinking"
    await keeper.beat()
    await keeper.beat()  # nothing new
    streaming.text += "lo"
    await keeper.beat()  # the text changed: both partials go, together
    sent = [(b.partial_text, b.partial_reasoning) for [b] in heartbeats.calls]
    assert sent == [("Hel", "thinking"), (None, None), ("Hello", "thinking")]
    keeper.release("streaming")


async def test_partials_of_a_failed_beat_are_sent_again(heartbeats: Heartbeats) -> None:
    keeper = LeaseKeeper(interval=3600)
    streaming = Turnish("streaming")
    keeper.hold(streaming.lease())
    streaming.text = "so far"

    heartbeats.fail_next = True
    with pytest.raises(ConnectionError):
        await keeper.beat()
    await keeper.beat()
    sent = [(b.partial_text, b.partial_reasoning) for [b] in heartbeats.calls]
    assert sent == [("so far", ""), ("so far", "")]
    assert streaming.told == []
    keeper.release("streaming")


async def test_the_keeper_beats_again_after_its_last_lease_went(heartbeats: Heartbeats) -> None:
    keeper = LeaseKeeper(interval=0.01)
    first = Turnish("first")
    heartbeats.replies = {"first": HeartbeatReply(owned=False, cancel_requested=False)}
    keeper.hold(first.lease())
    await asyncio.wait_for(first.lost.wait(), 10)  # no leases left: the beating loop ends

    second = Turnish("second")
    heartbeats.replies = {"second": HeartbeatReply(owned=True, cancel_requested=True)}
    keeper.hold(second.lease())
    await asyncio.wait_for(second.cancelled.wait(), 10)
    keeper.release("second")


# --- LeaseKeeper with the real database -------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_the_keeper_writes_partials_and_learns_of_a_sweep(owner: Any) -> None:
    session = await Session.objects.acreate(owner=owner, model="anthropic:claude-test-1")
    row = await sync_to_async(turn)(session, partial_text="", partial_reasoning="")
    streaming = Turnish(str(row.pk))
    streaming.text, streaming.reasoning = "partial answer", "partial thought"
    keeper = LeaseKeeper(interval=3600)
    keeper.hold(streaming.lease())

    await keeper.beat()
    row = await Turn.objects.aget(pk=row.pk)
    assert (row.partial_text, row.partial_reasoning) == ("partial answer", "partial thought")
    assert row.heartbeat_at > LONG_AGO
    assert streaming.told == []

    # The sweeper decided the worker was dead (its heartbeat stopped long ago).
    await Turn.objects.filter(pk=row.pk).aupdate(heartbeat_at=LONG_AGO)
    assert len(await sync_to_async(turn_state.turns_expire_leases)()) == 1
    streaming.text = "partial answer, more"
    await keeper.beat()
    assert streaming.told == ["lost"]
    row = await Turn.objects.aget(pk=row.pk)
    assert (row.status, row.partial_text) == (Turn.Status.INTERRUPTED, "partial answer")


async def test_the_keeper_beats_while_its_event_loop_is_blocked(heartbeats: Heartbeats) -> None:
    # A loop running late under load must not let its turns' leases lapse: the beats are
    # timed by the keeper's own thread, so they go on while the loop does not run at all.
    keeper = LeaseKeeper(interval=0.01)
    streaming = Turnish("streaming")
    streaming.text = "so far"
    keeper.hold(streaming.lease())
    calls_before = len(heartbeats.calls)
    time.sleep(0.5)  # the loop is stuck: no task of it runs meanwhile
    assert len(heartbeats.calls) - calls_before >= 3
    assert heartbeats.calls[calls_before][0].partial_text == "so far"
    keeper.release("streaming")


async def test_a_turn_is_told_of_a_lost_lease_on_its_own_loop(heartbeats: Heartbeats) -> None:
    keeper = LeaseKeeper(interval=0.01)
    lost = Turnish("lost")
    heartbeats.replies = {"lost": HeartbeatReply(owned=False, cancel_requested=False)}
    told_on: list[int] = []
    lease = lost.lease()
    lease.on_lost = lambda: (told_on.append(threading.get_ident()), lost.lost.set())
    keeper.hold(lease)
    await asyncio.wait_for(lost.lost.wait(), 10)
    assert told_on == [threading.get_ident()]
