"""`runtime.live.channel_layer.RedisPubSubLayer`, the distributed channel layer, against
the real Redis of the distributed phase. Every test names its own prefix, so its pub/sub
channels (which Redis shares across databases) are its own; two "processes" are two
layer instances on two event loops in two threads."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from channels.layers import get_channel_layer
from django.conf import settings
from redis.exceptions import ConnectionError as RedisConnectionError

from openworker.health import check_channel_layer
from openworker.runtime.live import channel_layer, subscription
from openworker.runtime.live.channel_layer import RedisPubSubLayer

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("require_distributed")]

# Generous bounds that only stop a broken test from hanging; nothing asserts on time.
WAIT_SECONDS = 10.0


@pytest.fixture
def prefix() -> str:
    return f"test-layer-{uuid.uuid4().hex}"


@pytest.fixture
async def layers(prefix: str) -> AsyncIterator[Callable[..., RedisPubSubLayer]]:
    """Layer instances on the test's event loop (flushed, i.e. closed, afterwards)."""
    made: list[RedisPubSubLayer] = []

    def make(**config: Any) -> RedisPubSubLayer:
        layer = RedisPubSubLayer(hosts=[settings.REDIS_URL], prefix=prefix, **config)
        made.append(layer)
        return layer

    yield make
    for layer in made:
        await layer.flush()


async def receive(layer: RedisPubSubLayer, channel: str) -> dict[str, Any]:
    return await asyncio.wait_for(layer.receive(channel), WAIT_SECONDS)


async def subscribers(*redis_channels: str) -> list[int]:
    """How many connections Redis has subscribed to each pub/sub channel."""
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    try:
        return [count for _, count in await client.pubsub_numsub(*redis_channels)]
    finally:
        await client.aclose()


async def until_subscribers(expected: list[int], *redis_channels: str) -> None:
    """Wait until Redis reports these subscriber counts (an unsubscribe is sent without
    waiting for Redis to confirm it, and a closed connection is dropped asynchronously)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while (counts := await subscribers(*redis_channels)) != expected:
        if time.monotonic() > deadline:
            raise AssertionError(f"subscribers of {redis_channels}: {counts} != {expected}")
        await asyncio.sleep(0.01)


class LoopThread:
    """One "process": an event loop of its own, running on a thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT_SECONDS)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT_SECONDS)
        self.loop.close()


@contextlib.contextmanager
def processes(count: int) -> Iterator[list[LoopThread]]:
    threads = [LoopThread() for _ in range(count)]
    try:
        yield threads
    finally:
        for thread in threads:
            thread.close()


async def joined(layer: RedisPubSubLayer, group: str) -> str:
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    return channel


class SlowToRedis:
    """A TCP proxy in front of the real Redis that holds every byte a client writes for
    `delay` seconds before passing it on (replies come back at once): a SUBSCRIBE sent
    through it reaches Redis late, as it can on a busy box, while a PUBLISH from a
    connection of its own goes straight in."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> str:
        options = aioredis.Redis.from_url(settings.REDIS_URL).connection_pool.connection_kwargs
        self.target = (options.get("host", "localhost"), int(options.get("port", 6379)))
        self.db = int(options.get("db", 0))
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}/{self.db}"

    async def __aexit__(self, *exc: Any) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        redis_r, redis_w = await asyncio.open_connection(*self.target)
        loop = asyncio.get_running_loop()

        async def upstream() -> None:
            while data := await client_r.read(65536):
                release = loop.time() + self.delay
                await asyncio.sleep(max(0.0, release - loop.time()))
                redis_w.write(data)

        async def downstream() -> None:
            while data := await redis_r.read(65536):
                client_w.write(data)

        pumps = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        self.tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            client_w.close()
            redis_w.close()


@contextlib.asynccontextmanager
async def slow_listener(
    prefix: str,
) -> AsyncIterator[tuple[RedisPubSubLayer, RedisPubSubLayer]]:
    """A layer whose writes reach Redis 0.3 s late (`SlowToRedis`), and one whose writes
    go straight in, as two processes; both flushed afterwards."""
    async with SlowToRedis(delay=0.3) as slow_url:
        listener = RedisPubSubLayer(hosts=[slow_url], prefix=prefix)
        sender = RedisPubSubLayer(hosts=[settings.REDIS_URL], prefix=prefix)
        try:
            yield listener, sender
        finally:
            await listener.flush()
            await sender.flush()


# --- channels and groups ----------------------------------------------------------------


async def test_a_message_sent_to_a_new_channel_is_received(layers) -> None:
    layer = layers()
    channel = await layer.new_channel()
    assert channel.startswith("specific.")
    await layer.send(channel, {"type": "hello", "text": "héllo", "data": b"\x00\x01", "n": 3})
    assert await receive(layer, channel) == {
        "type": "hello",
        "text": "héllo",
        "data": b"\x00\x01",
        "n": 3,
    }


async def test_a_message_sent_once_new_channel_returns_is_received_when_subscribing_is_slow(
    prefix: str,
) -> None:
    # Written and not waited for, the SUBSCRIBE was still on its way when the send from
    # another connection reached Redis: the message went to nobody (/healthz failed so,
    # about once in a thousand round trips with Redis busy).
    async with slow_listener(prefix) as (listener, sender):
        channel = await listener.new_channel()
        await sender.send(channel, {"type": "ping"})
        assert await receive(listener, channel) == {"type": "ping"}


async def test_a_group_rejoined_at_once_receives_what_is_sent_after_the_second_join(
    prefix: str,
) -> None:
    # Join, then leave and join again while the first SUBSCRIBE is on its way: the second
    # join returns only once Redis has applied its own SUBSCRIBE, behind the UNSUBSCRIBE.
    async with slow_listener(prefix) as (listener, sender):
        channel = await listener.new_channel()
        first_join = asyncio.ensure_future(listener.group_add("room", channel))
        await asyncio.sleep(0.1)
        await listener.group_discard("room", channel)
        await listener.group_add("room", channel)
        await first_join
        await sender.group_send("room", {"type": "chat", "text": "after the rejoin"})
        assert (await receive(listener, channel))["text"] == "after the rejoin"


def test_group_send_reaches_members_in_two_processes(prefix: str) -> None:
    with processes(2) as (one, two):
        layer_one = RedisPubSubLayer(hosts=[settings.REDIS_URL], prefix=prefix)
        layer_two = RedisPubSubLayer(hosts=[settings.REDIS_URL], prefix=prefix)
        channel_one = one.run(joined(layer_one, "room"))
        channel_two = two.run(joined(layer_two, "room"))

        one.run(layer_one.group_send("room", {"type": "chat", "text": "from one"}))
        assert one.run(receive(layer_one, channel_one))["text"] == "from one"
        assert two.run(receive(layer_two, channel_two))["text"] == "from one"

        two.run(layer_two.group_send("room", {"type": "chat", "text": "from two"}))
        assert one.run(receive(layer_one, channel_one))["text"] == "from two"
        assert two.run(receive(layer_two, channel_two))["text"] == "from two"


async def test_group_discard_stops_delivery_to_that_channel_only(layers, prefix: str) -> None:
    layer = layers()
    sender = layers()
    first, second = await joined(layer, "room"), await joined(layer, "room")
    group_key = f"{prefix}:group:room"
    assert await subscribers(group_key) == [1]  # two members, one Redis subscription

    await layer.group_discard("room", first)
    await sender.group_send("room", {"type": "chat", "n": 1})
    # Published after the group message on the same connection, read from the same
    # subscription: had `first` still been a member, the group message would come first.
    await sender.send(first, {"type": "direct"})
    assert await receive(layer, second) == {"type": "chat", "n": 1}
    assert await receive(layer, first) == {"type": "direct"}

    await layer.group_discard("room", second)
    await until_subscribers([0], group_key)  # the last member left: unsubscribed


async def test_a_full_channel_drops_its_oldest_messages(layers) -> None:
    layer = layers(capacity=3)
    sender = layers()
    full, probe = await layer.new_channel(), await layer.new_channel()
    for n in range(1, 6):
        await sender.send(full, {"type": "n", "n": n})
    # One subscription connection reads in publish order: once the probe is here, all
    # five went into `full`'s queue.
    await sender.send(probe, {"type": "probe"})
    assert await receive(layer, probe) == {"type": "probe"}

    assert [(await receive(layer, full))["n"] for _ in range(3)] == [3, 4, 5]
    await sender.send(full, {"type": "n", "n": 6})
    assert (await receive(layer, full))["n"] == 6  # 1 and 2 are gone, not late


async def test_channel_capacity_bounds_the_matching_channels(layers) -> None:
    layer = layers(capacity=100, channel_capacity={"small.*": 2})
    sender = layers()
    small, probe = await layer.new_channel("small."), await layer.new_channel()
    for n in range(1, 5):
        await sender.send(small, {"type": "n", "n": n})
    await sender.send(probe, {"type": "probe"})
    await receive(layer, probe)
    assert [(await receive(layer, small))["n"] for _ in range(2)] == [3, 4]


async def test_a_thousand_group_sends_from_one_loop_arrive_in_order(layers) -> None:
    receiver = layers(capacity=2_000)
    sender = layers()
    channel = await joined(receiver, "burst")

    await asyncio.gather(*(sender.group_send("burst", {"type": "n", "n": n}) for n in range(1000)))
    got = [(await receive(receiver, channel))["n"] for _ in range(1000)]
    assert got == list(range(1000))


async def test_group_send_nowait_is_queued_in_call_order(layers) -> None:
    receiver = layers()
    sender = layers()
    channel = await joined(receiver, "room")
    futures = [sender.group_send_nowait("room", {"type": "n", "n": n}) for n in range(20)]
    # One subscriber each: PUBLISH replies with the number of receiving connections.
    assert await asyncio.gather(*futures) == [1] * 20
    assert [(await receive(receiver, channel))["n"] for _ in range(20)] == list(range(20))


# --- receive under a timeout, and channels nobody reads any more --------------------------


async def test_receive_under_wait_for_keeps_group_membership_and_loses_nothing(
    layers, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Forgetting is checked well within each quiet gap of the publisher below.
    monkeypatch.setattr(channel_layer, "FORGET_AFTER_SECONDS", 0.02)
    layer = layers()
    sender = layers()
    channel = await joined(layer, "room")

    async def publish() -> None:
        for n in range(15):
            await sender.group_send("room", {"type": "n", "n": n})
            await asyncio.sleep(0.05)

    publisher = asyncio.create_task(publish())
    got: list[int] = []
    timeouts = 0
    deadline = time.monotonic() + WAIT_SECONDS
    while len(got) < 15 and time.monotonic() < deadline:
        # The pattern of tests/security/test_secrets_canary.py's LayerTap.
        try:
            got.append((await asyncio.wait_for(layer.receive(channel), timeout=0.01))["n"])
        except TimeoutError:
            timeouts += 1
            await asyncio.sleep(0.005)  # a short gap with no receive waiting
    await publisher
    assert got == list(range(15))
    assert timeouts > 0  # the receives really were cancelled in between


async def test_an_abandoned_channel_is_forgotten_after_the_forget_delay(
    layers, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(channel_layer, "FORGET_AFTER_SECONDS", 0.05)
    layer = layers()
    channel = await joined(layer, "room")
    keys = (f"{prefix}:group:room", f"{prefix}:channel:{channel}")
    assert await subscribers(*keys) == [1, 1]

    # The consumer ended: Channels cancelled its receive, and nobody receives again.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(layer.receive(channel), timeout=0.01)
    await until_subscribers([0, 0], *keys)

    # Receiving again listens to the channel, but the group membership stays forgotten.
    waiting = asyncio.create_task(receive(layer, channel))
    await until_subscribers([1], keys[1])
    await layer.group_send("room", {"type": "group"})
    await layer.send(channel, {"type": "direct"})
    assert await waiting == {"type": "direct"}


async def test_an_invalid_group_or_channel_name_is_refused_every_time(layers) -> None:
    # Checked names are remembered for the streaming path's publishes; a bad one never is.
    layer = layers()
    for _ in range(2):
        with pytest.raises(TypeError):
            layer.group_send_nowait("not a group!", {"type": "x"})
        with pytest.raises(TypeError):
            await layer.receive("not a channel!")
    channel = await joined(layer, "room")
    for n in range(3):
        await layer.group_send("room", {"type": "ok", "n": n})
    assert [await receive(layer, channel) for _ in range(3)] == [
        {"type": "ok", "n": n} for n in range(3)
    ]


async def test_flush_drops_every_subscription(layers, prefix: str) -> None:
    layer = layers()
    channel = await joined(layer, "room")
    keys = (f"{prefix}:group:room", f"{prefix}:channel:{channel}")
    assert await subscribers(*keys) == [1, 1]

    await layer.flush()
    await until_subscribers([0, 0], *keys)
    # The layer works again on the same loop, from scratch.
    fresh = await layer.new_channel()
    await layer.send(fresh, {"type": "after.flush"})
    assert await receive(layer, fresh) == {"type": "after.flush"}


async def test_a_lost_pubsub_connection_is_made_again_with_every_channel_subscribed(
    layers, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subscription, "RECONNECT_SECONDS", 0.05)
    monkeypatch.setattr(subscription, "SUBSCRIBE_CHUNK", 2)  # five channels: three writes
    layer = layers()
    channels = [await joined(layer, f"room{n}") for n in range(5)]
    keys = [f"{prefix}:group:room{n}" for n in range(5)]
    await until_subscribers([1] * 5, *keys)

    pubsub = layer._loop_layer().subscription
    assert pubsub._writer is not None
    pubsub._writer.transport.abort()  # as if Redis restarted
    await until_subscribers([0] * 5, *keys)
    await until_subscribers([1] * 5, *keys)  # subscribed again, every one
    for n in range(5):
        await layer.group_send(f"room{n}", {"type": "after", "n": n})
    assert [await receive(layer, channel) for channel in channels] == [
        {"type": "after", "n": n} for n in range(5)
    ]


async def test_listening_while_redis_is_unreachable_fails_and_leaves_nothing_behind() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here once the probe closes
    layer = RedisPubSubLayer(hosts=[f"redis://127.0.0.1:{port}/0"], prefix="unreachable")
    try:
        with pytest.raises(RedisConnectionError):
            await layer.new_channel()
        loop_layer = layer._loop_layer()
        assert loop_layer.listeners == {} and loop_layer.joined == {}
        assert loop_layer.subscription.channels == set()
    finally:
        await layer.flush()


def test_closing_the_event_loop_closes_its_connections(prefix: str) -> None:
    layer = RedisPubSubLayer(hosts=[settings.REDIS_URL], prefix=prefix)
    with processes(1) as (process,):
        channel = process.run(joined(layer, "room"))
    # `processes` closed the loop without anyone calling flush.
    keys = (f"{prefix}:group:room", f"{prefix}:channel:{channel}")
    asyncio.run(until_subscribers([0, 0], *keys))


def test_healthz_channel_layer_roundtrip_passes_with_this_layer() -> None:
    assert isinstance(get_channel_layer(), RedisPubSubLayer)
    # Each check runs on a fresh event loop (async_to_sync), as /healthz does.
    assert check_channel_layer() == (True, "RedisPubSubLayer")
    assert check_channel_layer() == (True, "RedisPubSubLayer")
