"""The distributed channel layer: Redis pub/sub, with publishes batched per round trip.

Why not `channels_redis.core.RedisChannelLayer`: its `group_send` costs four sequential
round trips (expire members, read members, expire messages, a Lua script per shard) and
the receiving process polls a sorted set per channel. With a worker streaming 200 turns
at 20 tokens/s each, that was seconds of added latency on a 2-core machine
(docs/PERFORMANCE.md). `channels_redis.pubsub` is closer, but serialises every publish of
a process behind one lock, i.e. one round trip per message.

This layer:
- `group_send` / `send` are one PUBLISH each, queued on the loop's `CommandBatcher`, so
  every publish made while a round trip is in flight goes out in the next pipeline;
- a receiving process keeps one pub/sub connection per event loop, subscribed to the
  groups and channels its consumers use (reference-counted) and read with hiredis
  (`subscription.Subscription`), fanning messages out to per-channel bounded queues
  (oldest dropped past `capacity`);
- `new_channel`, `group_add` and a channel's first `receive` return once Redis has
  applied the SUBSCRIBE: what is published after they return, from any process, arrives.

Delivery is at most once, as with every channel layer: a message published while no
process listens, or while a connection is being re-established, is gone. The streaming
path does not rely on it (replay buffer, `sessions/consumers.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import msgpack
from channels.layers import BaseChannelLayer

from openworker.runtime.live.loop_local import LoopLocal
from openworker.runtime.live.redis_batch import CommandBatcher, OnError, on_loop_close
from openworker.runtime.live.subscription import Subscription

# A channel nobody has received from for this long after a cancelled `receive` is
# forgotten (Channels has no "delete channel": a consumer that ended just stops
# receiving). Short gaps, like `wait_for(receive(), timeout)` in a loop, keep everything.
FORGET_AFTER_SECONDS = 5.0
# Group names checked and turned into Redis channels, kept for the next publish (a
# streaming worker publishes to the same few hundred groups many times a second).
CHECKED_GROUPS = 10_000


class _BoundedQueue(asyncio.Queue):  # type: ignore[type-arg]
    """A consumer that stopped reading loses its oldest messages, not the process's
    memory."""

    def put_nowait(self, item: Any) -> None:
        if self.full():
            self.get_nowait()
        super().put_nowait(item)


class _LoopLayer:
    """The layer's state on one event loop (asyncio connections must not cross loops)."""

    def __init__(self, layer: RedisPubSubLayer) -> None:
        self.layer = layer
        # Its own connection and batcher: sharing the replay buffer's kept appends and
        # publishes in one order but tripled the streaming path's latency at 200 turns (one
        # pipeline in flight for both). A socket that sees a publish overtake an earlier
        # append waits for the buffer instead (`SessionConsumer._fill_gap`).
        self.batcher = CommandBatcher(layer.url)
        # `layer.serialize`, with one packer per loop (so per thread) instead of one
        # built per message: half the CPU of packing a delta's publish.
        self.pack = msgpack.Packer(use_bin_type=True).pack
        # The pub/sub connection, read with hiredis (`subscription.Subscription`).
        self.subscription = Subscription(layer.url, self._deliver)
        # Local channel name → its queue; Redis channel → local channels listening to it.
        self.queues: dict[str, _BoundedQueue] = {}
        # Channels checked, with their queue and subscription in place: `receive` on
        # one of them goes straight to its queue.
        self.receivable: set[str] = set()
        self.listeners: dict[str, set[str]] = {}
        # Local channel → the Redis channels it listens to: forgetting a channel looked
        # through every Redis channel of the process (3 % of Daphne's CPU at K = 1000,
        # a thousand sockets closing).
        self.joined: dict[str, set[str]] = {}
        # Channel → receive() calls waiting now, and the loop time the latest one began.
        self.receiving: dict[str, int] = {}
        self.last_receive: dict[str, float] = {}
        self.subscribe_lock = asyncio.Lock()
        self.cleanups: set[asyncio.Task[None]] = set()

    def publish(self, redis_channel: str, message: dict[str, Any]) -> asyncio.Future[Any]:
        return self.batcher.submit("PUBLISH", redis_channel, self.pack(message))

    def publish_nowait(
        self, redis_channel: str, message: dict[str, Any], on_error: OnError
    ) -> None:
        self.batcher.submit_nowait(on_error, "PUBLISH", redis_channel, self.pack(message))

    def queue(self, channel: str) -> _BoundedQueue:
        queue = self.queues.get(channel)
        if queue is None:
            queue = self.queues[channel] = _BoundedQueue(self.layer.get_capacity(channel))
        return queue

    async def listen(self, redis_channel: str, channel: str) -> None:
        """Deliver messages of `redis_channel` to the local `channel`, from the moment
        this returns: whatever is published after it, from any process, is received."""
        if channel in self.listeners.get(redis_channel, ()):
            return  # every receive() passes here: no lock on the hot path
        async with self.subscribe_lock:
            members = self.listeners.get(redis_channel)
            if members is None:
                await self.subscription.subscribe(redis_channel)
                members = self.listeners[redis_channel] = set()
            members.add(channel)
            self.joined.setdefault(channel, set()).add(redis_channel)
        # Outside the lock: sockets joining at once wait for their confirmations together.
        await self.subscription.confirmed(redis_channel)

    async def unlisten(self, redis_channel: str, channel: str) -> None:
        async with self.subscribe_lock:
            members = self.listeners.get(redis_channel)
            if members is None or channel not in members:
                return
            members.discard(channel)
            joined = self.joined.get(channel)
            if joined is not None:
                joined.discard(redis_channel)
                if not joined:
                    del self.joined[channel]
            if members:
                return
            del self.listeners[redis_channel]
            self.subscription.unsubscribe(redis_channel)

    def forget_if_idle(self, channel: str, cancelled_at: float) -> None:
        if self.receiving.get(channel) or self.last_receive.get(channel, 0.0) > cancelled_at:
            return
        task = asyncio.ensure_future(self.forget(channel))
        self.cleanups.add(task)
        task.add_done_callback(self.cleanups.discard)

    async def forget(self, channel: str) -> None:
        self.receivable.discard(channel)
        for redis_channel in list(self.joined.get(channel, ())):
            await self.unlisten(redis_channel, channel)
        self.queues.pop(channel, None)
        self.last_receive.pop(channel, None)

    def _deliver(self, redis_channel: bytes, data: bytes) -> None:
        for channel in self.listeners.get(redis_channel.decode(), ()):
            self.queue(channel).put_nowait(data)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.subscription.aclose()
        with contextlib.suppress(Exception):
            await self.batcher.aclose()
        self.queues.clear()
        self.receivable.clear()
        self.listeners.clear()
        self.joined.clear()


class RedisPubSubLayer(BaseChannelLayer):
    extensions = ["groups", "flush"]

    def __init__(
        self,
        hosts: list[str] | None = None,
        prefix: str = "openworker",
        expiry: int = 60,
        capacity: int = 100,
        channel_capacity: dict[str, int] | None = None,
        **_: Any,
    ) -> None:
        super().__init__(expiry=expiry, capacity=capacity)
        self.channel_capacity = self.compile_capacities(channel_capacity or {})
        if not hosts or len(hosts) != 1 or not isinstance(hosts[0], str):
            raise ValueError("RedisPubSubLayer takes exactly one Redis URL in hosts")
        self.url = hosts[0]
        self.prefix = prefix
        self._layers: LoopLocal[_LoopLayer] = LoopLocal(self._make_loop_layer)
        self._group_keys: dict[str, str] = {}

    # -- naming and serialisation -----------------------------------------------------

    def _channel_key(self, channel: str) -> str:
        return f"{self.prefix}:channel:{channel}"

    def _group_key(self, group: str) -> str:
        return f"{self.prefix}:group:{group}"

    def _checked_group_key(self, group: str) -> str:
        """The group's Redis channel, its name checked the first time (TypeError)."""
        key = self._group_keys.get(group)
        if key is None:
            self.require_valid_group_name(group)
            if len(self._group_keys) >= CHECKED_GROUPS:
                self._group_keys.clear()
            key = self._group_keys[group] = self._group_key(group)
        return key

    def serialize(self, message: dict[str, Any]) -> bytes:
        return msgpack.packb(message, use_bin_type=True)

    def deserialize(self, data: bytes) -> dict[str, Any]:
        return msgpack.unpackb(data, raw=False)

    def _make_loop_layer(self, loop: asyncio.AbstractEventLoop) -> _LoopLayer:
        layer = _LoopLayer(self)
        _close_with_loop(loop, layer)
        return layer

    def _loop_layer(self) -> _LoopLayer:
        return self._layers.get()

    # -- the channel layer API ------------------------------------------------------------

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        assert isinstance(message, dict), "message is not a dict"
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        await self._loop_layer().publish(self._channel_key(channel), message)

    async def new_channel(self, prefix: str = "specific.") -> str:
        channel = f"{prefix}{uuid.uuid4().hex}"
        layer = self._loop_layer()
        layer.queue(channel)
        await layer.listen(self._channel_key(channel), channel)
        return channel

    async def receive(self, channel: str) -> dict[str, Any]:
        layer = self._loop_layer()
        if channel not in layer.receivable:
            assert self.require_valid_channel_name(channel), "Channel name not valid"
            layer.queue(channel)
            await layer.listen(self._channel_key(channel), channel)
            layer.receivable.add(channel)
        queue = layer.queue(channel)
        loop = asyncio.get_running_loop()
        layer.receiving[channel] = layer.receiving.get(channel, 0) + 1
        layer.last_receive[channel] = loop.time()
        try:
            data = await queue.get()
        except asyncio.CancelledError:
            # Channels cancels `receive` when its consumer ends; a caller with a timeout
            # cancels it too and comes back. Forget the channel only if nobody does.
            loop.call_later(FORGET_AFTER_SECONDS, layer.forget_if_idle, channel, loop.time())
            raise
        finally:
            layer.receiving[channel] -= 1
            if not layer.receiving[channel]:
                del layer.receiving[channel]
        return self.deserialize(data)

    async def group_add(self, group: str, channel: str) -> None:
        assert self.require_valid_group_name(group), "Group name not valid"
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        await self._loop_layer().listen(self._group_key(group), channel)

    async def group_discard(self, group: str, channel: str) -> None:
        assert self.require_valid_group_name(group), "Group name not valid"
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        await self._loop_layer().unlisten(self._group_key(group), channel)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        await self.group_send_nowait(group, message)

    def group_send_nowait(self, group: str, message: dict[str, Any]) -> asyncio.Future[Any]:
        """`group_send` queued now (in call order) on the loop's batcher: await the
        result to learn the outcome. No task per message: the streaming hot path."""
        assert isinstance(message, dict), "message is not a dict"
        return self._loop_layer().publish(self._checked_group_key(group), message)

    def group_send_quiet(self, group: str, message: dict[str, Any], on_error: OnError) -> None:
        """`group_send` queued now (in call order) with no outcome to await: `on_error(error)`
        if it fails. A streaming worker's deltas; `settled()` waits for them."""
        assert isinstance(message, dict), "message is not a dict"
        self._loop_layer().publish_nowait(self._checked_group_key(group), message, on_error)

    async def settled(self) -> None:
        """Return once every publish this loop queued before has its outcome."""
        await self._loop_layer().batcher.settled()

    async def flush(self) -> None:
        """Drop this loop's subscriptions, queues and connections."""
        layer = self._layers.pop(asyncio.get_running_loop())
        if layer is not None:
            await layer.close()


def _close_with_loop(loop: asyncio.AbstractEventLoop, layer: _LoopLayer) -> None:
    on_loop_close(loop, layer.close)
