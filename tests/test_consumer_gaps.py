"""A socket that sees a live event with a gap before it fills the gap from the replay
buffer, waiting for the buffer when the worker's append has not landed yet (appends and
publishes travel on separate connections, so a publish may overtake an append)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from openworker.asgi import application
from openworker.runtime.live import events
from openworker.runtime.live.replay import get_replay_buffer
from sessions import consumers
from sessions.models import Session, Turn
from tests.support.chat import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


async def open_socket(user, session) -> WebsocketCommunicator:
    cookie = await sync_to_async(session_cookie)(user)
    ws = WebsocketCommunicator(
        application,
        f"/ws/sessions/{session.pk}/",
        headers=[
            (b"origin", b"http://127.0.0.1:8000"),
            (b"host", b"127.0.0.1:8000"),
            (b"cookie", cookie.encode()),
        ],
    )
    connected, _ = await ws.connect()
    assert connected
    hello = await ws.receive_json_from(timeout=5)
    assert hello["type"] == "hello"
    return ws


def delta(turn: str, seq: int) -> dict:
    return {"type": "delta", "turn": turn, "seq": seq, "text": f"<{seq}>"}


async def received_seqs(ws: WebsocketCommunicator, count: int) -> list[int]:
    return [(await ws.receive_json_from(timeout=5))["seq"] for _ in range(count)]


async def test_a_publish_that_overtakes_an_earlier_append_waits_for_the_buffer(owner):
    session = await Session.objects.acreate(owner=owner, model="anthropic:claude-test-1")
    ws = await open_socket(owner, session)
    buffer = get_replay_buffer()
    turn = str(uuid.uuid4())
    await buffer.append(turn, 1, delta(turn, 1))
    await events.apublish(session.pk, delta(turn, 1))
    assert await received_seqs(ws, 1) == [1]

    # seq 2's publish was lost, and the appends of 2 and 3 (queued in that order on the
    # buffer's connection) land only after seq 3's publish is seen live.
    async def late_appends() -> None:
        await asyncio.sleep(0.2)
        await buffer.append(turn, 2, delta(turn, 2))
        await buffer.append(turn, 3, delta(turn, 3))

    appending = asyncio.ensure_future(late_appends())
    await events.apublish(session.pk, delta(turn, 3))
    assert await received_seqs(ws, 2) == [2, 3]
    await appending
    await ws.disconnect()


async def test_a_gap_the_buffer_never_fills_is_passed_only_after_the_give_up_wait(
    owner, monkeypatch
):
    monkeypatch.setattr(consumers, "GAP_WAIT_SECONDS", 0.1)
    monkeypatch.setattr(consumers, "GAP_GIVE_UP_SECONDS", 1.0)
    session = await Session.objects.acreate(owner=owner, model="anthropic:claude-test-1")
    ws = await open_socket(owner, session)
    turn = str(uuid.uuid4())
    await events.apublish(session.pk, delta(turn, 1))
    await events.apublish(session.pk, delta(turn, 3))  # seq 2 exists nowhere
    assert await received_seqs(ws, 1) == [1]
    started = asyncio.get_running_loop().time()
    # Held at the gap (not shown across it) until the give-up wait has passed.
    assert await received_seqs(ws, 1) == [3]
    assert asyncio.get_running_loop().time() - started >= 0.9
    await ws.disconnect()


async def test_a_gap_the_worker_repairs_seconds_later_is_filled_in_order(owner, monkeypatch):
    # Redis lost seq 2 and 3 (restarted empty) and the worker rewrites the turn's buffer
    # a few seconds later; live events 4 and 5 arrive before that.
    monkeypatch.setattr(consumers, "GAP_WAIT_SECONDS", 0.1)
    session = await Session.objects.acreate(owner=owner, model="anthropic:claude-test-1")
    ws = await open_socket(owner, session)
    buffer = get_replay_buffer()
    turn = str(uuid.uuid4())
    await buffer.append(turn, 1, delta(turn, 1))
    await events.apublish(session.pk, delta(turn, 1))
    assert await received_seqs(ws, 1) == [1]
    await events.apublish(session.pk, delta(turn, 4))
    await events.apublish(session.pk, delta(turn, 5))
    await asyncio.sleep(2.0)
    assert await ws.receive_nothing(timeout=0.1)  # nothing shown across the hole
    await buffer.rewrite(turn, [delta(turn, n) for n in range(1, 6)], finished=False)
    assert await received_seqs(ws, 4) == [2, 3, 4, 5]
    await ws.disconnect()


async def test_a_turn_waiting_for_a_worker_is_re_read_rarely_and_a_streaming_one_soon(
    owner, monkeypatch
):
    """A waiting turn is silent by design: its buffer is re-read every
    QUEUED_STALL_SECONDS, not every STALL_SECONDS (800 waiting turns' re-reads were a
    tenth of Daphne's CPU). An event dropped after it is still recovered."""
    monkeypatch.setattr(consumers, "STALL_SECONDS", 0.1)
    monkeypatch.setattr(consumers, "QUEUED_STALL_SECONDS", 0.5)
    reads: list[str] = []
    buffer = get_replay_buffer()
    real_read = buffer.read_after

    async def recording_read(turn_id, after):
        reads.append(turn_id)
        return await real_read(turn_id, after)

    monkeypatch.setattr(buffer, "read_after", recording_read)
    session = await Session.objects.acreate(owner=owner, model="anthropic:claude-test-1")
    ws = await open_socket(owner, session)
    waiting, streaming = str(uuid.uuid4()), str(uuid.uuid4())
    queued = {"type": "turn.queued", "turn": waiting, "seq": 1, "position": 3}
    await buffer.append(waiting, 1, queued)
    await events.apublish(session.pk, queued)
    await buffer.append(streaming, 1, delta(streaming, 1))
    await events.apublish(session.pk, delta(streaming, 1))
    assert await received_seqs(ws, 2) == [1, 1]
    # Silent for 2 s: the waiting turn re-read every 0.5 s, and not every 0.1 s after the
    # first re-read either; the streaming one every 0.1 s.
    reads.clear()
    await asyncio.sleep(2.0)
    assert 2 <= reads.count(waiting) <= 5, reads.count(waiting)
    assert reads.count(streaming) >= 6
    monkeypatch.setattr(consumers, "QUEUED_STALL_SECONDS", 2.0)
    queued = {**queued, "seq": 2, "position": 2}  # its place moves: re-announced
    await buffer.append(waiting, 2, queued)
    await events.apublish(session.pk, queued)
    assert await received_seqs(ws, 1) == [2]
    # Both turns' next events are dropped on the way (in their buffers only).
    running = {"type": "turn.status", "turn": waiting, "seq": 3, "status": "running"}
    await buffer.append(waiting, 3, running)
    await buffer.append(streaming, 2, delta(streaming, 2))
    reads.clear()

    streamed = await ws.receive_json_from(timeout=5)
    assert (streamed["turn"], streamed["seq"]) == (streaming, 2)  # within STALL_SECONDS
    await asyncio.sleep(0.5)
    assert waiting not in reads, "the waiting turn is not re-read at STALL_SECONDS"
    started = await ws.receive_json_from(timeout=5)  # after QUEUED_STALL_SECONDS
    assert (started["turn"], started["seq"], started["status"]) == (waiting, 3, "running")
    await ws.disconnect()


async def test_a_socket_whose_send_waits_for_the_database_does_not_poll_for_turns(
    owner, monkeypatch
):
    """Behind a burst of sends the database queue is the bottleneck: a waiting socket
    must not add a poll query to it every ACTIVE_POLL_SECONDS."""
    monkeypatch.setattr(consumers, "ACTIVE_POLL_SECONDS", 0.05)
    monkeypatch.setattr(consumers, "STALL_SECONDS", 0.1)
    polls: list[float] = []  # poll queries asked of the database thread
    real_wrap = consumers.socket_db

    def recording_wrap(fn):
        if fn is consumers._active_turn_ids_by_session:
            polls.append(1)
        return real_wrap(fn)

    asked_while_sending: list[int] = []

    def slow_sends(*, sends):
        before = len(polls)
        time.sleep(0.6)  # a database queue behind many other sends
        asked_while_sending.append(len(polls) - before)
        return [consumers.commands.TurnRefused("refused after the wait") for _ in sends]

    monkeypatch.setattr(consumers, "socket_db", recording_wrap)
    monkeypatch.setattr(consumers.commands, "turns_send", slow_sends)
    session = await Session.objects.acreate(owner=owner, model="anthropic:claude-test-1")
    ws = await open_socket(owner, session)
    await asyncio.sleep(0.2)
    assert polls, "an idle socket polls"
    await ws.send_json_to({"type": "send", "text": "hi"})
    answer = await ws.receive_json_from(timeout=5)
    assert answer == {"type": "error", "error": "refused after the wait"}
    assert asked_while_sending == [0], "no poll while the send waited"
    before = len(polls)
    await asyncio.sleep(0.3)
    assert len(polls) > before, "polling resumes once the send has returned"
    await ws.disconnect()


async def test_idle_sockets_of_a_process_are_polled_for_turns_in_one_query(owner, monkeypatch):
    """A thousand idle sockets polling on their own were a thousand queries per interval
    on Daphne's one sync thread; the process asks once for all of them, and each socket
    still learns of a turn it never heard of."""
    monkeypatch.setattr(consumers, "ACTIVE_POLL_SECONDS", 0.1)
    asked: list[set[str]] = []
    real = consumers._active_turn_ids_by_session

    def recording(session_ids):
        asked.append(set(session_ids))
        return real(session_ids)

    monkeypatch.setattr(consumers, "_active_turn_ids_by_session", recording)
    sessions = [
        await Session.objects.acreate(owner=owner, model="anthropic:claude-test-1")
        for _ in range(5)
    ]
    sockets = [await open_socket(owner, session) for session in sessions]
    asked.clear()  # from here on all five are open and idle
    while len(asked) < 3:
        await asyncio.sleep(0.05)
    assert asked == [{str(s.pk) for s in sessions}] * len(asked), "one query for all"

    # A turn started elsewhere, none of whose events reached the socket: found by the poll,
    # then recovered from its (here, just written) replay buffer.
    turn = await sync_to_async(_queued_turn)(sessions[2])
    await get_replay_buffer().append(turn, 1, delta(turn, 1))
    assert await received_seqs(sockets[2], 1) == [1]
    for ws in sockets:
        await ws.disconnect()


def _queued_turn(session) -> str:
    return str(Turn.objects.create(session=session, model=session.model).pk)
