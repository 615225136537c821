"""Embedded mode's channel layer: Channels' in-memory layer without its per-message costs.

`channels.layers.InMemoryChannelLayer` walks every channel and every group membership of
the process on each `receive` and `group_send` (expiry clean-up), and `group_send` makes
a task per member: with 200 open sockets streaming, the walks alone took a quarter of
Daphne's event loop (py-spy under `bench/stream_path.py --mode embedded`, K = 200), and
the cost grows with the square of the sockets. Here the clean-up runs at most once per
`CLEAN_SECONDS` (messages live `expiry` = 60 s, so a second late changes nothing), and
`group_send_nowait` puts the message on each member's queue at once, with no task: the
turn emitter's hot path (`openworker.runtime.live.events.publish_soon`) uses it, as it
uses the Redis layer's. Same semantics otherwise: a copy per member
(`providers.json_copy`: the JSON shapes a channel message is made of, copied directly),
a full queue drops the message (the replay buffer fills the gap).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from channels.layers import InMemoryChannelLayer

from providers.json_copy import json_copy

CLEAN_SECONDS = 1.0


class LocalChannelLayer(InMemoryChannelLayer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._next_clean = 0.0

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now < self._next_clean:
            return
        self._next_clean = now + CLEAN_SECONDS
        super()._clean_expired()

    def group_send_nowait(self, group: str, message: dict[str, Any]) -> asyncio.Future[None]:
        """`group_send` done now, in call order; returns a finished future."""
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_group_name(group)
        self._clean_expired()
        expires = time.time() + self.expiry
        for channel in list(self.groups.get(group, ())):
            queue = self.channels.get(channel)
            if queue is None:
                queue = self.channels[channel] = asyncio.Queue(maxsize=self.get_capacity(channel))
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait((expires, json_copy(message)))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        self.group_send_nowait(group, message)
