"""`openworker.redis_batch`: Redis commands queued while a pipeline is in flight go out
together in the next one, in the order they were queued, and each caller learns its own
command's outcome. Against the real Redis of the distributed phase (keys under a prefix
each test owns, deleted afterwards)."""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from openworker.redis_batch import CommandBatcher, batcher_for

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("require_distributed")]


class RecordingClient:
    """A real asyncio Redis client whose pipelines note the commands each round trip
    carried (one `execute` of a non-transactional pipeline is one round trip)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.round_trips: list[list[tuple[Any, ...]]] = []

    def pipeline(self, transaction: bool = True) -> Any:
        pipe = self.client.pipeline(transaction=transaction)
        execute = pipe.execute

        async def recorded(*args: Any, **kwargs: Any) -> Any:
            self.round_trips.append([command for command, _ in pipe.command_stack])
            return await execute(*args, **kwargs)

        pipe.execute = recorded
        return pipe


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    name = f"test:redis-batch:{uuid.uuid4().hex}"
    yield name
    cleaner = aioredis.Redis.from_url(settings.REDIS_URL)
    keys = [key async for key in cleaner.scan_iter(match=f"{name}:*")]
    if keys:
        await cleaner.delete(*keys)
    await cleaner.aclose()


@pytest.fixture
async def recording() -> AsyncIterator[RecordingClient]:
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    yield RecordingClient(client)
    await client.aclose()


async def test_concurrent_submits_share_round_trips_and_keep_their_order(
    recording: RecordingClient, prefix: str
) -> None:
    batcher = CommandBatcher(recording)
    key = f"{prefix}:list"

    # 100 callers on their own tasks, all queueing before the first round trip starts.
    async def push(i: int) -> Any:
        return await batcher.call("RPUSH", key, i)

    replies = await asyncio.gather(*(push(i) for i in range(100)))
    assert replies == list(range(1, 101))  # each caller got its own reply
    assert len(recording.round_trips) < 100
    assert [int(c[2]) for trip in recording.round_trips for c in trip] == list(range(100))

    # Commands queued while a round trip is in flight ride together in the next one.
    before = len(recording.round_trips)
    first = [batcher.submit("RPUSH", key, i) for i in range(100, 110)]
    await asyncio.sleep(0)  # the drain task takes those ten and starts their round trip
    second = [batcher.submit("RPUSH", key, i) for i in range(110, 130)]
    assert await asyncio.gather(*first, *second) == list(range(101, 131))
    assert [len(trip) for trip in recording.round_trips[before:]] == [10, 20]

    stored = await recording.client.lrange(key, 0, -1)
    assert [int(value) for value in stored] == list(range(130))


async def test_an_error_reply_fails_only_its_own_command(
    recording: RecordingClient, prefix: str
) -> None:
    batcher = CommandBatcher(recording)
    word, counter = f"{prefix}:word", f"{prefix}:counter"
    futures = [
        batcher.submit("SET", word, "not a number"),
        batcher.submit("INCR", word),  # "value is not an integer"
        batcher.submit("INCR", counter),
        batcher.submit("NO-SUCH-COMMAND", counter),
        batcher.submit("INCR", counter),
    ]
    results = await asyncio.gather(*futures, return_exceptions=True)

    assert len(recording.round_trips) == 1  # the errors were inside one pipeline
    assert results[0] is True
    assert isinstance(results[1], ResponseError)
    assert results[2] == 1
    assert isinstance(results[3], ResponseError)
    assert results[4] == 2
    # The batcher goes on working after errors.
    assert await batcher.call("GET", word) == b"not a number"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_a_dead_server_fails_every_command_of_the_batch_with_a_connection_error() -> None:
    # Nothing listens on the port: connecting is refused (one retry, no backoff wait).
    client = aioredis.Redis.from_url(
        f"redis://127.0.0.1:{closed_port()}/0", retry=Retry(NoBackoff(), 1)
    )
    recording = RecordingClient(client)
    batcher = CommandBatcher(recording)
    try:
        futures = [batcher.submit("SET", f"dead:{i}", i) for i in range(5)]
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert len(recording.round_trips) == 1
        assert all(isinstance(result, RedisConnectionError) for result in results), results

        # Not wedged: a later command gets its own (failed) round trip, not a hang.
        with pytest.raises(RedisConnectionError):
            await batcher.call("PING")
        assert len(recording.round_trips) == 2
    finally:
        await client.aclose()


async def test_batcher_for_gives_one_batcher_per_event_loop_and_url() -> None:
    url = settings.REDIS_URL
    other_url = f"redis://127.0.0.1:{closed_port()}/0"
    here = batcher_for(url)
    assert batcher_for(url) is here
    assert batcher_for(other_url) is not here
    assert await here.call("PING") is True

    elsewhere: list[tuple[CommandBatcher, Any]] = []

    async def on_another_loop() -> None:
        batcher = batcher_for(url)
        elsewhere.append((batcher, await batcher.call("PING")))
        await batcher.client.aclose()

    thread = threading.Thread(target=lambda: asyncio.run(on_another_loop()))
    thread.start()
    thread.join(timeout=30)
    [(there, pong)] = elsewhere
    assert there is not here
    assert pong is True
    await here.client.aclose()
    await batcher_for(other_url).client.aclose()
