"""The event-loop ("async twin") streaming path, end to end against the fake providers.

`astream` must be `stream` run on the loop: the same request, the same chunks and turn,
the same retries (only before anything was yielded), the same errors, the same SSRF
guard, and a `CancelToken` that reaches an awaited read from any thread without ever
cancelling the consumer's own awaits. Everything here goes over real loopback HTTP to the
fakes of tests/fakes (nothing of httpx is mocked).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpcore
import pytest

from providers import ProviderRouter, aio_backend
from providers.aio_backend import AsyncioBackend
from providers.base import ProviderClient
from providers.cancel import CancelToken
from providers.errors import (
    OutboundBlockedError,
    ProviderError,
    RequestCancelled,
    StreamError,
)
from providers.outbound import OutboundPolicy
from providers.registry import get_descriptor, provider_names
from providers.transport import Transport
from providers.types import AssistantTurn, ModelCapabilities, StreamChunk
from tests.fakes import script as fake
from tests.fakes.server import FakeServer
from tests.providers.test_every_provider import (
    CALL_ARGUMENTS,
    EXPECTED_USAGE,
    EXPECTED_USAGE_FOR_API,
    MODEL_FOR_API,
    SCRIPTED_USAGE,
    THINKING_FOR_API,
    TOOLS,
    _profile,
    _server,
)

LOCAL = OutboundPolicy(allowlist=["127.0.0.1"])
USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]
# One provider per event-loop transport path: Server-Sent Events (`astream_sse`) and
# Bedrock's binary event stream (`astream_bytes`).
PATHS = ["anthropic", "bedrock"]
# Longer than any test may run: a read that is not cut short by the test's own action
# hangs until pytest-timeout fails it, so nothing here asserts on a clock.
FOREVER = 3600.0


@dataclass
class Wired:
    """One provider's router pointed at its fake, and the retry delays it recorded."""

    api: str
    server: FakeServer
    router: ProviderRouter
    model: str
    waits: list[float]

    def astream(self, **settings: Any) -> AsyncIterator[StreamChunk]:
        return self.router.astream(model=self.model, messages=USER, **settings)

    def stream(self, **settings: Any) -> list[StreamChunk]:
        return list(self.router.stream(model=self.model, messages=USER, **settings))


@contextlib.asynccontextmanager
async def wired(
    name: str, *, policy: OutboundPolicy = LOCAL, base_url: str | None = None, **options: Any
) -> AsyncIterator[Wired]:
    """`name`'s router against its fake. Its transports record their retry delays in
    `waits` instead of sleeping (unless given a `sleep=`); `options` are the rest of
    `Transport`'s. The router is closed with `aclose()`, on the loop."""
    descriptor = get_descriptor(name)
    assert descriptor is not None
    model = MODEL_FOR_API[descriptor.api]
    caps = ModelCapabilities(
        tools=True, reasoning=True, thinking=THINKING_FOR_API[descriptor.api], curated=True
    )
    waits: list[float] = []
    options.setdefault("sleep", waits.append)

    with _server(descriptor) as server:
        profile = _profile(descriptor, server, sigv4=True)
        if base_url is not None:
            profile["base_url"] = base_url.format(port=server.port)
        router = ProviderRouter(
            {f"provider:{name}": profile},
            matrix={f"{name}:{model}": caps},
            transport_factory=lambda: Transport(policy=policy, **options),
        )
        try:
            yield Wired(descriptor.api, server, router, f"{name}:{model}", waits)
        finally:
            await router.aclose()


async def collect(chunks: AsyncIterable[StreamChunk]) -> list[StreamChunk]:
    return [chunk async for chunk in chunks]


def streamed_text(chunks: list[StreamChunk]) -> str:
    return "".join(chunk.text or "" for chunk in chunks)


def free_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def assert_no_connection_attempted(listener: socket.socket) -> None:
    """A connect to `listener` would sit in its accept queue: there must be none."""
    listener.setblocking(False)
    with pytest.raises(BlockingIOError):
        listener.accept()


# --- parity with the blocking path ----------------------------------------------------

REPLY = fake.Reply(
    fake.reasoning("The user wants the weather; ask the tool."),
    fake.text("Let me check the forecast."),
    fake.tool_call("weather", CALL_ARGUMENTS, id="call_weather_1"),
    SCRIPTED_USAGE,
)


@pytest.mark.parametrize("name", provider_names())
async def test_astream_yields_the_same_chunks_and_turn_as_stream(name: str):
    async with wired(name) as w:
        w.server.push(REPLY, REPLY)
        settings = {"tools": TOOLS, "reasoning_effort": "high"}

        blocking = w.stream(**settings)
        looped = await collect(w.astream(**settings))
        sent = [request.raw for request in w.server.requests]

    assert sent[0] == sent[1]  # the same request, byte for byte
    assert looped[:-1] == blocking[:-1]  # the same deltas, in the same order
    assert all(chunk.turn is None for chunk in looped[:-1])
    turn, expected = looped[-1].turn, blocking[-1].turn
    assert turn is not None and expected is not None
    assert (turn.text, turn.reasoning, turn.tool_calls, turn.usage, turn.finish_reason) == (
        expected.text,
        expected.reasoning,
        expected.tool_calls,
        expected.usage,
        expected.finish_reason,
    )
    # ...and that turn is the scripted reply, so the comparison above is not of two blanks.
    assert turn.text == streamed_text(looped) == "Let me check the forecast."
    assert turn.reasoning == "The user wants the weather; ask the tool."
    assert [(call.name, call.arguments) for call in turn.tool_calls] == [
        ("weather", CALL_ARGUMENTS)
    ]
    assert turn.usage == EXPECTED_USAGE_FOR_API.get(w.api, EXPECTED_USAGE)
    assert len([chunk for chunk in looped if chunk.text]) > 1  # real deltas
    assert any(chunk.tool_call_delta for chunk in looped)
    assert w.waits == []


@pytest.mark.parametrize("name", provider_names())
async def test_acomplete_sends_the_same_request_as_complete_and_returns_the_same_turn(name: str):
    """The event loop's whole-reply call (a session title): `complete()`'s request and
    parser, one read of the reply instead of an event per token."""
    async with wired(name) as w:
        w.server.push(REPLY, REPLY)
        settings = {"tools": TOOLS, "reasoning_effort": "high"}
        expected = await asyncio.to_thread(
            lambda: w.router.complete(model=w.model, messages=USER, **settings)
        )
        turn = await w.router.acomplete(model=w.model, messages=USER, **settings)
        sent = [request.raw for request in w.server.requests]

    assert sent[0] == sent[1]  # the same request, byte for byte
    assert (turn.text, turn.reasoning, turn.tool_calls, turn.usage, turn.finish_reason) == (
        expected.text,
        expected.reasoning,
        expected.tool_calls,
        expected.usage,
        expected.finish_reason,
    )
    assert turn.text == "Let me check the forecast."
    assert [(call.name, call.arguments) for call in turn.tool_calls] == [
        ("weather", CALL_ARGUMENTS)
    ]


async def test_acomplete_of_a_client_without_its_own_is_the_final_turn_of_its_stream():
    class StreamOnly(ProviderClient):
        def complete(self, *, model, messages, tools=None, **settings):  # type: ignore[override]
            raise AssertionError("streamed, not completed")

        def capabilities(self, model: str) -> ModelCapabilities:
            return ModelCapabilities()

        def stream(self, *, model, messages, tools=None, **settings):  # type: ignore[override]
            yield StreamChunk(text="Hel")
            yield StreamChunk(turn=AssistantTurn(text="Hello"))

    assert await StreamOnly().acomplete(model="m", messages=USER) == AssistantTurn(text="Hello")


# --- retries ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", PATHS)
async def test_a_retryable_status_before_the_first_byte_is_retried_then_the_stream_succeeds(
    name: str,
):
    async with wired(name) as w:
        # Anthropic's 529 overloaded_error, Bedrock's 503 ServiceUnavailableException.
        w.server.push(fake.overloaded(), fake.Reply(fake.text("Back again.")))

        chunks = await collect(w.astream())

    assert chunks[-1].turn.text == streamed_text(chunks) == "Back again."
    assert len(w.server.requests) == 2
    (delay,) = w.waits
    assert 0.25 <= delay <= 0.5  # the first backoff step (0.5 s), jittered down by up to half


@pytest.mark.parametrize("name", PATHS)
async def test_retry_after_is_honoured_exactly_as_on_the_blocking_path(name: str):
    async with wired(name) as w:
        for _ in range(2):
            w.server.push(fake.rate_limited(retry_after=2), fake.Reply(fake.text("ok")))

        assert w.stream()[-1].turn.text == "ok"
        blocking_waits = list(w.waits)
        w.waits.clear()
        assert (await collect(w.astream()))[-1].turn.text == "ok"

    assert blocking_waits == w.waits == [2.0]
    assert len(w.server.requests) == 4


@pytest.mark.parametrize("name", PATHS)
async def test_a_failure_after_events_were_yielded_is_not_retried_and_keeps_the_partial(
    name: str,
):
    async with wired(name) as w:
        w.server.push(
            fake.Reply(fake.text("Before the cut"), fake.pause(0.05), fake.reset()),
            fake.Reply(fake.text("A retry would have read this.")),
        )
        received: list[StreamChunk] = []

        with pytest.raises(StreamError) as caught:
            async for chunk in w.astream():
                received.append(chunk)

    assert caught.value.partial is not None
    assert caught.value.partial.text == streamed_text(received) == "Before the cut"
    assert len(w.server.requests) == 1
    assert w.waits == []


FINAL_FAILURES = {
    "context-too-long": fake.context_too_long(),
    "quota": fake.quota_exceeded(),
    "model-not-found": fake.model_not_found(),
    "error-event-mid-stream": fake.Reply(fake.text("So far"), fake.error_event("rate_limit")),
}


@pytest.mark.parametrize(
    ("name", "failure"),
    [
        pytest.param(name, failure, id=f"{kind}-{name}")
        for name in PATHS
        for kind, failure in FINAL_FAILURES.items()
    ],
)
async def test_a_failed_stream_raises_the_same_error_as_on_the_blocking_path(
    name: str, failure: Any
):
    async with wired(name) as w:
        w.server.push(*[failure] * 6)  # enough for every attempt of both paths

        with pytest.raises(ProviderError) as blocking:
            w.stream()
        with pytest.raises(ProviderError) as looped:
            await collect(w.astream())

    assert type(looped.value) is type(blocking.value)
    assert (looped.value.kind, looped.value.status, str(looped.value)) == (
        blocking.value.kind,
        blocking.value.status,
        str(blocking.value),
    )
    assert looped.value.friendly == blocking.value.friendly
    partial, expected = looped.value.partial, blocking.value.partial
    assert (partial and partial.text) == (expected and expected.text)
    assert len(w.server.requests) == 2  # none of these is retried, on either path


# --- cancel -----------------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", PATHS)
async def test_a_token_fired_from_another_thread_cuts_a_read_waiting_on_a_paused_upstream(
    name: str,
):
    async with wired(name) as w:
        w.server.push(
            fake.Reply(fake.text("Thinking it over"), fake.pause(FOREVER), fake.text(" never"))
        )
        cancel = CancelToken()
        received: list[StreamChunk] = []
        timers: list[threading.Timer] = []

        async def consume() -> tuple[RequestCancelled | None, int]:
            error = None
            try:
                async for chunk in w.astream(cancel=cancel):
                    received.append(chunk)
                    if streamed_text(received) == "Thinking it over" and not timers:
                        # Fired from a thread while this task awaits the stalled read.
                        timers.append(threading.Timer(0.2, cancel.cancel))
                        timers[0].start()
            except RequestCancelled as exc:
                error = exc
            await asyncio.sleep(0)  # still runnable: no cancellation left pending on it
            current = asyncio.current_task()
            assert current is not None
            return error, current.cancelling()

        task = asyncio.create_task(consume())
        error, cancelling = await task
        disconnected = await asyncio.to_thread(w.server.wait_for_disconnect, 30)
        timers[0].join()

        # The pool is not left holding a half-read connection: the next turn streams.
        w.server.push(fake.Reply(fake.text("Fresh start.")))
        after = await collect(w.astream())

    assert isinstance(error, RequestCancelled)
    assert error.partial is not None and error.partial.text == "Thinking it over"
    assert " never" not in streamed_text(received)
    assert disconnected  # the upstream saw the client leave, in the middle of its pause
    assert w.server.disconnects[0].request_index == 0
    assert not task.cancelled() and cancelling == 0
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0
    assert after[-1].turn.text == "Fresh start."


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", PATHS)
async def test_a_token_fired_between_reads_spares_the_consumers_own_awaits(name: str):
    async with wired(name) as w:
        w.server.push(
            fake.Reply(fake.text("First words here"), fake.pause(FOREVER), fake.text(" never"))
        )
        cancel = CancelToken()
        stream = w.astream(cancel=cancel)
        received = [await anext(stream)]
        loop = asyncio.get_running_loop()
        fired = asyncio.Event()

        def fire() -> None:
            cancel.cancel()  # the guard's wake-up is queued on the loop before `fired`
            loop.call_soon_threadsafe(fired.set)

        # The consumer is busy with its own work, not reading the stream, when it fires.
        threading.Thread(target=fire).start()
        await fired.wait()
        await asyncio.sleep(0.05)
        await asyncio.to_thread(lambda: None)
        current = asyncio.current_task()
        assert current is not None
        busy_cancelling = current.cancelling()

        with pytest.raises(RequestCancelled):
            async for chunk in stream:  # only what had already arrived, then the raise
                received.append(chunk)
        disconnected = await asyncio.to_thread(w.server.wait_for_disconnect, 20)

    assert busy_cancelling == 0
    assert current.cancelling() == 0
    assert "First words here".startswith(streamed_text(received))
    assert disconnected and w.server.disconnects[0].request_index == 0


@pytest.mark.parametrize("name", PATHS)
async def test_a_token_fired_before_the_stream_starts_sends_nothing(name: str):
    async with wired(name) as w:
        cancel = CancelToken()
        cancel.cancel()

        with pytest.raises(RequestCancelled):
            await collect(w.astream(cancel=cancel))

    assert w.server.requests == []


@pytest.mark.timeout(30)
async def test_a_token_fired_while_waiting_for_the_response_headers_ends_the_request():
    transport = Transport(policy=LOCAL, sleep=lambda seconds: None)
    cancel = CancelToken()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1/messages"

        def upstream_that_never_answers() -> bytes:
            """Take the request, fire the token, then read until the client hangs up."""
            peer, _ = listener.accept()
            with peer:
                received = b""
                while b"\r\n\r\n" not in received and (chunk := peer.recv(65536)):
                    received += chunk
                cancel.cancel()  # from this thread, while the client awaits the headers
                while chunk := peer.recv(65536):
                    received += chunk
            return received

        upstream = asyncio.get_running_loop().run_in_executor(None, upstream_that_never_answers)
        try:
            with pytest.raises(RequestCancelled):
                async for _ in transport.astream_sse(
                    url, headers={}, body={"q": 1}, model="m", cancel=cancel
                ):
                    pass
            request = await upstream  # returns only once the client closed the connection
        finally:
            await transport.aclose()

    assert request.startswith(b"POST /v1/messages ")
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0


class FireWhenWaitingToRetry(logging.Handler):
    """Fires `cancel` from another thread once the stream's task is in its retry wait.

    The transport logs the retry, then awaits the wait without yielding in between: a
    callback queued from the log record runs only once the task is suspended there."""

    def __init__(self, cancel: CancelToken) -> None:
        super().__init__(logging.INFO)
        self.cancel = cancel
        self.loop = asyncio.get_running_loop()
        self.fired = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "retry" in record.getMessage() and not self.fired.is_set():
            self.fired.set()
            self.loop.call_soon(threading.Thread(target=self.cancel.cancel).start)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", PATHS)
async def test_a_token_fired_during_a_retry_wait_ends_it(name: str, caplog):
    cancel = CancelToken()
    firing = FireWhenWaitingToRetry(cancel)
    logger = logging.getLogger("providers.transport")
    # The real wait (`time.sleep` is the transport's cue to `asyncio.sleep` on the loop).
    async with wired(name, retry_after_cap=FOREVER, sleep=time.sleep) as w:
        w.server.push(fake.rate_limited(retry_after=FOREVER), fake.Reply(fake.text("late")))
        logger.addHandler(firing)
        try:
            with (
                caplog.at_level(logging.INFO, logger=logger.name),
                pytest.raises(RequestCancelled),
            ):
                await collect(w.astream(cancel=cancel))
        finally:
            logger.removeHandler(firing)

    assert firing.fired.is_set()  # the token fired while the stream waited to retry...
    assert len(w.server.requests) == 1  # ...and that wait was never waited out
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", PATHS)
async def test_cancelling_the_consumers_task_is_a_plain_cancel_that_releases_the_upstream(
    name: str,
):
    async with wired(name) as w:
        w.server.push(fake.Reply(fake.text("Part of it"), fake.pause(FOREVER)))
        started = asyncio.Event()

        async def consume() -> None:
            async for chunk in w.astream(cancel=CancelToken()):
                if chunk.text:
                    started.set()

        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        disconnected = await asyncio.to_thread(w.server.wait_for_disconnect, 20)

    assert task.cancelled()  # not turned into RequestCancelled: nobody fired the token
    assert disconnected


# --- the SSRF guard ---------------------------------------------------------------------


@pytest.mark.parametrize("name", PATHS)
async def test_an_async_stream_to_a_blocked_address_is_refused_before_any_request(name: str):
    async with wired(name, policy=OutboundPolicy()) as w:
        w.server.push(fake.Reply(fake.text("must not be served")))

        with pytest.raises(OutboundBlockedError) as caught:
            await collect(w.astream())

    assert "loopback" in caught.value.raw_message
    assert w.server.requests == []
    assert w.waits == []  # a refusal is final, not retried


@pytest.mark.parametrize("method", ["astream_sse", "astream_bytes"])
@pytest.mark.parametrize(
    ("policy", "host"),
    [
        (OutboundPolicy(), "127.0.0.1"),
        (OutboundPolicy(resolver=lambda host, port: ["127.0.0.1"]), "provider.test"),
        (OutboundPolicy(resolver=lambda host, port: ["169.254.169.254"]), "provider.test"),
    ],
    ids=["loopback-literal", "name-resolving-to-loopback", "name-resolving-to-metadata"],
)
async def test_the_async_guard_opens_no_connection_to_a_blocked_target(
    method: str, policy: OutboundPolicy, host: str
):
    # Short timeouts and no retries: were the guard to let it through, the silent listener
    # would fail the test quickly rather than hang it.
    transport = Transport(policy=policy, connect_timeout=2, read_timeout=2, max_retries=0)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        url = f"http://{host}:{listener.getsockname()[1]}/v1/messages"
        try:
            with pytest.raises(OutboundBlockedError):
                async for _ in getattr(transport, method)(url, headers={}, body={}, model="m"):
                    pass
        finally:
            await transport.aclose()
        assert_no_connection_attempted(listener)


async def test_the_async_guard_connects_to_the_vetted_address_and_keeps_the_host_name():
    # `provider.test` exists only in this resolver: a request reaching the fake proves
    # the connection went to the checked address, not to a second lookup of the name.
    policy = OutboundPolicy(["provider.test"], resolver=lambda host, port: ["127.0.0.1"])
    async with wired("anthropic", policy=policy, base_url="http://provider.test:{port}") as w:
        w.server.push(fake.Reply(fake.text("Pinned.")))

        chunks = await collect(w.astream())
        host = f"provider.test:{w.server.port}"

    assert chunks[-1].turn.text == "Pinned."
    assert w.server.last_request.headers["host"] == host


# --- timeouts on the asyncio network backend ---------------------------------------------


@pytest.mark.parametrize("name", PATHS)
async def test_a_stalled_stream_times_out_with_the_blocking_paths_error(name: str):
    async with wired(name, read_timeout=0.3) as w:
        stalled = fake.Reply(fake.text("Before the stall"), fake.pause(FOREVER), fake.text("x"))
        w.server.push(stalled, stalled)

        with pytest.raises(StreamError) as blocking:
            w.stream()
        with pytest.raises(StreamError) as looped:
            await collect(w.astream())

    assert type(looped.value) is type(blocking.value)
    assert str(looped.value) == str(blocking.value) == "no data from the upstream for 0.3 s"
    assert looped.value.friendly == blocking.value.friendly
    assert looped.value.kind == "stream" and looped.value.retryable
    assert looped.value.partial is not None and blocking.value.partial is not None
    assert looped.value.partial.text == blocking.value.partial.text == "Before the stall"
    assert len(w.server.requests) == 2  # a stall after the first event is not retried
    assert w.waits == []


async def test_the_asyncio_backend_reports_a_silent_peer_as_an_httpcore_read_timeout():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", listener.getsockname()[1])
        try:
            with pytest.raises(httpcore.ReadTimeout):
                await stream.read(1024, timeout=0.05)
        finally:
            await stream.aclose()


async def test_each_read_of_the_asyncio_backend_gets_its_whole_timeout():
    """One timer per connection checks the reads' deadlines: a peer whose bytes come
    closer together than the timeout never times a read out, however long the stream,
    and the read after the peer falls silent does."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", listener.getsockname()[1])
        try:
            peer, _ = await asyncio.to_thread(listener.accept)
            with peer:
                for _ in range(6):  # 6 gaps of 0.1 s: three times the timeout in all
                    await asyncio.sleep(0.1)
                    peer.sendall(b"x")
                    assert await stream.read(1024, timeout=0.2) == b"x"
                with pytest.raises(httpcore.ReadTimeout):
                    await stream.read(1024, timeout=0.2)
                # A shorter timeout than the connection's last one is not held to it.
                peer.sendall(b"y")
                assert await stream.read(1024, timeout=30) == b"y"
                with pytest.raises(httpcore.ReadTimeout):
                    await asyncio.wait_for(stream.read(1024, timeout=0.05), 5)
        finally:
            await stream.aclose()


async def test_the_asyncio_backend_stops_reading_past_its_buffer_limit_and_loses_nothing():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", listener.getsockname()[1])
        try:
            peer, _ = await asyncio.to_thread(listener.accept)
            with peer:
                sent = bytes(range(256)) * (4 * aio_backend.STREAM_LIMIT // 256)
                sending = asyncio.create_task(asyncio.to_thread(peer.sendall, sent))
                transport = stream._connection.transport  # what asyncio reads with
                while transport.is_reading():  # the peer fills the backend's buffer
                    await asyncio.sleep(0.01)
                received = b""
                while len(received) < len(sent):
                    received += await stream.read(65536, timeout=5)
                await sending
                assert transport.is_reading()  # read down: taking bytes again
        finally:
            await stream.aclose()

    assert received == sent


async def test_the_asyncio_backend_reports_a_refused_connection_as_an_httpcore_connect_error():
    with pytest.raises(httpcore.ConnectError):
        await AsyncioBackend().connect_tcp("127.0.0.1", free_port(), timeout=5)


async def test_the_asyncio_backend_reads_what_the_peer_sent_then_end_of_file():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", listener.getsockname()[1])
        try:
            peer, _ = await asyncio.to_thread(listener.accept)
            with peer:
                await stream.write(b"ping", timeout=5)
                assert await asyncio.to_thread(peer.recv, 4) == b"ping"
                peer.sendall(b"pong")
                peer.shutdown(socket.SHUT_WR)
                received = b""
                while chunk := await stream.read(1024, timeout=5):
                    received += chunk
        finally:
            await stream.aclose()

    assert received == b"pong"


class _RecordingTransport:
    """A transport's stand-in that records each write before making it."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


@pytest.mark.timeout(30)
async def test_a_requests_head_and_body_leave_in_one_write_when_its_reply_is_read():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", listener.getsockname()[1])
        recording = _RecordingTransport(stream._connection.transport)
        stream._connection.transport = recording
        try:
            peer, _ = await asyncio.to_thread(listener.accept)
            with peer:
                # As httpcore sends a request: the head, the body, then the reply is read.
                await stream.write(b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n", timeout=5)
                await stream.write(b"{}", timeout=5)
                peer.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
                assert await stream.read(1024, timeout=5) == b"HTTP/1.1 204 No Content\r\n\r\n"
                assert recording.writes == [b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"]
                # A body past the cork goes at once, with what was held before it.
                big = b"x" * aio_backend.CORK_LIMIT
                await stream.write(b"head", timeout=5)
                await stream.write(big, timeout=5)
                assert recording.writes[1:] == [b"head" + big]
        finally:
            await stream.aclose()


@pytest.mark.timeout(30)
async def test_the_asyncio_backend_hands_over_bytes_that_arrived_before_a_reset():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", listener.getsockname()[1])
        try:
            peer, _ = await asyncio.to_thread(listener.accept)
            peer.sendall(b"already here")
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            peer.close()  # a TCP reset right behind the data
            # The loop has seen the reset once the transport has closed its socket.
            while stream.get_extra_info("socket").fileno() != -1:
                await asyncio.sleep(0.01)

            assert await stream.read(1024, timeout=5) == b"already here"
            with pytest.raises(httpcore.ReadError):
                await stream.read(1024, timeout=5)
        finally:
            await stream.aclose()


# --- the router -------------------------------------------------------------------------


async def test_router_astream_goes_to_the_prefixed_provider_and_aclose_closes_its_clients():
    anthropic, deepseek = get_descriptor("anthropic"), get_descriptor("deepseek")
    assert anthropic is not None and deepseek is not None
    transports: list[Transport] = []

    def transport() -> Transport:
        transports.append(Transport(policy=LOCAL))
        return transports[-1]

    with _server(anthropic) as claude, _server(deepseek) as seek:
        router = ProviderRouter(
            {
                "provider:anthropic": _profile(anthropic, claude, sigv4=False),
                "provider:deepseek": _profile(deepseek, seek, sigv4=False),
            },
            default_provider="anthropic",
            transport_factory=transport,
        )
        claude.push(fake.Reply(fake.text("From Claude.")), fake.Reply(fake.text("Default.")))
        seek.push(fake.Reply(fake.text("From DeepSeek.")))
        try:
            prefixed = await collect(router.astream(model="anthropic:claude-x", messages=USER))
            other = await collect(router.astream(model="deepseek:deepseek-chat", messages=USER))
            bare = await collect(router.astream(model="claude-y", messages=USER))
            loop = asyncio.get_running_loop()
            clients = [built._clients.get(loop) for built in transports]
            open_before = [client is not None and not client.is_closed for client in clients]
        finally:
            await router.aclose()

    assert [chunks[-1].turn.text for chunks in (prefixed, other, bare)] == [
        "From Claude.",
        "From DeepSeek.",
        "Default.",
    ]
    assert [r.body["model"] for r in claude.requests] == ["claude-x", "claude-y"]
    assert [r.body["model"] for r in seek.requests] == ["deepseek-chat"]
    assert len(transports) == 2  # one client per provider, reused for the bare model
    assert open_before == [True, True]
    assert all(client.is_closed for client in clients)
    assert all(not built._clients for built in transports)


async def test_router_astream_runs_a_client_without_its_own_astream_in_a_stream_thread():
    class BlockingOnly(ProviderClient):
        def __init__(self, transport: Transport) -> None:
            self.transport = transport
            self.seen: list[tuple[str, str]] = []

        def close(self) -> None:
            self.transport.close()

        def complete(self, *, model, messages, tools=None, **settings):  # type: ignore[override]
            raise AssertionError("streamed, not completed")

        def capabilities(self, model: str) -> ModelCapabilities:
            return ModelCapabilities()

        def stream(self, *, model, messages, tools=None, **settings):  # type: ignore[override]
            self.seen.append((model, threading.current_thread().name))
            yield StreamChunk(text="Hel")
            yield StreamChunk(text="lo")
            yield StreamChunk(turn=AssistantTurn(text="Hello"))

    built: list[BlockingOnly] = []

    def client_factory(name, profile, secrets, *, transport, capabilities) -> BlockingOnly:
        built.append(BlockingOnly(transport))
        return built[-1]

    router = ProviderRouter(
        None, client_factory=client_factory, transport_factory=lambda: Transport(policy=LOCAL)
    )
    try:
        chunks = await collect(router.astream(model="openai:gpt-x", messages=USER))
    finally:
        await router.aclose()

    assert [chunk.text for chunk in chunks[:-1]] == ["Hel", "lo"]
    assert chunks[-1].turn == AssistantTurn(text="Hello")
    (client,) = built
    ((model, thread),) = client.seen
    assert model == "gpt-x"
    assert thread.startswith("provider-stream")
