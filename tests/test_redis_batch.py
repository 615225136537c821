"""`openworker.runtime.live.redis_batch`: Redis commands queued while a pipeline is in flight go out
together in the next one, in the order they were queued, and each caller learns its own
command's outcome (Redis's own reply values). Against the real Redis of the distributed
phase (keys under a prefix each test owns, deleted afterwards)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from django.conf import settings
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError

from openworker.runtime.live.redis_batch import CommandBatcher, batcher_for, pack

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("require_distributed")]


def recording(batcher: CommandBatcher) -> list[list[tuple[Any, ...]]]:
    """The commands each of `batcher`'s batches carried (one write; its replies are read
    as they come)."""
    round_trips: list[list[tuple[Any, ...]]] = []
    write = batcher._write

    async def recorded(batch: Any, **options: Any) -> Any:
        round_trips.append([tuple(args) for args, _, _ in batch])
        return await write(batch, **options)

    batcher._write = recorded  # type: ignore[method-assign]
    return round_trips


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
async def batcher() -> AsyncIterator[CommandBatcher]:
    made = CommandBatcher(settings.REDIS_URL)
    yield made
    await made.aclose()


async def test_concurrent_submits_share_round_trips_and_keep_their_order(
    batcher: CommandBatcher, prefix: str
) -> None:
    round_trips = recording(batcher)
    key = f"{prefix}:list"

    # 100 callers on their own tasks, all queueing before the first round trip starts.
    async def push(i: int) -> Any:
        return await batcher.call("RPUSH", key, i)

    replies = await asyncio.gather(*(push(i) for i in range(100)))
    assert replies == list(range(1, 101))  # each caller got its own reply
    assert len(round_trips) < 100
    assert [int(c[2]) for trip in round_trips for c in trip] == list(range(100))

    # Commands queued while a round trip is in flight ride together in the next one.
    before = len(round_trips)
    first = [batcher.submit("RPUSH", key, i) for i in range(100, 110)]
    await asyncio.sleep(0)  # the drain task takes those ten and starts their round trip
    second = [batcher.submit("RPUSH", key, i) for i in range(110, 130)]
    assert await asyncio.gather(*first, *second) == list(range(101, 131))
    assert [len(trip) for trip in round_trips[before:]] == [10, 20]

    stored = await batcher.call("LRANGE", key, 0, -1)
    assert [int(value) for value in stored] == list(range(130))


async def test_an_error_reply_fails_only_its_own_command(
    batcher: CommandBatcher, prefix: str
) -> None:
    round_trips = recording(batcher)
    word, counter = f"{prefix}:word", f"{prefix}:counter"
    futures = [
        batcher.submit("SET", word, "not a number"),
        batcher.submit("INCR", word),  # "value is not an integer"
        batcher.submit("INCR", counter),
        batcher.submit("NO-SUCH-COMMAND", counter),
        batcher.submit("INCR", counter),
    ]
    results = await asyncio.gather(*futures, return_exceptions=True)

    assert len(round_trips) == 1  # the errors were inside one pipeline
    assert results[0] == b"OK"
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
    # Nothing listens on the port: connecting is refused.
    batcher = CommandBatcher(f"redis://127.0.0.1:{closed_port()}/0")
    round_trips = recording(batcher)
    futures = [batcher.submit("SET", f"dead:{i}", i) for i in range(5)]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert len(round_trips) == 1
    assert all(isinstance(result, RedisConnectionError) for result in results), results

    # Not wedged: a later command gets its own (failed) round trip, not a hang.
    with pytest.raises(RedisConnectionError):
        await batcher.call("PING")
    assert len(round_trips) == 2


async def test_commands_without_a_future_keep_their_order_and_call_back_only_on_failure(
    batcher: CommandBatcher, prefix: str
) -> None:
    round_trips = recording(batcher)
    key = f"{prefix}:list"
    failures: list[BaseException] = []
    for i in range(3):
        batcher.submit_nowait(failures.append, "RPUSH", key, i)
    batcher.submit_nowait(failures.append, "INCR", key)  # WRONGTYPE: a list
    batcher.submit_nowait(failures.append, "RPUSH", key, 3)
    await batcher.settled()

    assert [type(failure) for failure in failures] == [ResponseError]
    # settled() was queued behind them: its PING rode in their round trip.
    assert [command[0] for command in round_trips[0]] == ["RPUSH"] * 3 + ["INCR", "RPUSH", "PING"]
    assert await batcher.call("LRANGE", key, 0, -1) == [b"0", b"1", b"2", b"3"]


async def test_a_dead_server_calls_back_every_command_without_a_future_and_settles() -> None:
    batcher = CommandBatcher(f"redis://127.0.0.1:{closed_port()}/0")
    failures: list[BaseException] = []
    for i in range(3):
        batcher.submit_nowait(failures.append, "SET", f"dead:{i}", i)
    await batcher.settled()  # its own PING failed too, and is not raised
    assert len(failures) == 3
    assert all(isinstance(failure, RedisConnectionError) for failure in failures), failures


async def test_an_error_callback_that_raises_is_logged_and_the_others_are_still_told(
    batcher: CommandBatcher, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    word = f"{prefix}:word"
    await batcher.call("SET", word, "not a number")
    told: list[BaseException] = []

    def broken(error: BaseException) -> None:
        raise RuntimeError("a caller's bug")

    batcher.submit_nowait(broken, "INCR", word)
    batcher.submit_nowait(told.append, "INCR", word)
    answered = batcher.submit("GET", word)
    await batcher.settled()
    assert [type(failure) for failure in told] == [ResponseError]
    assert await answered == b"not a number"
    assert "error callback failed" in caplog.text


async def test_a_connection_lost_between_batches_is_made_again(batcher: CommandBatcher) -> None:
    assert await batcher.call("PING") == b"PONG"
    assert batcher.pipe._writer is not None
    batcher.pipe._writer.transport.abort()  # as if Redis restarted
    with contextlib.suppress(RedisConnectionError):
        await batcher.call("PING")  # may fail: it was in flight on the dead connection
    assert await batcher.call("PING") == b"PONG"


async def test_the_url_selects_the_database(prefix: str) -> None:
    base = settings.REDIS_URL.rsplit("/", 1)[0]
    one, two = CommandBatcher(f"{base}/1"), CommandBatcher(f"{base}/2")
    key = f"{prefix}:db"
    try:
        await one.call("SET", key, "in one")
        assert await one.call("GET", key) == b"in one"
        assert await two.call("GET", key) is None
    finally:
        await one.call("DEL", key)
        await one.aclose()
        await two.aclose()


def test_a_tls_url_is_read_as_redis_py_reads_it() -> None:
    import ssl

    from openworker.runtime.live.redis_batch import RespPipe

    verified = RespPipe("rediss://:secret@cache.internal:6380/3")
    assert (verified.host, verified.port) == ("cache.internal", 6380)
    assert verified.tls is not None and verified.tls.verify_mode == ssl.CERT_REQUIRED
    assert verified.setup == [("AUTH", "secret"), ("SELECT", 3)]
    lenient = RespPipe("rediss://cache.internal/0?ssl_cert_reqs=none")
    assert lenient.tls is not None and lenient.tls.verify_mode == ssl.CERT_NONE
    assert lenient.setup == []
    assert RespPipe("redis://u:p@h:1/0").tls is None
    assert RespPipe("redis://u:p@h:1/0").setup == [("AUTH", "u", "p")]


def test_commands_are_packed_as_resp_bulk_strings() -> None:
    assert pack(("SET", b"k", 3, 1.5)) == b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n3\r\n$3\r\n1.5\r\n"
    with pytest.raises(DataError):
        pack(("SET", "k", None))
    with pytest.raises(DataError):
        pack(("SET", "k", True))


async def test_a_bad_argument_fails_its_batch_without_touching_the_connection(
    batcher: CommandBatcher,
) -> None:
    assert await batcher.call("PING") == b"PONG"
    with pytest.raises(DataError):
        await batcher.call("SET", "k", object())
    assert await batcher.call("PING") == b"PONG"


async def test_batcher_for_gives_one_batcher_per_event_loop_and_url() -> None:
    url = settings.REDIS_URL
    other_url = f"redis://127.0.0.1:{closed_port()}/0"
    here = batcher_for(url)
    assert batcher_for(url) is here
    assert batcher_for(other_url) is not here
    assert await here.call("PING") == b"PONG"

    elsewhere: list[tuple[CommandBatcher, Any]] = []

    async def on_another_loop() -> None:
        batcher = batcher_for(url)
        elsewhere.append((batcher, await batcher.call("PING")))
        await batcher.aclose()

    thread = threading.Thread(target=lambda: asyncio.run(on_another_loop()))
    thread.start()
    thread.join(timeout=30)
    [(there, pong)] = elsewhere
    assert there is not here
    assert pong == b"PONG"
    await here.aclose()
    await batcher_for(other_url).aclose()


def test_a_refused_argument_is_named_by_its_type_never_by_the_command() -> None:
    # The commands carry transcripts: an error message may reach a log.
    with pytest.raises(DataError) as refused:
        pack(("XADD", "turn:1:events", "e", "a private sentence", None))
    assert "NoneType" in str(refused.value)
    assert "private" not in str(refused.value)
    assert pack(["PING"]) == b"*1\r\n$4\r\nPING\r\n"  # any sequence, not only tuples
