"""The stream-path bench's stamping upstream (bench/_common.py) is the clock its figures
are read against: every reply must be a whole, valid Messages stream, each token stamped
when it was written, at the reply's pace for every stream at once, on a connection kept
for the next request."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator

import anthropic
import httpx
import pytest

from bench._common import now_us, parse_tokens, upstream_process

TOKENS = 8
RATE = 100.0  # tokens a second: 10 ms apart
STREAMS = 20


@pytest.fixture()
def upstream() -> Iterator[str]:
    """The upstream as the bench runs it: its own process."""
    with upstream_process(TOKENS, RATE) as base_url:
        yield base_url


def _sse_events(raw: str) -> list[tuple[str, dict]]:
    events = []
    for block in raw.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines:
            events.append((lines.get("event", ""), json.loads(lines["data"])))
    return events


BODY = {
    "model": "claude-bench",
    "max_tokens": 1024,
    "stream": True,
    "messages": [{"role": "user", "content": "stream, please"}],
}


def test_every_concurrent_stream_is_a_whole_messages_stream_stamped_at_its_pace(upstream):
    async def one(client: httpx.AsyncClient) -> tuple[int, str]:
        asked = now_us()
        response = await client.post("/v1/messages", json=BODY)
        return asked, response.text

    async def all_streams() -> list[tuple[int, str]]:
        async with httpx.AsyncClient(base_url=upstream, timeout=30) as client:
            return await asyncio.gather(*(one(client) for _ in range(STREAMS)))

    for asked, raw in asyncio.run(all_streams()):
        events = _sse_events(raw)
        names = [name for name, _ in events]
        assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
        text = "".join(
            data["delta"]["text"] for name, data in events if name == "content_block_delta"
        )
        stamps = parse_tokens(text)
        assert [index for index, _ in stamps] == list(range(TOKENS))
        times = [stamp for _, stamp in stamps]
        assert times[0] >= asked
        # Never faster than the pace (a token is due its interval after the one before).
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert min(gaps) >= 1e6 / RATE - 2_500  # a wake-up writes what is due within 2 ms


def test_the_sdk_reads_the_stream_and_the_connection_serves_the_next_request(upstream):
    client = anthropic.Anthropic(base_url=upstream, api_key="test-key", max_retries=0)
    for _ in range(2):
        with client.messages.stream(
            model="claude-bench",
            max_tokens=1024,
            messages=[{"role": "user", "content": "stream, please"}],
        ) as stream:
            text = "".join(stream.text_stream)
            message = stream.get_final_message()
        assert [index for index, _ in parse_tokens(text)] == list(range(TOKENS))
        assert message.stop_reason == "end_turn"


def test_a_client_gone_mid_stream_ends_its_stream_and_the_rest_go_on(upstream):
    async def leave_early() -> None:
        async with (
            httpx.AsyncClient(base_url=upstream, timeout=30) as client,
            client.stream("POST", "/v1/messages", json=BODY) as response,
        ):
            async for _ in response.aiter_bytes():
                break

    async def whole() -> str:
        async with httpx.AsyncClient(base_url=upstream, timeout=30) as client:
            return (await client.post("/v1/messages", json=BODY)).text

    async def both() -> str:
        _, text = await asyncio.gather(leave_early(), whole())
        return text

    events = _sse_events(asyncio.run(both()))
    assert events[-1][0] == "message_stop"
