"""Admission control (embedded, in-process): a process runs at most TURNS_PER_PROCESS
turns at once; the others wait first come first served, their pages told their place,
and every one of them completes with every token. A turn stopped while it waits never
runs; a waiting turn is never handed over again by the sweeper; a duplicate delivery
runs nothing twice."""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from openworker.runtime.store import turn_state
from openworker.runtime.turns import admission, runner
from sessions.models import Message, Session, Turn
from tests.fakes import Reply, drip, text
from tests.support.chat import (
    assert_gapless,
    read_until_status,
    streamed_text,
    users_with_a_session,
)
from tests.test_engine_embedded import open_socket

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "anthropic:claude-test-1"
WORDS = [f"w{i} " for i in range(20)]


def _users_with_sessions(count: int, fake: Any) -> list[tuple[Any, Session]]:
    return users_with_a_session(count, fake.base_url, prefix="queued", model=MODEL)


async def _send_in_order(sockets: list[Any]) -> None:
    """Send on each socket, one after another: the order the turns arrive in."""
    for ws in sockets:
        await ws.send_json_to({"type": "send", "text": "stream, please"})
        assert (await ws.receive_json_from(timeout=10))["type"] == "message.user"


async def test_a_burst_beyond_capacity_waits_in_order_and_every_turn_streams_in_full(
    settings: Any, anthropic_fake: Any
) -> None:
    settings.TURNS_PER_PROCESS = 2
    for _ in range(5):
        anthropic_fake.push(Reply(drip(0.1), *[text(w) for w in WORDS]))
    pairs = await sync_to_async(_users_with_sessions)(5, anthropic_fake)
    runner.embedded_runner.bind(asyncio.get_running_loop())
    sockets = [await open_socket(user, session) for user, session in pairs]
    await _send_in_order(sockets)

    pages = await asyncio.gather(*(read_until_status(ws, timeout=60) for ws in sockets))

    for events in pages:
        assert events[-1]["status"] == "completed"
        assert streamed_text(events) == "".join(WORDS)
        assert_gapless(events)
    places = [[e["position"] for e in events if e["type"] == "turn.queued"] for events in pages]
    # The first two ran at once; the others were told their place on arrival, and it
    # only ever came closer.
    assert places[0] == places[1] == []
    assert [p[0] for p in places[2:]] == [1, 2, 3]
    for seen in places[2:]:
        assert seen == sorted(seen, reverse=True)
    # Told before it ran, and numbered with the turn's events.
    for events in pages[2:]:
        kinds = [e["type"] for e in events]
        assert kinds.index("turn.queued") < kinds.index("turn.status")
        assert events[0]["seq"] == 1
    # First come, first served.
    turn_ids = [events[-1]["turn"] for events in pages]
    started = {
        str(pk): at
        async for pk, at in Turn.objects.filter(pk__in=turn_ids).values_list("pk", "started_at")
    }
    assert sorted(turn_ids[2:], key=started.__getitem__) == turn_ids[2:]
    assert len(anthropic_fake.requests) == 5
    for ws in sockets:
        await ws.disconnect()


async def test_a_turn_stopped_while_it_waits_never_runs(settings: Any, anthropic_fake: Any) -> None:
    settings.TURNS_PER_PROCESS = 1
    anthropic_fake.push(Reply(drip(0.1), *[text(w) for w in WORDS]))
    pairs = await sync_to_async(_users_with_sessions)(2, anthropic_fake)
    runner.embedded_runner.bind(asyncio.get_running_loop())
    first, second = [await open_socket(user, session) for user, session in pairs]
    await _send_in_order([first, second])
    queued = await second.receive_json_from(timeout=10)
    assert queued["type"] == "turn.queued" and queued["position"] == 1

    await second.send_json_to({"type": "stop", "turn": queued["turn"]})
    stopped = await read_until_status(second, timeout=10)
    assert stopped[-1]["status"] == "cancelled"
    assert (await read_until_status(first, timeout=30))[-1]["status"] == "completed"
    await runner.embedded_runner.wait(queued["turn"])

    assert len(anthropic_fake.requests) == 1
    assert (await Turn.objects.aget(pk=queued["turn"])).status == "cancelled"
    assert not await Message.objects.filter(turn_id=queued["turn"], role="assistant").aexists()
    await first.disconnect()
    await second.disconnect()


async def test_a_waiting_turn_is_held_so_the_sweeper_does_not_hand_it_over_again(
    settings: Any, anthropic_fake: Any
) -> None:
    settings.TURNS_PER_PROCESS = 1
    anthropic_fake.push(Reply(drip(0.1), *[text(w) for w in WORDS]))
    pairs = await sync_to_async(_users_with_sessions)(2, anthropic_fake)
    runner.embedded_runner.bind(asyncio.get_running_loop())
    first, second = [await open_socket(user, session) for user, session in pairs]
    await _send_in_order([first, second])
    queued = await second.receive_json_from(timeout=10)
    assert queued["type"] == "turn.queued"
    # As if it had waited past the redispatch delay without anyone holding it.
    past = timezone.now() - timedelta(seconds=turn_state.REDISPATCH_AFTER_SECONDS + 1)
    await Turn.objects.filter(pk=queued["turn"]).aupdate(heartbeat_at=past)

    await admission.admission().hold_once()

    assert await sync_to_async(turn_state.turns_take_stranded)() == []
    for ws in (first, second):
        assert (await read_until_status(ws, timeout=30))[-1]["status"] == "completed"
        await ws.disconnect()


async def test_a_duplicate_delivery_of_a_running_or_waiting_turn_runs_nothing_twice() -> None:
    gate = asyncio.Event()
    runs: list[str] = []

    async def start(turn_id: str, release: object) -> None:
        runs.append(turn_id)
        await gate.wait()

    control = admission.Admission(capacity=1)
    control.hold_once = _no_database  # type: ignore[method-assign]
    tasks = [asyncio.ensure_future(control.run(turn_id, start)) for turn_id in "aab"]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert control.positions() == {"b": 1}
    await control.run("b", start)  # a duplicate of the waiting one returns at once
    gate.set()
    await asyncio.gather(*tasks)
    assert runs == ["a", "b"]
    assert not control.running and not control.waiting


async def _no_database() -> None:
    return None


async def test_a_turn_gives_its_place_back_once_final_and_a_waiting_one_starts() -> None:
    # What follows a final reply (a new session's title call) holds no place.
    titled = asyncio.Event()
    runs: list[str] = []

    async def start(turn_id: str, release: Any) -> None:
        runs.append(turn_id)
        if turn_id == "a":
            release()
            release()  # twice is once
            await titled.wait()

    control = admission.Admission(capacity=1)
    control.hold_once = _no_database  # type: ignore[method-assign]
    first = asyncio.ensure_future(control.run("a", start))
    await asyncio.sleep(0)
    await control.run("b", start)  # admitted while "a" still makes its title
    assert runs == ["a", "b"] and not first.done()
    titled.set()
    await first
    assert not control.running and not control.waiting


async def test_the_engine_gives_the_place_back_before_a_new_sessions_title(
    owner: Any, anthropic_fake: Any, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    from openworker.runtime.agent import engine
    from openworker.runtime.turns import commands
    from tests.support.chat import point_provider_at

    settings.AUTO_TITLE = True
    await sync_to_async(point_provider_at)(owner, "anthropic", anthropic_fake.base_url)
    session = await Session.objects.acreate(owner=owner, model=MODEL)  # untitled
    anthropic_fake.push(Reply(text("The reply.")))
    anthropic_fake.push(Reply(text("A fine title")))
    monkeypatch.setattr(runner, "_dispatch", lambda turn_ids: None)
    turn = await sync_to_async(commands.turn_send)(session=session, user=owner, text="hi")
    order: list[str] = []
    real_title = engine._TurnRun._title

    async def recording_title(self: Any, provider: Any) -> None:
        order.append("title")
        await real_title(self, provider)

    monkeypatch.setattr(engine._TurnRun, "_title", recording_title)
    await engine.run_turn(str(turn.pk), on_final=lambda: order.append("final"))
    assert order == ["final", "title"]
    assert (await Turn.objects.aget(pk=turn.pk)).status == "completed"
    assert (await Session.objects.aget(pk=session.pk)).title == "A fine title"


async def _a_wave_ending_together(
    control: admission.Admission, waiting: int, settings: Any, pace: tuple[float, int]
) -> tuple[list[float], list[str]]:
    """`control.capacity` turns run (started unpaced) and `waiting` more wait; the running
    ones all end in the same instant, and the pace is `pace` (turns a second, burst). The
    loop times at which the waiting ones then started, in order."""
    settings.ADMITS_PER_SECOND = 0
    loop = asyncio.get_running_loop()
    ended = asyncio.Event()
    started: list[float] = []
    order: list[str] = []

    async def start(turn_id: str, release: Any) -> None:
        if turn_id.startswith("first"):
            await ended.wait()
        else:
            started.append(loop.time())
            order.append(turn_id)

    control.hold_once = _no_database  # type: ignore[method-assign]
    names = [f"first-{i}" for i in range(control.capacity)]
    names += [f"next-{i}" for i in range(waiting)]
    tasks = [asyncio.ensure_future(control.run(name, start)) for name in names]
    await asyncio.sleep(0)
    assert len(control.running) == control.capacity
    settings.ADMITS_PER_SECOND, settings.ADMIT_BURST = pace
    ended.set()
    await asyncio.gather(*tasks)
    return started, order


async def test_places_freed_together_go_to_waiting_turns_at_the_paced_rate(
    settings: Any,
) -> None:
    started, order = await _a_wave_ending_together(
        admission.Admission(capacity=10),
        10,
        settings,
        pace=(50.0, 3),  # one every 20 ms
    )
    assert order == [f"next-{i}" for i in range(10)]  # first come, first served
    spacing = 1 / 50.0
    # A burst at once, then one per spacing: never sooner (a busy loop may be later).
    for index in range(3, 10):
        assert started[index] - started[0] >= (index - 2) * spacing - 0.002, started


async def test_unpaced_the_waiting_turns_take_the_freed_places_at_once(settings: Any) -> None:
    control = admission.Admission(capacity=10)
    deferred: list[int] = []
    control._paced_admit = lambda: deferred.append(1)  # type: ignore[method-assign]
    _, order = await _a_wave_ending_together(control, 10, settings, pace=(0.0, 1))
    assert order == [f"next-{i}" for i in range(10)]
    assert deferred == []  # each admitted as its place freed, none left for later


async def test_a_burst_of_sends_past_the_pace_starts_spread_even_with_places_free(
    settings: Any,
) -> None:
    settings.ADMITS_PER_SECOND, settings.ADMIT_BURST = 50.0, 3
    loop = asyncio.get_running_loop()
    started: dict[str, float] = {}

    async def start(turn_id: str, release: Any) -> None:
        started[turn_id] = loop.time()

    control = admission.Admission(capacity=100)
    control.hold_once = _no_database  # type: ignore[method-assign]
    names = [f"turn-{i}" for i in range(7)]
    await asyncio.gather(*(control.run(name, start) for name in names))
    times = [started[name] for name in names]
    assert times == sorted(times)  # in the order they came
    for index in range(3, 7):
        assert times[index] - times[0] >= (index - 2) / 50 - 0.002, times


class _Lateness:
    """A loop's load probe whose lateness the test sets."""

    def __init__(self) -> None:
        self.lag = 0.0


async def _start_times(control: admission.Admission, names: list[str]) -> list[float]:
    loop = asyncio.get_running_loop()
    started: dict[str, float] = {}

    async def start(turn_id: str, release: Any) -> None:
        started[turn_id] = loop.time()

    await asyncio.gather(*(control.run(name, start) for name in names))
    return [started[name] for name in names]


async def test_starts_slow_while_the_loop_runs_late_and_resume_the_pace_once_it_catches_up(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.ADMITS_PER_SECOND, settings.ADMIT_BURST = 100.0, 1  # one every 10 ms
    settings.ADMIT_LAG_LIMIT_SECONDS = 0.03
    lateness = _Lateness()
    monkeypatch.setattr(admission, "loop_load", lambda: lateness)
    control = admission.Admission(capacity=100)
    control.hold_once = _no_database  # type: ignore[method-assign]
    streaming = asyncio.Event()
    release_streaming = asyncio.Event()

    async def stream(turn_id: str, release: Any) -> None:
        streaming.set()
        await release_streaming.wait()

    running = asyncio.ensure_future(control.run("streaming", stream))
    await streaming.wait()

    lateness.lag = 0.05  # its tokens are late: starts come at a quarter of the pace
    late = await _start_times(control, [f"late-{i}" for i in range(4)])
    slowed = 0.01 / admission.LAGGING_PACE
    for earlier, later in itertools.pairwise(late):
        assert later - earlier >= slowed - 0.002, late

    lateness.lag = 0.0  # caught up: one pace's spacing on, the next may start
    await asyncio.sleep(0.012)
    assert control._may_admit_now()

    release_streaming.set()
    await running


async def test_a_late_loop_with_no_turn_running_starts_at_the_full_pace(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lateness with nothing streaming here slows nobody's tokens: starts keep the pace."""
    settings.ADMITS_PER_SECOND, settings.ADMIT_BURST = 100.0, 4
    settings.ADMIT_LAG_LIMIT_SECONDS = 0.03
    lateness = _Lateness()
    lateness.lag = 0.5
    monkeypatch.setattr(admission, "loop_load", lambda: lateness)
    control = admission.Admission(capacity=100)
    control.hold_once = _no_database  # type: ignore[method-assign]
    deferred: list[float] = []
    defer = control._admit_at

    def counting_defer(loop: asyncio.AbstractEventLoop, when: float) -> None:
        deferred.append(when)
        defer(loop, when)

    control._admit_at = counting_defer  # type: ignore[method-assign]
    await _start_times(control, [f"turn-{i}" for i in range(4)])
    assert deferred == []  # the burst's four started at once, none put off
