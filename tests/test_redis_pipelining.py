"""`CommandBatcher` pipelines: a batch queued while another is in flight waits for its
replies at most `OVERLAP_SECONDS`, then is written behind it; replies are matched to
their batches in order, and batches in flight on a connection that dies go once more on
a new one. Against a RESP server in this test that answers only when told to (real
Redis answers too fast to hold a batch in flight on purpose)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import hiredis
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from openworker.runtime.live import redis_batch
from openworker.runtime.live.redis_batch import CommandBatcher


class HeldRedis:
    """Reads commands, records them per connection, and answers each with its own
    arguments joined (`+a:b`), at once, or after `hold()` only once `release()` is
    called: what is in flight stays in flight until the test says so. `hang_up()`
    closes every connection, whatever is unanswered."""

    def __init__(self) -> None:
        self.connections: list[list[list[bytes]]] = []
        self.writers: list[asyncio.StreamWriter] = []
        self._release = asyncio.Event()
        self._release.set()
        self._received = asyncio.Condition()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}/0"

    def release(self) -> None:
        self._release.set()

    def hold(self) -> None:
        self._release.clear()

    def hang_up(self) -> None:
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()

    async def received(self, count: int) -> None:
        """Wait until `count` commands arrived, over all connections."""
        async with self._received:
            await self._received.wait_for(
                lambda: sum(len(commands) for commands in self.connections) >= count
            )

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        commands: list[list[bytes]] = []
        self.connections.append(commands)
        self.writers.append(writer)
        arrived = asyncio.Event()
        answering = asyncio.create_task(self._answer(commands, writer, arrived))
        parser = hiredis.Reader()
        try:
            with contextlib.suppress(ConnectionError):
                while data := await reader.read(65536):
                    parser.feed(data)
                    while (command := parser.gets()) is not False:
                        commands.append(command)
                        arrived.set()
                        async with self._received:
                            self._received.notify_all()
        finally:
            answering.cancel()

    async def _answer(
        self, commands: list[list[bytes]], writer: asyncio.StreamWriter, arrived: asyncio.Event
    ) -> None:
        """Answer, in order, what has arrived, whenever released."""
        answered = 0
        while True:
            await arrived.wait()
            await self._release.wait()
            arrived.clear()
            for command in commands[answered:]:
                writer.write(b"+" + b":".join(command[1:]) + b"\r\n")
            answered = len(commands)

    async def close(self) -> None:
        self.hang_up()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def held() -> AsyncIterator[HeldRedis]:
    server = HeldRedis()
    yield server
    await server.close()


async def test_a_batch_queued_behind_a_slow_one_is_written_before_its_replies_come(
    held: HeldRedis,
) -> None:
    batcher = CommandBatcher(await held.start())
    held.hold()
    first = batcher.submit("ECHO", "first")
    await held.received(1)
    # The first batch is in flight, unanswered; what is queued now goes out behind it
    # once OVERLAP_SECONDS have passed, not once the first batch is answered.
    second = [batcher.submit("ECHO", f"second-{i}") for i in range(3)]
    await asyncio.wait_for(held.received(4), timeout=5)
    assert not first.done()
    assert batcher.backlog == 3  # in flight behind the oldest batch

    held.release()
    assert await first == b"first"
    assert await asyncio.gather(*second) == [b"second-0", b"second-1", b"second-2"]
    assert len(held.connections) == 1  # one connection, answered in order
    assert batcher.backlog == 0
    await batcher.aclose()


async def test_a_fast_round_trip_carries_what_was_queued_meanwhile_in_one_batch(
    held: HeldRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An overlap longer than the test: nothing is written while the first batch waits.
    monkeypatch.setattr(redis_batch, "OVERLAP_SECONDS", 60.0)
    batcher = CommandBatcher(await held.start())
    held.hold()
    first = batcher.submit("ECHO", "first")
    await held.received(1)
    later = [batcher.submit("ECHO", f"later-{i}") for i in range(5)]
    await asyncio.sleep(0.05)
    assert sum(len(commands) for commands in held.connections) == 1  # still held back
    held.release()
    assert await first == b"first"
    assert await asyncio.gather(*later) == [f"later-{i}".encode() for i in range(5)]
    await batcher.aclose()


async def test_batches_in_flight_on_a_connection_that_dies_go_once_more_in_order(
    held: HeldRedis,
) -> None:
    batcher = CommandBatcher(await held.start())
    assert await batcher.call("ECHO", "warm") == b"warm"  # the connection exists
    held.hold()
    first = batcher.submit("ECHO", "a")
    await held.received(2)
    second = batcher.submit("ECHO", "b")
    await asyncio.wait_for(held.received(3), timeout=5)

    held.hang_up()  # as if Redis restarted with both batches unanswered
    await asyncio.sleep(0.05)
    held.release()
    assert await asyncio.wait_for(asyncio.gather(first, second), timeout=5) == [b"a", b"b"]
    assert len(held.connections) == 2
    assert held.connections[1] == [[b"ECHO", b"a"], [b"ECHO", b"b"]]  # resent in order
    await batcher.aclose()


async def test_a_batch_that_fails_on_a_new_connection_is_not_sent_again(
    held: HeldRedis,
) -> None:
    batcher = CommandBatcher(await held.start())
    held.hold()
    failures: list[BaseException] = []
    batcher.submit_nowait(failures.append, "ECHO", "lost")
    await held.received(1)
    held.hang_up()  # the batch's own connection, made for it: no second try
    for _ in range(100):
        if failures:
            break
        await asyncio.sleep(0.01)
    assert [type(failure) for failure in failures] == [RedisConnectionError]
    assert len(held.connections) == 1

    held.release()
    assert await batcher.call("ECHO", "after") == b"after"  # not wedged
    await batcher.aclose()


async def test_closing_the_batcher_fails_what_is_in_flight(held: HeldRedis) -> None:
    batcher = CommandBatcher(await held.start())
    held.hold()
    pending: Any = batcher.submit("ECHO", "never")
    await held.received(1)
    await batcher.aclose()
    with pytest.raises(RedisConnectionError):
        await pending
