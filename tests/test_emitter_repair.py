"""`TurnEmitter` after a failed replay-buffer append (Redis down, then back empty): it
holds new events, rewrites the turn's whole buffer from what it kept once Redis answers,
and publishes again from the first event the pages may have missed, so a page that
drops duplicates sees every event once, in order. In-process: a memory buffer that can
be "down" stands in for Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from openworker.runtime.live import emitter as streaming
from openworker.runtime.live import events
from openworker.runtime.live.emitter import TurnEmitter
from openworker.runtime.live.replay import MemoryReplayBuffer

SESSION, TURN = "session-1", "turn-1"


class FlakyBuffer(MemoryReplayBuffer):
    """A memory buffer that fails every write while `down`; going down empties it (a
    Redis restarted without its data)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.rewrites = 0

    def go_down(self) -> None:
        self.down = True
        self._events.clear()

    def append_soon(self, turn_id: str, seq: int, event: dict[str, Any]) -> Any:
        if self.down:
            failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            failed.set_exception(ConnectionError("Redis is down"))
            return failed
        return super().append_soon(turn_id, seq, event)

    async def rewrite(self, turn_id: str, events: list[dict[str, Any]], *, finished: bool) -> None:
        if self.down:
            raise ConnectionError("Redis is down")
        self.rewrites += 1
        await super().rewrite(turn_id, events, finished=finished)


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    def publish_soon(session_id: object, event: dict[str, Any]) -> Any:
        seen.append(event)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    monkeypatch.setattr(events, "publish_soon", publish_soon)
    monkeypatch.setattr(streaming, "REPAIR_BACKOFF_SECONDS", (0.01, 0.02))
    return seen


def as_a_page_sees_it(published: list[dict[str, Any]]) -> list[int]:
    """Each seq once, in the order first published (a socket drops what it has)."""
    shown: list[int] = []
    for event in published:
        if event["seq"] > (shown[-1] if shown else 0):
            shown.append(event["seq"])
    return shown


async def test_events_lost_while_redis_was_down_are_rewritten_and_published_again_in_order(
    published: list[dict[str, Any]],
) -> None:
    buffer = FlakyBuffer()
    emitter = TurnEmitter(session_id=SESSION, turn_id=TURN, buffer=buffer, coalesce_seconds=0)
    for word in ("a", "b", "c"):
        emitter.delta(text=word)
        await asyncio.sleep(0)
    buffer.go_down()
    for word in ("d", "e"):
        emitter.delta(text=word)
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.05)  # the repair retries meanwhile; new events are held
    emitter.delta(text="f")
    assert [e["seq"] for e in published] == [1, 2, 3, 4]  # 5 and 6 held back
    buffer.down = False
    emitter.delta(text="g")
    status = await emitter.emit("turn.status", status="completed")
    await emitter.close()

    stored = await buffer.read_after(TURN, 0)
    assert [e["seq"] for e in stored] == list(range(1, status["seq"] + 1))
    assert "".join(e.get("text", "") for e in stored) == "abcdefg"
    assert buffer.rewrites >= 1
    assert as_a_page_sees_it(published) == list(range(1, status["seq"] + 1))
    # What the pages may have missed went out again, after the events before it.
    assert [e["seq"] for e in published].count(4) == 2


async def test_a_healthy_buffer_is_never_rewritten(published: list[dict[str, Any]]) -> None:
    buffer = FlakyBuffer()
    emitter = TurnEmitter(session_id=SESSION, turn_id=TURN, buffer=buffer, coalesce_seconds=0)
    emitter.delta(text="x")
    await emitter.emit("turn.status", status="completed")
    await emitter.close()
    assert buffer.rewrites == 0
    assert [e["seq"] for e in published] == [1, 2]
