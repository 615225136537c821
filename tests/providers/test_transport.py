from __future__ import annotations

import gzip
import json
import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from providers import blocking
from providers.cancel import CancelToken
from providers.errors import (
    BadRequestError,
    OutboundBlockedError,
    OverloadedError,
    ProviderError,
    QuotaError,
    RateLimitError,
    RequestCancelled,
    StreamError,
    UpstreamUnavailableError,
)
from providers.outbound import OutboundPolicy
from providers.sse import SSEEvent
from providers.transport import Transport, encode_body

KEY = "sk-test-0123456789abcdefghijklmnop"
HEADERS = {"Authorization": f"Bearer {KEY}"}
LOCAL = OutboundPolicy(allowlist=["127.0.0.1"])

Step = Callable[[BaseHTTPRequestHandler, "Upstream"], None]


class Upstream:
    """A scripted provider on 127.0.0.1: attempt N runs step N (the last step repeats)."""

    def __init__(self, *steps: Step) -> None:
        self.steps = list(steps)
        self.attempts = 0
        self.paths: list[str] = []
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.peers: list[tuple[str, int]] = []
        self.disconnected = threading.Event()
        self.release = threading.Event()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                upstream.bodies.append(self.rfile.read(length))
                upstream.paths.append(self.path)
                upstream.headers.append(dict(self.headers))
                upstream.peers.append(self.client_address)
                index = min(upstream.attempts, len(upstream.steps) - 1)
                upstream.attempts += 1
                upstream.steps[index](self, upstream)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/messages"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def h1_upstream():
    started: list[Upstream] = []

    def start(*steps: Step) -> Upstream:
        upstream = Upstream(*steps)
        started.append(upstream)
        return upstream

    yield start
    for upstream in started:
        upstream.close()


def stream_sse(transport: Transport, url: str, **kwargs) -> Iterator[SSEEvent]:
    """The blocking stream of Server-Sent Events, as the wire clients' `stream()` reads it:
    the transport's `astream_sse` on the private loop of `providers.blocking`."""
    return blocking.iterate(transport.astream_sse(url, **kwargs))


def make_transport(**kwargs) -> tuple[Transport, list[float]]:
    waits: list[float] = []
    options = {"policy": LOCAL, "sleep": waits.append, **kwargs}
    return Transport(**options), waits


# --- server steps ---------------------------------------------------------------------


def reply(status: int, body: bytes | str = b"", headers: dict[str, str] | None = None) -> Step:
    data = body.encode() if isinstance(body, str) else body

    def step(handler: BaseHTTPRequestHandler, upstream: Upstream) -> None:
        handler.send_response(status)
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    return step


def start_stream(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()


def chunk(handler: BaseHTTPRequestHandler, data: bytes) -> None:
    handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    handler.wfile.flush()


def end_stream(handler: BaseHTTPRequestHandler) -> None:
    handler.wfile.write(b"0\r\n\r\n")
    handler.wfile.flush()


def stream(*events: bytes) -> Step:
    def step(handler: BaseHTTPRequestHandler, upstream: Upstream) -> None:
        start_stream(handler)
        for data in events:
            chunk(handler, data)
        end_stream(handler)

    return step


def stream_then(first: bytes, ending: str, *, silence: float = 0.0) -> Step:
    """Send `first`, then end the connection badly: "cut" (close mid-body), "reset" (RST),
    "silence" (say nothing for `silence` s), or "drip" (silence, then write until the
    client's disconnect shows up as an error)."""

    def step(handler: BaseHTTPRequestHandler, upstream: Upstream) -> None:
        if ending == "cut-before-events":
            start_stream(handler)
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        start_stream(handler)
        chunk(handler, first)
        if ending == "cut":
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
        elif ending == "reset":
            handler.connection.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
            handler.close_connection = True
            handler.connection.close()
        elif ending == "silence":
            upstream.release.wait(silence)
            handler.close_connection = True
        elif ending == "drip":
            if wait_for_hangup(handler.connection, silence):
                upstream.disconnected.set()
                return
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    chunk(handler, b": ping\n\n")
                except OSError:  # BrokenPipe / ConnectionReset: the client hung up
                    upstream.disconnected.set()
                    break
                time.sleep(0.02)
            handler.close_connection = True

    return step


def wait_for_hangup(conn: socket.socket, seconds: float) -> bool:
    """Stay silent up to `seconds`; True as soon as the client has hung up (EOF or reset)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        readable, _, _ = select.select([conn], [], [], 0.02)
        if readable:
            try:
                if conn.recv(1, socket.MSG_PEEK) == b"":
                    return True
            except OSError:
                return True
    return False


def stall_before_headers(seconds: float) -> Step:
    def step(handler: BaseHTTPRequestHandler, upstream: Upstream) -> None:
        if wait_for_hangup(handler.connection, seconds):
            upstream.disconnected.set()
            handler.close_connection = True
            return
        try:
            reply(200, b"{}")(handler, upstream)
            handler.wfile.flush()
            time.sleep(0.05)
            reply(200, b"{}")(handler, upstream)
        except OSError:
            upstream.disconnected.set()
        handler.close_connection = True

    return step


OK_JSON = reply(200, '{"id": "msg_1", "content": "hi"}', {"Content-Type": "application/json"})
OVERLOADED = reply(
    529, '{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
)
EVENT_1 = b'event: message_start\ndata: {"n":1}\n\n'
EVENT_2 = b'event: message_stop\ndata: {"n":2}\n\n'


# --- requests and bodies --------------------------------------------------------------


def test_post_json_sends_byte_stable_json_and_returns_the_object(h1_upstream):
    upstream = h1_upstream(OK_JSON)
    transport, _ = make_transport()
    body = {"model": "m", "z": 1, "a": "é 世界", "nested": {"b": 2, "a": [1, 2]}}
    assert transport.post_json(upstream.url, headers=HEADERS, body=body, model="m") == {
        "id": "msg_1",
        "content": "hi",
    }
    sent = upstream.bodies[0]
    assert sent == json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    assert sent == encode_body(body)
    assert sent.startswith(b'{"model":"m","z":1,"a":"\xc3\xa9')  # insertion order, raw UTF-8
    assert upstream.headers[0]["Content-Type"] == "application/json"
    assert upstream.headers[0]["Authorization"] == f"Bearer {KEY}"


def test_a_request_carries_each_header_once_the_calls_own_over_the_defaults(h1_upstream):
    sent: list[tuple[str, str]] = []

    def step(handler: BaseHTTPRequestHandler, upstream: Upstream) -> None:
        sent.extend(handler.headers.items())
        stream(EVENT_1, EVENT_2)(handler, upstream)

    upstream = h1_upstream(step)
    transport, _ = make_transport()
    own = {**HEADERS, "user-agent": "openworker-test", "CONTENT-TYPE": "application/json; v=2"}
    list(stream_sse(transport, upstream.url, headers=own, body={"a": 1}, model="m"))
    names = [name.lower() for name, _ in sent]
    assert len(names) == len(set(names)), sent  # one of each, whatever the case
    values = {name.lower(): value for name, value in sent}
    assert values["user-agent"] == "openworker-test"
    assert values["content-type"] == "application/json; v=2"
    assert values["accept"] == "text/event-stream"
    assert values["authorization"] == f"Bearer {KEY}"
    assert values["content-length"] == "7"


def test_an_upstreams_cookie_is_never_sent_back(h1_upstream):
    upstream = h1_upstream(
        reply(200, '{"id": "msg_1"}', {"Set-Cookie": "session=abc; Path=/"}), OK_JSON
    )
    transport, _ = make_transport()
    for _ in range(2):
        transport.post_json(upstream.url, headers=HEADERS, body={"a": 1}, model="m")
    assert upstream.attempts == 2
    assert "Cookie" not in upstream.headers[1]


def test_an_unparsable_url_is_refused_every_time_it_is_asked(h1_upstream):
    transport, _ = make_transport()
    for _ in range(2):
        with pytest.raises(OutboundBlockedError):
            transport.post_json("http://[::1", headers=HEADERS, body={}, model="m")


def test_non_json_success_body_is_a_provider_error(h1_upstream):
    upstream = h1_upstream(reply(200, "<html>captive portal</html>"))
    transport, _ = make_transport()
    with pytest.raises(ProviderError, match="not JSON"):
        transport.post_json(upstream.url, headers=HEADERS, body={}, model="m")


# --- retries --------------------------------------------------------------------------


def test_retryable_status_is_retried_at_most_max_retries_times(h1_upstream):
    upstream = h1_upstream(reply(503, "busy"))
    transport, waits = make_transport()
    with pytest.raises(OverloadedError):
        transport.post_json(upstream.url, headers=HEADERS, body={}, model="m")
    assert upstream.attempts == 3
    assert len(waits) == 2


def test_529_is_retried_then_succeeds(h1_upstream):
    upstream = h1_upstream(OVERLOADED, OK_JSON)
    transport, waits = make_transport()
    assert transport.post_json(upstream.url, headers=HEADERS, body={}, model="m")["id"] == "msg_1"
    assert upstream.attempts == 2
    assert len(waits) == 1


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504, 529])
def test_every_retryable_status_is_retried(h1_upstream, status):
    upstream = h1_upstream(reply(status, "x"), OK_JSON)
    transport, _ = make_transport()
    transport.post_json(upstream.url, headers=HEADERS, body={}, model="m")
    assert upstream.attempts == 2


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422, 501])
def test_non_retryable_status_is_not_retried(h1_upstream, status):
    upstream = h1_upstream(reply(status, '{"error":{"message":"no"}}'), OK_JSON)
    transport, waits = make_transport()
    with pytest.raises(ProviderError):
        transport.post_json(upstream.url, headers=HEADERS, body={}, model="m")
    assert upstream.attempts == 1
    assert waits == []


def test_400_raises_bad_request_with_the_upstream_message(h1_upstream):
    upstream = h1_upstream(reply(400, '{"error":{"message":"temperature too hot"}}'))
    transport, _ = make_transport()
    with pytest.raises(BadRequestError) as caught:
        transport.post_json(upstream.url, headers=HEADERS, body={}, model="m")
    assert caught.value.raw_message == "temperature too hot"
    assert caught.value.status == 400


def test_quota_429_is_not_retried(h1_upstream):
    body = '{"error":{"message":"You exceeded your current quota","code":"insufficient_quota"}}'
    upstream = h1_upstream(reply(429, body, {"Retry-After": "1"}), OK_JSON)
    transport, waits = make_transport()
    with pytest.raises(QuotaError):
        transport.post_json(upstream.url, headers=HEADERS, body={}, model="m")
    assert upstream.attempts == 1
    assert waits == []


def test_retry_after_is_honoured(h1_upstream):
    upstream = h1_upstream(reply(429, "slow down", {"Retry-After": "3"}), OK_JSON)
    transport, waits = make_transport()
    transport.post_json(upstream.url, headers=HEADERS, body={}, model="m")
    assert waits == [3.0]


def test_retry_after_ms_is_honoured(h1_upstream):
    upstream = h1_upstream(reply(529, "busy", {"retry-after-ms": "1500"}), OK_JSON)
    transport, waits = make_transport()
    transport.post_json(upstream.url, headers=HEADERS, body={}, model="m")
    assert waits == [1.5]


def test_retry_after_above_the_cap_is_raised_at_once(h1_upstream):
    upstream = h1_upstream(reply(429, "slow down", {"Retry-After": "120"}), OK_JSON)
    transport, waits = make_transport(retry_after_cap=30.0)
    with pytest.raises(RateLimitError) as caught:
        transport.post_json(upstream.url, headers=HEADERS, body={}, model="m")
    assert caught.value.retry_after == 120.0
    assert upstream.attempts == 1
    assert waits == []


def test_backoff_is_jittered_and_exponential(h1_upstream):
    upstream = h1_upstream(reply(500, "x"))
    transport, waits = make_transport(max_retries=3, backoff_base=0.5)
    with pytest.raises(UpstreamUnavailableError):
        transport.post_json(upstream.url, headers=HEADERS, body={}, model="m")
    assert len(waits) == 3
    for wait, nominal in zip(waits, (0.5, 1.0, 2.0), strict=True):
        assert nominal / 2 <= wait <= nominal


def test_max_retries_zero_means_one_attempt(h1_upstream):
    upstream = h1_upstream(reply(503, "x"))
    transport, _ = make_transport(max_retries=0)
    with pytest.raises(OverloadedError):
        transport.post_json(upstream.url, headers=HEADERS, body={}, model="m")
    assert upstream.attempts == 1


def test_connect_errors_are_retried_then_reported_as_unavailable():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    transport, waits = make_transport()
    with pytest.raises(UpstreamUnavailableError):
        transport.post_json(f"http://127.0.0.1:{port}/v1", headers=HEADERS, body={}, model="m")
    assert len(waits) == 2


def test_timeout_waiting_for_headers_is_retried(h1_upstream):
    upstream = h1_upstream(stall_before_headers(2.0), OK_JSON)
    transport, waits = make_transport(read_timeout=0.3)
    assert transport.post_json(upstream.url, headers=HEADERS, body={}, model="m")["id"]
    assert upstream.attempts == 2
    assert len(waits) == 1


def test_redirects_are_not_followed(h1_upstream):
    upstream = h1_upstream(reply(307, "", {"Location": "http://127.0.0.1:1/elsewhere"}), OK_JSON)
    transport, _ = make_transport()
    with pytest.raises(BadRequestError) as caught:
        transport.post_json(upstream.url, headers=HEADERS, body={}, model="m")
    assert "redirect" in caught.value.raw_message
    assert "http://127.0.0.1:1/elsewhere" in caught.value.raw_message
    assert upstream.attempts == 1
    assert upstream.paths == ["/v1/messages"]


def test_the_ssrf_guard_applies_to_every_request(h1_upstream):
    upstream = h1_upstream(OK_JSON)
    transport, _ = make_transport(policy=OutboundPolicy())
    with pytest.raises(OutboundBlockedError):
        transport.post_json(upstream.url, headers=HEADERS, body={}, model="m")
    assert upstream.attempts == 0


def test_keys_stay_out_of_errors_and_logs(h1_upstream, caplog):
    echo = f'{{"error":{{"message":"bad key Bearer {KEY} and {KEY}"}}}}'
    upstream = h1_upstream(reply(500, "x"), reply(401, echo))
    transport, _ = make_transport()
    with caplog.at_level(logging.DEBUG), pytest.raises(ProviderError) as caught:
        transport.post_json(upstream.url, headers=HEADERS, body={}, model="m")
    assert upstream.attempts == 2
    assert caught.value.raw_message.startswith("bad key")
    assert KEY not in str(caught.value) and KEY not in caught.value.raw_message
    assert KEY not in caught.value.friendly
    assert "retry 1 of 2" in caplog.text  # the retry was logged...
    assert KEY not in caplog.text  # ...without the key


def test_a_key_in_the_query_string_is_refused(h1_upstream):
    upstream = h1_upstream(OK_JSON)
    transport, _ = make_transport()
    with pytest.raises(ValueError, match="header"):
        transport.post_json(upstream.url + "?key=AIzaSecret", headers={}, body={}, model="m")
    assert upstream.attempts == 0


# --- streaming ------------------------------------------------------------------------


def test_stream_yields_events(h1_upstream):
    upstream = h1_upstream(stream(EVENT_1, b": ping\n\n", EVENT_2))
    transport, _ = make_transport()
    events = list(stream_sse(transport, upstream.url, headers=HEADERS, body={"a": 1}, model="m"))
    assert events == [
        SSEEvent("message_start", '{"n":1}'),
        SSEEvent("message_stop", '{"n":2}'),
    ]
    assert upstream.headers[0]["Accept"] == "text/event-stream"
    assert upstream.bodies[0] == b'{"a":1}'


def test_stream_yields_each_event_as_it_arrives(h1_upstream):
    def step(handler, upstream):
        start_stream(handler)
        chunk(handler, EVENT_1)
        upstream.release.wait(5)  # the client must see event 1 before event 2 exists
        chunk(handler, EVENT_2)
        end_stream(handler)

    upstream = h1_upstream(step)
    transport, _ = make_transport()
    events = stream_sse(transport, upstream.url, headers=HEADERS, body={}, model="m")
    started = time.monotonic()
    assert next(events).event == "message_start"
    assert time.monotonic() - started < 2
    upstream.release.set()
    assert next(events).event == "message_stop"


def test_a_plain_body_is_read_on_h11_without_httpxs_byte_iterators(h1_upstream, monkeypatch):
    """The lean reader: a token-sized read must not cost six generator hops."""

    def refused(self, chunk_size=None):
        raise AssertionError("read through httpx's byte iterators")

    monkeypatch.setattr(httpx.Response, "aiter_bytes", refused)
    upstream = h1_upstream(stream(EVENT_1, EVENT_2), stream(EVENT_1))
    transport, _ = make_transport()
    events = list(stream_sse(transport, upstream.url, headers=HEADERS, body={}, model="m"))
    assert [e.event for e in events] == ["message_start", "message_stop"]
    # The whole body was read through h11: the connection went back to the pool.
    list(stream_sse(transport, upstream.url, headers=HEADERS, body={}, model="m"))
    assert len(set(upstream.peers)) == 1


def test_chunks_split_anywhere_across_reads_give_the_same_events(h1_upstream):
    """Chunk framing is h11's, whatever the read boundaries: a size line, a payload and
    its CRLF split over writes, and a chunk extension."""
    body = EVENT_1 + b": ping\n\n" + EVENT_2

    def step(handler, upstream):
        start_stream(handler)
        framed = f"{len(body):x};ext=1\r\n".encode() + body + b"\r\n0\r\n\r\n"
        for i in range(0, len(framed), 3):
            handler.wfile.write(framed[i : i + 3])
            handler.wfile.flush()
            time.sleep(0.001)

    upstream = h1_upstream(step)
    transport, _ = make_transport()
    events = list(stream_sse(transport, upstream.url, headers=HEADERS, body={}, model="m"))
    assert events == [
        SSEEvent("message_start", '{"n":1}'),
        SSEEvent("message_stop", '{"n":2}'),
    ]


def test_a_compressed_stream_is_decoded_by_httpx(h1_upstream):
    body = gzip.compress(EVENT_1 + EVENT_2)

    def step(handler, upstream):
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Content-Encoding", "gzip")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        chunk(handler, body[:10])
        chunk(handler, body[10:])
        end_stream(handler)

    upstream = h1_upstream(step)
    transport, _ = make_transport()
    events = list(stream_sse(transport, upstream.url, headers=HEADERS, body={}, model="m"))
    assert [e.event for e in events] == ["message_start", "message_stop"]


def test_a_malformed_chunk_header_is_a_stream_error(h1_upstream):
    def step(handler, upstream):
        start_stream(handler)
        chunk(handler, EVENT_1)
        handler.wfile.write(b"zz\r\nnot a chunk\r\n")
        handler.wfile.flush()
        handler.close_connection = True

    upstream = h1_upstream(step)
    transport, _ = make_transport()
    events = stream_sse(transport, upstream.url, headers=HEADERS, body={}, model="m")
    assert next(events).event == "message_start"
    with pytest.raises(StreamError):
        next(events)


def test_an_event_read_together_with_a_broken_frame_is_delivered_and_not_retried(h1_upstream):
    def step(handler, upstream):
        start_stream(handler)
        # One write, so one read: the good event's chunk and the broken one after it.
        handler.wfile.write(f"{len(EVENT_1):x}\r\n".encode() + EVENT_1 + b"\r\nzz\r\nxx\r\n")
        handler.wfile.flush()
        handler.close_connection = True

    upstream = h1_upstream(step, step, step)
    transport, waits = make_transport()
    events = stream_sse(transport, upstream.url, headers=HEADERS, body={}, model="m")
    assert next(events).event == "message_start"
    with pytest.raises(StreamError, match="chunk header"):
        next(events)
    assert upstream.attempts == 1
    assert waits == []


def test_nothing_is_retried_after_the_first_event(h1_upstream):
    upstream = h1_upstream(stream_then(EVENT_1, "cut"), stream(EVENT_1, EVENT_2))
    transport, waits = make_transport()
    received = []
    with pytest.raises(StreamError):
        for event in stream_sse(transport, upstream.url, headers=HEADERS, body={}, model="m"):
            received.append(event)
    assert [e.event for e in received] == ["message_start"]
    assert upstream.attempts == 1
    assert waits == []


def test_a_stream_failing_before_any_event_is_retried(h1_upstream):
    upstream = h1_upstream(stream_then(b"", "cut-before-events"), stream(EVENT_1, EVENT_2))
    transport, waits = make_transport()
    events = list(stream_sse(transport, upstream.url, headers=HEADERS, body={}, model="m"))
    assert len(events) == 2
    assert upstream.attempts == 2
    assert len(waits) == 1


def test_stream_error_status_is_retried_like_any_request(h1_upstream):
    upstream = h1_upstream(OVERLOADED, stream(EVENT_1))
    transport, _ = make_transport()
    events = list(stream_sse(transport, upstream.url, headers=HEADERS, body={}, model="m"))
    assert events == [SSEEvent("message_start", '{"n":1}')]
    assert upstream.attempts == 2


def test_reset_mid_stream_is_a_stream_error(h1_upstream):
    upstream = h1_upstream(stream_then(EVENT_1, "reset"))
    transport, _ = make_transport()
    events = stream_sse(transport, upstream.url, headers=HEADERS, body={}, model="m")
    assert next(events).event == "message_start"
    with pytest.raises(StreamError) as caught:
        next(events)
    assert caught.value.kind == "stream"


def test_read_idle_timeout_fires_mid_stream(h1_upstream):
    upstream = h1_upstream(stream_then(EVENT_1, "silence", silence=5))
    transport, _ = make_transport(read_timeout=0.3)
    events = stream_sse(transport, upstream.url, headers=HEADERS, body={}, model="m")
    assert next(events).event == "message_start"
    started = time.monotonic()
    with pytest.raises(StreamError, match="no data"):
        next(events)
    assert time.monotonic() - started < 2


def test_closing_the_stream_early_releases_the_connection(h1_upstream):
    upstream = h1_upstream(stream_then(EVENT_1, "drip", silence=0.2))
    transport, _ = make_transport()
    events = stream_sse(transport, upstream.url, headers=HEADERS, body={}, model="m")
    next(events)
    events.close()
    assert upstream.disconnected.wait(5)


# --- cancellation ---------------------------------------------------------------------


def test_cancel_closes_the_upstream_and_unblocks_the_read_at_once(h1_upstream):
    upstream = h1_upstream(stream_then(EVENT_1, "drip", silence=3))
    transport, _ = make_transport()
    cancel = CancelToken()
    got_first = threading.Event()
    outcome: dict[str, object] = {}

    def consume():
        try:
            for _ in stream_sse(
                transport, upstream.url, headers=HEADERS, body={}, model="m", cancel=cancel
            ):
                got_first.set()
        except BaseException as exc:
            outcome["error"] = exc
        outcome["at"] = time.monotonic()

    worker = threading.Thread(target=consume)
    worker.start()
    assert got_first.wait(5)
    time.sleep(0.1)  # the worker is now blocked reading a silent socket
    cancelled_at = time.monotonic()
    cancel.cancel()
    worker.join(5)
    assert isinstance(outcome.get("error"), RequestCancelled)
    assert outcome["at"] - cancelled_at < 1.0  # not the 3 s of upstream silence
    assert upstream.disconnected.wait(6)  # the server saw the disconnect


def test_cancel_while_waiting_for_headers(h1_upstream):
    upstream = h1_upstream(stall_before_headers(3))
    transport, _ = make_transport()
    cancel = CancelToken()
    threading.Timer(0.3, cancel.cancel).start()
    started = time.monotonic()
    with pytest.raises(RequestCancelled):
        transport.post_json(upstream.url, headers=HEADERS, body={}, model="m", cancel=cancel)
    assert time.monotonic() - started < 1.5
    assert upstream.attempts == 1
    assert upstream.disconnected.wait(6)


def test_cancel_before_start_sends_nothing(h1_upstream):
    upstream = h1_upstream(OK_JSON)
    transport, _ = make_transport()
    cancel = CancelToken()
    cancel.cancel()
    with pytest.raises(RequestCancelled):
        transport.post_json(upstream.url, headers=HEADERS, body={}, model="m", cancel=cancel)
    with pytest.raises(RequestCancelled):
        list(
            stream_sse(transport, upstream.url, headers=HEADERS, body={}, model="m", cancel=cancel)
        )
    assert upstream.attempts == 0


def test_cancel_interrupts_a_retry_wait(h1_upstream):
    upstream = h1_upstream(reply(429, "slow down", {"Retry-After": "20"}), OK_JSON)
    transport = Transport(policy=LOCAL)  # the real, interruptible wait
    cancel = CancelToken()
    threading.Timer(0.3, cancel.cancel).start()
    started = time.monotonic()
    with pytest.raises(RequestCancelled):
        transport.post_json(upstream.url, headers=HEADERS, body={}, model="m", cancel=cancel)
    assert time.monotonic() - started < 2
    assert upstream.attempts == 1


def test_a_finished_requests_token_cannot_cut_the_next_request(h1_upstream):
    upstream = h1_upstream(OK_JSON)
    transport, _ = make_transport()
    first = CancelToken()
    transport.post_json(upstream.url, headers=HEADERS, body={}, model="m", cancel=first)
    first.cancel()  # late: the pooled connection now belongs to nobody
    assert transport.post_json(upstream.url, headers=HEADERS, body={}, model="m")["id"]
    assert upstream.peers[0] == upstream.peers[1]  # same kept-alive connection, not cut


def test_the_data_chunks_of_a_chunked_body_are_decoded_without_h11(h1_upstream, monkeypatch):
    """h11 frames the head and the end of the message; the chunks between go through
    `ChunkedDecoder` (h11's per-chunk events were a tenth of a token's read), and the
    connection still goes back to the pool."""
    from providers import chunked

    fed: list[bytes] = []
    real_feed = chunked.ChunkedDecoder.feed

    def spy(self, data):
        fed.append(data)
        return real_feed(self, data)

    monkeypatch.setattr(chunked.ChunkedDecoder, "feed", spy)

    def step(handler, upstream):
        start_stream(handler)
        chunk(handler, EVENT_1)
        upstream.release.wait(5)  # the second chunk comes in a read of its own
        chunk(handler, EVENT_2)
        end_stream(handler)

    upstream = h1_upstream(step, stream(EVENT_1))
    transport, _ = make_transport()
    events = stream_sse(transport, upstream.url, headers=HEADERS, body={}, model="m")
    assert next(events).event == "message_start"
    upstream.release.set()
    assert [e.event for e in events] == ["message_stop"]
    assert any(EVENT_2 in data for data in fed)
    list(stream_sse(transport, upstream.url, headers=HEADERS, body={}, model="m"))
    assert len(set(upstream.peers)) == 1
