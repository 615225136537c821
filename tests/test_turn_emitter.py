"""`openworker.runtime.live.emitter.TurnEmitter`: one turn's events are numbered, coalesced, put in
the replay buffer and published, in that order; and `RedisReplayBuffer.append_soon`'s
TTL renewals. A recording buffer and publish stand in for Redis except in the distributed
tests at the end: there deltas go out with no future each, `close` waits until Redis has
them, and a delta's failed append is repaired."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from channels.layers import get_channel_layer
from django.conf import settings
from redis.exceptions import ConnectionError as RedisConnectionError

from openworker.runtime.live import events, redis_batch, replay
from openworker.runtime.live.emitter import (
    BACKLOG_ROOM,
    LAG_WIDENING,
    LOAD_PROBE_SECONDS,
    MAX_COALESCE_SECONDS,
    LoopLoad,
    TurnEmitter,
)
from openworker.runtime.live.redis_batch import batcher_for
from openworker.runtime.live.replay import REFRESH_TTL_EVERY, RUNNING_TTL_SECONDS, RedisReplayBuffer

SESSION, TURN = "session-1", "turn-1"


class Recorder:
    """Stands in for the replay buffer (`append_soon`) and for `events.publish_soon`:
    records each call when it is made (the queueing moment) and hands back a future.

    `append` / `publish`: "ok" (resolved), "pending" (resolved by the test), "raise"
    (raises when called) or "fail" (a future that failed)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int, dict[str, Any]]] = []
        self.published_to: list[str] = []
        self.pending: list[asyncio.Future[Any]] = []
        self.append = "ok"
        self.publish = "ok"

    def _outcome(self, mode: str, what: str) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if mode == "raise":
            raise ConnectionError(f"{what}: no connection")
        if mode == "ok":
            future.set_result(None)
        elif mode == "fail":
            future.set_exception(ConnectionError(f"{what}: connection lost"))
        else:
            self.pending.append(future)
        return future

    def append_soon(self, turn_id: str, seq: int, event: dict[str, Any]) -> Any:
        assert turn_id == event["turn"] and seq == event["seq"]
        self.log.append(("append", seq, event))
        return self._outcome(self.append, "append")

    def publish_soon(self, session_id: object, event: dict[str, Any]) -> Any:
        self.log.append(("publish", event["seq"], event))
        self.published_to.append(str(session_id))
        return self._outcome(self.publish, "publish")

    def events(self) -> list[dict[str, Any]]:
        return [event for what, _, event in self.log if what == "publish"]

    def texts(self) -> list[str | None]:
        return [event.get("text") for event in self.events()]

    def resolve_pending(self, count: int | None = None) -> None:
        for future in self.pending[:count]:
            future.set_result(None)
        del self.pending[:count]


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    fake = Recorder()
    monkeypatch.setattr(events, "publish_soon", fake.publish_soon)
    return fake


def emitter_for(recorder: Recorder, **options: Any) -> TurnEmitter:
    return TurnEmitter(session_id=SESSION, turn_id=TURN, buffer=recorder, **options)  # type: ignore[arg-type]


def assert_appended_then_published_gaplessly(recorder: Recorder, first_seq: int) -> None:
    seqs = [seq for _, seq, _ in recorder.log]
    count = len(seqs) // 2
    assert count > 0
    assert [what for what, _, _ in recorder.log] == ["append", "publish"] * count
    assert seqs == [s for s in range(first_seq, first_seq + count) for _ in range(2)]
    for (_, _, appended), (_, _, published) in zip(
        recorder.log[::2], recorder.log[1::2], strict=True
    ):
        assert appended == published
    assert set(recorder.published_to) == {SESSION}


# --- order and numbering ------------------------------------------------------------------


async def test_each_event_is_appended_then_published_with_gapless_seqs(recorder) -> None:
    emitter = emitter_for(recorder, start_seq=7, coalesce_seconds=60)

    emitter.delta(text="Hel")  # the first delta: out at once
    emitter.delta(text="lo")  # within the window: held back
    emitter.delta(reasoning="hmm")
    status = await emitter.emit("turn.status", status="running")  # held deltas go first
    emitter.delta(text=" world")
    emitter.delta(reasoning="")  # nothing to add
    message = await emitter.emit("message", message={"id": 1})
    emitter.delta(text="!")
    await emitter.close()

    assert_appended_then_published_gaplessly(recorder, first_seq=8)
    assert [(e["seq"], e["type"]) for e in recorder.events()] == [
        (8, "delta"),
        (9, "delta"),
        (10, "turn.status"),
        (11, "delta"),
        (12, "message"),
        (13, "delta"),
    ]
    by_seq = {e["seq"]: e for e in recorder.events()}
    assert by_seq[8] == {"type": "delta", "turn": TURN, "seq": 8, "text": "Hel"}
    assert by_seq[9] == {"type": "delta", "turn": TURN, "seq": 9, "text": "lo", "reasoning": "hmm"}
    assert by_seq[11] == {"type": "delta", "turn": TURN, "seq": 11, "text": " world"}
    assert (status["seq"], message["seq"]) == (10, 12)
    assert status == {"type": "turn.status", "turn": TURN, "seq": 10, "status": "running"}


async def test_a_delta_is_queued_when_called_not_later(recorder) -> None:
    emitter = emitter_for(recorder, coalesce_seconds=0)
    for seq, word in enumerate(("one ", "two ", "three"), start=1):
        emitter.delta(text=word)
        # No await between the call and both queueings.
        assert [(what, s, e["text"]) for what, s, e in recorder.log[-2:]] == [
            ("append", seq, word),
            ("publish", seq, word),
        ]
    assert_appended_then_published_gaplessly(recorder, first_seq=1)
    await emitter.close()


# --- coalescing, on a virtual clock ---------------------------------------------------------


@pytest.fixture
def virtual_loop() -> Iterator[tuple[asyncio.AbstractEventLoop, Callable[[float], None]]]:
    """An event loop whose clock moves only when the test says so (timers fire when the
    virtual time reaches them), so windows are exact and nothing depends on real time."""
    now = [1000.0]
    loop = asyncio.new_event_loop()
    loop.time = lambda: now[0]  # type: ignore[method-assign]

    def advance_to(moment: float) -> None:
        now[0] = 1000.0 + moment
        for _ in range(3):  # due timers fire, then their callbacks run
            loop.run_until_complete(asyncio.sleep(0))

    yield loop, advance_to
    loop.close()


def test_a_quiet_delta_goes_out_at_once_and_a_burst_once_per_window(recorder, virtual_loop) -> None:
    loop, at = virtual_loop
    emitter = emitter_for(recorder, coalesce_seconds=0.25)

    def delta(**fields: str) -> list[str | None]:
        """Call `delta` on the loop; what was published by the time it returned."""

        async def call() -> list[str | None]:
            emitter.delta(**fields)
            return recorder.texts()

        return loop.run_until_complete(call())

    at(0.0)
    assert delta(text="a") == ["a"]  # nothing sent before: at once
    at(0.0625)
    assert delta(text="b") == ["a"]  # a burst: held until the window ends
    at(0.125)
    assert delta(text="c", reasoning="r") == ["a"]
    at(0.2421875)
    assert recorder.texts() == ["a"]
    at(0.25)  # the window of the first flush ends: one event for the whole burst
    assert recorder.texts() == ["a", "bc"]
    assert recorder.events()[-1]["reasoning"] == "r"

    at(0.3125)
    assert delta(text="d") == ["a", "bc"]  # within the window of the flush at 0.25
    at(0.4375)
    assert delta(text="e") == ["a", "bc"]
    at(0.5)
    assert recorder.texts() == ["a", "bc", "de"]

    at(2.0)  # a quiet spell
    assert delta(text="f") == ["a", "bc", "de", "f"]
    at(2.0625)
    assert delta(text="g") == ["a", "bc", "de", "f"]
    loop.run_until_complete(emitter.close())  # close sends what is held
    assert recorder.texts() == ["a", "bc", "de", "f", "g"]
    assert_appended_then_published_gaplessly(recorder, first_seq=1)


# --- adaptive coalescing ---------------------------------------------------------------------


class FixedLoad:
    """A loop load whose window the test sets."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def window(self, floor: float) -> float:
        return max(floor, self.seconds)


def test_with_room_each_token_is_a_frame_and_under_load_a_window_carries_many(
    recorder, virtual_loop
) -> None:
    loop, at = virtual_loop
    load = FixedLoad()
    emitter = emitter_for(recorder, coalesce_seconds=0.0, load=load)

    def delta(value: str) -> None:
        async def call() -> None:
            emitter.delta(text=value)

        loop.run_until_complete(call())

    for index, token in enumerate("abcd"):
        at(index * 0.01)
        delta(token)
    assert recorder.texts() == ["a", "b", "c", "d"]  # room: one frame per token

    load.seconds = 0.2  # the loop or the publisher falls behind
    for index, token in enumerate("efghij"):
        at(1.0 + index * 0.01)
        delta(token)
    assert recorder.texts() == ["a", "b", "c", "d", "e"]  # leading edge, then held
    at(1.2)
    assert recorder.texts() == ["a", "b", "c", "d", "e", "fghij"]
    assert_appended_then_published_gaplessly(recorder, first_seq=1)


async def test_the_window_widens_with_the_loops_lateness_and_the_redis_backlog(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    load = LoopLoad()
    assert load.window(0.04) == 0.04  # room: the configured window
    load.lag = 0.03
    assert 0.03 * LAG_WIDENING > 0.04
    assert load.window(0.04) == pytest.approx(0.03 * LAG_WIDENING)
    load.lag = 5.0
    assert load.window(0.04) == MAX_COALESCE_SECONDS  # never wider than this
    load.lag = 0.0
    monkeypatch.setattr(redis_batch, "backlog", lambda: 2 * BACKLOG_ROOM)
    assert load.window(0.04) == 0.04  # the backlog is sampled with the lateness, not per delta
    await asyncio.sleep(LOAD_PROBE_SECONDS * 3)
    load.lag = 0.0
    assert load.window(0.04) == pytest.approx(0.08)


async def test_the_load_probe_sees_a_loop_that_was_blocked() -> None:
    load = LoopLoad()
    load.window(0.04)  # an emitter asks: the probe starts
    time.sleep(0.3)  # the loop is stuck in someone's code
    await asyncio.sleep(LOAD_PROBE_SECONDS * 2)
    assert load.lag >= 0.1
    assert load.window(0.04) > 0.04


# --- failures and waiting ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["raise", "fail"])
@pytest.mark.parametrize(
    ("side", "what"),
    [("append", "replay buffer append"), ("publish", "channel layer publish")],
)
async def test_a_failed_send_is_logged_and_the_other_still_happens(
    recorder, caplog: pytest.LogCaptureFixture, mode: str, side: str, what: str
) -> None:
    setattr(recorder, side, mode)
    emitter = emitter_for(recorder, coalesce_seconds=0)
    with caplog.at_level(logging.WARNING, logger="openworker.runtime.live.emitter"):
        event = await emitter.emit("turn.status", status="running")
        emitter.delta(text="still streaming")
        await emitter.close()
        await asyncio.sleep(0)

    # Both events were recorded on both sides, in order, whatever failed.
    assert [(w, s) for w, s, _ in recorder.log] == [
        ("append", 1),
        ("publish", 1),
        ("append", 2),
        ("publish", 2),
    ]
    assert event["seq"] == 1
    failures = [r for r in caplog.records if r.getMessage() == f"{what} failed for turn {TURN}"]
    assert len(failures) == 2  # the status's and the delta's
    assert all(isinstance(r.exc_info[1], ConnectionError) for r in failures)  # type: ignore[index]


async def test_emit_waits_for_its_append_and_publish(recorder) -> None:
    recorder.append = recorder.publish = "pending"
    emitter = emitter_for(recorder)
    emitting = asyncio.create_task(emitter.emit("turn.status", status="running"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not emitting.done()
    recorder.resolve_pending(1)  # the append
    for _ in range(5):
        await asyncio.sleep(0)
    assert not emitting.done()
    recorder.resolve_pending()  # the publish
    assert (await emitting)["seq"] == 1


async def test_emit_soon_queues_its_event_first_and_close_waits_for_its_outcome(
    recorder,
) -> None:
    recorder.append = recorder.publish = "pending"
    emitter = emitter_for(recorder, coalesce_seconds=60)
    emitter.delta(text="held")  # waiting for the window: it goes out before the status
    event = emitter.emit_soon("turn.status", status="running")
    emitter.delta(text="after")  # the next window's
    assert event["seq"] == 2
    assert [(e["type"], e.get("text")) for e in recorder.events()] == [
        ("delta", "held"),
        ("turn.status", None),
    ]
    closing = asyncio.create_task(emitter.close())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not closing.done()  # nobody awaited the status: close does
    recorder.resolve_pending()
    await closing
    assert [e.get("text") for e in recorder.events()] == ["held", None, "after"]
    assert_appended_then_published_gaplessly(recorder, first_seq=1)


async def test_close_sends_held_deltas_and_waits_for_those_in_flight(recorder) -> None:
    recorder.append = recorder.publish = "pending"
    emitter = emitter_for(recorder, coalesce_seconds=60)
    emitter.delta(text="sent ")  # out at once; its outcome is not awaited
    emitter.delta(text="held")  # waiting for the window
    assert recorder.texts() == ["sent "]

    closing = asyncio.create_task(emitter.close())
    for _ in range(5):
        await asyncio.sleep(0)
    assert recorder.texts() == ["sent ", "held"]
    assert len(recorder.pending) == 4
    recorder.resolve_pending(3)
    for _ in range(5):
        await asyncio.sleep(0)
    assert not closing.done()  # one publish still in flight
    recorder.resolve_pending()
    await closing
    assert_appended_then_published_gaplessly(recorder, first_seq=1)


# --- RedisReplayBuffer.append_soon: TTL renewals ------------------------------------------------


class RecordingBatcher:
    def __init__(self) -> None:
        self.commands: list[tuple[Any, ...]] = []

    def submit(self, *args: Any) -> asyncio.Future[Any]:
        self.commands.append(args)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(1)
        return future


async def test_the_buffer_ttl_is_renewed_on_status_events_and_every_so_many_deltas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batcher = RecordingBatcher()
    monkeypatch.setattr(replay, "batcher_for", lambda url: batcher)
    buffer = RedisReplayBuffer("redis://unused", prefix="p")
    key = "p:turn:t:events"

    def event(seq: int, type_: str) -> dict[str, Any]:
        return {"type": type_, "turn": "t", "seq": seq}

    kinds = {1: "turn.status", 80: "turn.status"}
    for seq in range(1, 81):
        await buffer.append_soon("t", seq, event(seq, kinds.get(seq, "delta")))

    added = [c for c in batcher.commands if c[0] == "XADD"]
    assert [c[5] for c in added] == [f"{seq}-0" for seq in range(1, 81)]
    assert all(c[1] == key for c in added)
    # The seq each EXPIRE followed (an EXPIRE comes right after its event's XADD).
    renewed_after = [
        int(batcher.commands[i - 1][5].split("-")[0])
        for i, c in enumerate(batcher.commands)
        if c[0] == "EXPIRE"
    ]
    assert all(
        c == ("EXPIRE", key, RUNNING_TTL_SECONDS) for c in batcher.commands if c[0] != "XADD"
    )
    # Both statuses, and deltas once every REFRESH_TTL_EVERY events (not with each).
    assert renewed_after == [1, 1 + REFRESH_TTL_EVERY, 1 + 2 * REFRESH_TTL_EVERY, 80]


# --- distributed: the real buffer and channel layer -----------------------------------------


async def close_clients(buffer: RedisReplayBuffer) -> None:
    """Close the test loop's Redis clients the buffer made (the loop ends with the test)."""
    await batcher_for(settings.REDIS_URL).aclose()
    await buffer._client().aclose()


@dataclasses.dataclass
class LiveTurn:
    """A turn's emitter on the real buffer and channel layer, with a page listening."""

    emitter: TurnEmitter
    buffer: RedisReplayBuffer
    layer: Any
    channel: str
    redis: aioredis.Redis
    key: str

    async def received(self) -> list[dict[str, Any]]:
        """What the page got, until it is quiet for half a second."""
        got: list[dict[str, Any]] = []
        while True:
            try:
                message = await asyncio.wait_for(self.layer.receive(self.channel), 0.5)
            except TimeoutError:
                return got
            got.append(message["event"])


@contextlib.asynccontextmanager
async def live_turn(
    make_buffer: Callable[..., RedisReplayBuffer] = RedisReplayBuffer,
) -> AsyncIterator[LiveTurn]:
    prefix = f"test-emitter-{uuid.uuid4().hex}"
    session_id, turn_id = uuid.uuid4().hex, uuid.uuid4().hex
    buffer = make_buffer(settings.REDIS_URL, prefix=prefix)
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(events.session_group(session_id), channel)
    redis = aioredis.Redis.from_url(settings.REDIS_URL)
    key = f"{prefix}:turn:{turn_id}:events"
    emitter = TurnEmitter(session_id=session_id, turn_id=turn_id, buffer=buffer, coalesce_seconds=0)
    try:
        yield LiveTurn(emitter, buffer, layer, channel, redis, key)
    finally:
        await layer.group_discard(events.session_group(session_id), channel)
        await redis.delete(key)
        await redis.aclose()
        await close_clients(buffer)


@pytest.mark.distributed
@pytest.mark.usefixtures("require_distributed")
async def test_a_streamed_turn_is_in_the_buffer_in_order_and_published_in_order() -> None:
    async with live_turn() as turn:
        emitter = turn.emitter
        await emitter.emit("turn.status", status="running")
        for n in range(100):
            emitter.delta(text=f"{n} ")
        await emitter.emit("turn.status", status="completed")
        await emitter.close()

        live = [
            (await asyncio.wait_for(turn.layer.receive(turn.channel), 10))["event"]
            for _ in range(102)
        ]
        assert [e["seq"] for e in live] == list(range(1, 103))
        assert await turn.buffer.read_after(emitter.turn_id, 0) == live
        assert await turn.buffer.last_seq(emitter.turn_id) == 102
        ttl = await turn.redis.ttl(turn.key)
        assert 0 < ttl <= RUNNING_TTL_SECONDS


@pytest.mark.distributed
@pytest.mark.usefixtures("require_distributed")
async def test_last_seq_counts_the_appends_queued_before_it_and_finish_shortens_the_ttl() -> None:
    # last_seq and finish travel in the appends' batches (a burst of turn starts asks in
    # the streams' round trips): an append queued earlier on this loop is counted.
    from openworker.runtime.live.replay import FINISHED_TTL_SECONDS

    prefix = f"test-emitter-{uuid.uuid4().hex}"
    turn_id = uuid.uuid4().hex
    buffer = RedisReplayBuffer(settings.REDIS_URL, prefix=prefix)
    redis = aioredis.Redis.from_url(settings.REDIS_URL)
    key = f"{prefix}:turn:{turn_id}:events"
    try:
        assert await buffer.last_seq(turn_id) == 0  # no buffer yet
        for seq in range(1, 6):
            buffer.append_soon(turn_id, seq, {"type": "delta", "seq": seq, "text": "x"})
        assert await buffer.last_seq(turn_id) == 5
        assert 0 < await redis.ttl(key) <= RUNNING_TTL_SECONDS
        await buffer.finish(turn_id)
        assert 0 < await redis.ttl(key) <= FINISHED_TTL_SECONDS
    finally:
        await redis.delete(key)
        await redis.aclose()
        await close_clients(buffer)


class FailingAppends(RedisReplayBuffer):
    """The real buffer, whose appends of the `failing` seqs fail as on a lost connection
    (never sent; the error called back on the loop's next turn), and which counts its
    rewrites."""

    def __init__(self, url: str, *, prefix: str, failing: set[int]) -> None:
        super().__init__(url, prefix=prefix)
        self.failing = failing
        self.rewrites = 0

    def append_nowait(
        self, turn_id: str, seq: int, event: dict[str, Any], on_error: Callable[..., None]
    ) -> None:
        if seq in self.failing:
            error = RedisConnectionError("connection lost")
            asyncio.get_running_loop().call_soon(on_error, error)
            return
        super().append_nowait(turn_id, seq, event, on_error)

    async def rewrite(self, turn_id: str, events: list[dict[str, Any]], *, finished: bool) -> None:
        self.rewrites += 1
        await super().rewrite(turn_id, events, finished=finished)


@pytest.mark.distributed
@pytest.mark.usefixtures("require_distributed")
async def test_deltas_go_out_without_a_future_each_and_close_waits_until_redis_has_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    awaited: list[str] = []
    submit = redis_batch.CommandBatcher.submit

    def submit_watched(self: redis_batch.CommandBatcher, *args: Any) -> Any:
        awaited.append(args[0])
        return submit(self, *args)

    monkeypatch.setattr(redis_batch.CommandBatcher, "submit", submit_watched)
    async with live_turn() as turn:
        # Every batch of the buffer's batcher goes out a fifth of a second late.
        batcher = batcher_for(settings.REDIS_URL)
        write = batcher._write

        async def slow(batch: Any, **options: Any) -> Any:
            await asyncio.sleep(0.2)
            return await write(batch, **options)

        batcher._write = slow  # type: ignore[method-assign]
        for n in range(20):
            turn.emitter.delta(text=f"{n} ")
        await turn.emitter.close()
        assert await turn.redis.xlen(turn.key) == 20  # close returned once Redis had them
        assert "XADD" not in awaited and "PUBLISH" not in awaited
        live = await turn.received()
        assert [e["seq"] for e in live] == list(range(1, 21))
        assert await turn.buffer.read_after(turn.emitter.turn_id, 0) == live


@pytest.mark.distributed
@pytest.mark.usefixtures("require_distributed")
async def test_a_delta_append_that_fails_without_a_future_is_repaired(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from openworker.runtime.live import emitter as streaming

    monkeypatch.setattr(streaming, "REPAIR_BACKOFF_SECONDS", (0.01, 0.02))
    async with live_turn(functools.partial(FailingAppends, failing={3})) as turn:
        emitter, buffer = turn.emitter, turn.buffer
        assert isinstance(buffer, FailingAppends)
        await emitter.emit("turn.status", status="running")
        for n in range(5):
            emitter.delta(text=f"{n} ")
            await asyncio.sleep(0)
        status = await emitter.emit("turn.status", status="completed")
        await emitter.close()

        stored = await buffer.read_after(emitter.turn_id, 0)
        assert [e["seq"] for e in stored] == list(range(1, status["seq"] + 1))
        assert "".join(e.get("text", "") for e in stored) == "0 1 2 3 4 "
        assert buffer.rewrites == 1
        live = [e["seq"] for e in await turn.received()]
        assert live.count(3) == 2  # published again from the first append that failed
        shown = [seq for i, seq in enumerate(live) if seq > max(live[:i], default=0)]
        assert shown == list(range(1, status["seq"] + 1))
