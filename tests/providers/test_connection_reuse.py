"""The event-loop path keeps provider connections for the next call.

After a reply's terminal event the client reads the end of the body (for at most
`DRAIN_SECONDS`), so the connection returns to the pool: a new session's title and a tool
turn's next model call reuse it instead of another TCP (and TLS) handshake. A server that
keeps the body open after the terminal event costs that short wait, never a hang. An
address-literal base URL is vetted without a thread hop (there is no name to look up).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from providers import ProviderRouter, aio_backend, outbound
from providers.errors import OutboundBlockedError
from providers.outbound import AsyncGuardedTransport, OutboundPolicy
from providers.transport import Transport
from providers.wire import _http_client
from tests.fakes import script as fake
from tests.providers.test_async_streaming import LOCAL, USER, collect, wired

MODEL = "anthropic:claude-test"


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every TCP connection the event-loop backend opens."""
    opened: list[tuple[str, int]] = []
    real = aio_backend.AsyncioBackend.connect_tcp

    async def counting(self: Any, host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        opened.append((host, port))
        return await real(self, host, port, *args, **kwargs)

    monkeypatch.setattr(aio_backend.AsyncioBackend, "connect_tcp", counting)
    return opened


async def test_a_second_call_reuses_the_first_calls_connection(connects):
    async with wired("anthropic") as w:
        w.server.push(fake.Reply(fake.text("First.")), fake.Reply(fake.text("Second.")))
        first = await collect(w.astream())
        second = await collect(w.astream())

    assert first[-1].turn.text == "First." and second[-1].turn.text == "Second."
    assert len(w.server.requests) == 2
    assert len(connects) == 1


# --- a server that keeps the body open after the terminal event -----------------------


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


REPLY_EVENTS = b"".join(
    [
        _sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-test",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 5, "output_tokens": 1},
                },
            },
        ),
        _sse(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        _sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Hi."},
            },
        ),
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 2},
            },
        ),
        _sse("message_stop", {"type": "message_stop"}),
    ]
)


@contextlib.asynccontextmanager
async def lingering_server() -> AsyncIterator[tuple[int, list[int]]]:
    """An Anthropic-speaking server that never ends its chunked body: after
    `message_stop` it holds the connection open. Yields (port, requests per connection)."""
    per_connection: list[int] = []
    held: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        per_connection.append(0)
        held.append(writer)
        with contextlib.suppress(Exception):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                per_connection[-1] += 1
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                    + f"{len(REPLY_EVENTS):x}\r\n".encode()
                    + REPLY_EVENTS
                    + b"\r\n"
                )
                await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], per_connection
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_a_server_that_keeps_the_body_open_costs_a_short_wait_and_a_new_connection(
    connects,
):
    async with lingering_server() as (port, per_connection):
        router = ProviderRouter(
            {"provider:anthropic": {"base_url": f"http://127.0.0.1:{port}", "api_key": "k"}},
            transport_factory=lambda: Transport(policy=LOCAL),
        )
        try:
            loop = asyncio.get_running_loop()
            started = loop.time()
            first = await collect(router.astream(model=MODEL, messages=USER))
            took = loop.time() - started
            second = await collect(router.astream(model=MODEL, messages=USER))
        finally:
            await router.aclose()

    assert first[-1].turn.text == second[-1].turn.text == "Hi."
    assert took < 5  # the drain gave up (DRAIN_SECONDS); nothing waited for the body's end
    assert per_connection == [1, 1]  # the unfinished connection was not reused
    assert len(connects) == 2


def test_the_drain_is_short():
    assert 0 < _http_client.DRAIN_SECONDS <= 0.1


# --- vetting an address needs no thread ------------------------------------------------


async def test_an_address_literal_is_vetted_without_a_thread(monkeypatch):
    async def no_thread(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an address literal needs no lookup thread")

    monkeypatch.setattr(outbound.asyncio, "to_thread", no_thread)
    async with wired("anthropic") as w:
        w.server.push(fake.Reply(fake.text("Direct.")))
        chunks = await collect(w.astream())
    assert chunks[-1].turn.text == "Direct."


async def test_an_address_literal_is_still_checked_against_the_policy():
    transport = AsyncGuardedTransport(OutboundPolicy(allowlist=[]))
    import httpx

    with pytest.raises(OutboundBlockedError):
        await transport.handle_async_request(httpx.Request("POST", "http://127.0.0.1:9/v1"))
    await transport.aclose()


async def test_a_host_name_is_still_looked_up_off_the_loop(monkeypatch):
    hops: list[Any] = []
    real = asyncio.to_thread

    async def recording(fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(fn)
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(outbound.asyncio, "to_thread", recording)
    async with wired("anthropic", base_url="http://localhost:{port}") as w:
        w.server.push(fake.Reply(fake.text("By name.")))
        chunks = await collect(w.astream())
    assert chunks[-1].turn.text == "By name."
    assert hops  # the name's lookup ran in a thread


# --- the blocking path ----------------------------------------------------------------


async def _in_a_new_thread(call: Callable[[], Any]) -> Any:
    """`call()` on a thread of its own (not a pool's, which might be the last one's)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def run() -> None:
        try:
            result = call()
        except BaseException as exc:
            loop.call_soon_threadsafe(done.set_exception, exc)
        else:
            loop.call_soon_threadsafe(done.set_result, result)

    threading.Thread(target=run).start()
    return await done


async def test_blocking_calls_from_different_threads_reuse_one_connection(connects):
    """`stream()` runs on the one private loop of `providers.blocking`, whichever thread
    calls it, so its pooled connection serves the next blocking call too."""
    async with wired("anthropic") as w:
        w.server.push(fake.Reply(fake.text("First.")), fake.Reply(fake.text("Second.")))
        first = await _in_a_new_thread(w.stream)
        second = await _in_a_new_thread(w.stream)

    assert first[-1].turn.text == "First." and second[-1].turn.text == "Second."
    assert len(w.server.requests) == 2
    assert len(connects) == 1
