"""Benchmark: the web process's CPU per message the channel layer receives.

Run from the repository root (Redis on 127.0.0.1:6379): `.venv/bin/python
bench/layer_receive.py`. No database.

SOCKETS receivers on one event loop (uvloop's, as Daphne's), each with a channel of its
own in a group of its own, as a session's socket is, read with `layer.receive` in a
loop as a consumer does. Another process publishes MESSAGES messages to each group, a
delta-sized event each, in pipelined batches as a worker's batcher does. Reports this
process's CPU per message received (`time.process_time`: the publisher and Redis are
not counted), best and median of RUNS: the pub/sub connection's read, the fan-out to
the channels' queues, and `receive`'s unpacking. The sockets and the consumers'
handlers are not here (`bench/stream_path.py` measures the whole path).

No target: a figure to compare trees by (docs/PERFORMANCE.md). About twenty seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import distributed_without_database

REDIS_URL = "redis://127.0.0.1:6379/13"
SOCKETS = 500
MESSAGES = 40
RUNS = 5
# The publisher's batch: about what a worker's batcher carries per round trip under load.
BATCH = 200


def _publish(redis_url: str, prefix: str, groups: list[str], messages: int) -> None:
    """The publishing process: every group's messages, in rounds, through the layer's own
    `group_send_nowait` (so the wire format is the layer's), BATCH at a time."""
    distributed_without_database(redis_url)
    from openworker.event_loop import new_event_loop
    from openworker.runtime.live.channel_layer import RedisPubSubLayer

    async def run() -> None:
        layer = RedisPubSubLayer(hosts=[redis_url], prefix=prefix)
        sent: list[Any] = []
        for n in range(messages):
            for group in groups:
                event = {"type": "delta", "turn": group, "seq": n + 1, "text": "a token "}
                message = {"type": "session.event", "event": event}
                sent.append(layer.group_send_nowait(group, message))
                if len(sent) >= BATCH:
                    await asyncio.gather(*sent)
                    sent.clear()
        await asyncio.gather(*sent)
        await layer.flush()

    loop = new_event_loop()
    try:
        loop.run_until_complete(run())
    finally:
        loop.close()


async def _run(redis_url: str, sockets: int, messages: int) -> float:
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    assert layer is not None
    prefix = layer.prefix
    groups = [f"bench-{uuid.uuid4().hex}" for _ in range(sockets)]
    channels = []
    for group in groups:
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
        channels.append(channel)

    async def consume(channel: str) -> None:
        for _ in range(messages):
            await layer.receive(channel)

    readers = [asyncio.ensure_future(consume(channel)) for channel in channels]
    publisher = multiprocessing.get_context("spawn").Process(
        target=_publish, args=(redis_url, prefix, groups, messages)
    )
    started = time.process_time()
    publisher.start()
    await asyncio.gather(*readers)
    used = time.process_time() - started
    publisher.join()
    for group, channel in zip(groups, channels, strict=True):
        await layer.group_discard(group, channel)
    return used * 1e6 / (sockets * messages)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=REDIS_URL)
    parser.add_argument("--sockets", type=int, default=SOCKETS)
    parser.add_argument("--messages", type=int, default=MESSAGES)
    parser.add_argument("--runs", type=int, default=RUNS)
    args = parser.parse_args()
    distributed_without_database(args.redis_url)
    from openworker.event_loop import new_event_loop

    figures = []
    for _ in range(args.runs):
        loop = new_event_loop()
        try:
            run = _run(args.redis_url, args.sockets, args.messages)
            figures.append(loop.run_until_complete(run))
        finally:
            loop.close()
    print(
        f"layer receive: {args.sockets} sockets x {args.messages} messages on one loop, "
        f"{args.runs} runs: CPU per message best {min(figures):.1f} µs, median "
        f"{statistics.median(figures):.1f} µs ({', '.join(f'{f:.1f}' for f in figures)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
