"""The threaded HTTP/1.1 server under every fake provider, and its wire mechanics.

`FakeServer` binds 127.0.0.1 on an ephemeral port, serves each connection on its own
daemon thread, records every request and every client disconnect, and plays scripted
replies (`tests.fakes.script`) through a provider-specific `Renderer` that turns
neutral steps into that API's events. Subclasses (`OpenAIChatFake`,
`AnthropicMessagesFake`) only route requests, validate them and render.

SSE framing is what real providers send: `Content-Type: text/event-stream`, one write
and flush per event, chunked transfer encoding (so `truncate` can end the body cleanly
without the terminal event, and `reset` can tear the socket down mid-chunk). The
`framing="close"` option delimits the body by closing the connection instead.

Control endpoints under `/_fake/` let another process script the fake and read what it
saw (the subprocess mode beside Celery and Daphne); they are never recorded.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Protocol

from .script import (
    Drip,
    ErrorEvent,
    HttpError,
    Pause,
    Reasoning,
    Reply,
    Reset,
    Script,
    Step,
    Text,
    ToolCall,
    Truncate,
    Usage,
)

HOST = "127.0.0.1"
# Benches open hundreds of streams at once; the stdlib default backlog of 5 would make
# the kernel drop SYNs and the clients retry after a second.
LISTEN_BACKLOG = 1024
# How often a sleeping stream wakes to notice the server stopping.
STOP_POLL_SECONDS = 0.1
# Characters per token for the default usage estimate (the usual rule of thumb).
CHARS_PER_TOKEN = 4
CONTROL_PREFIX = "/_fake/"
# Tool arguments arrive in a few pieces: enough to prove a client reassembles them.
ARGUMENT_FRAGMENTS = 4
TOKEN_RE = re.compile(r"\s*\S+\s*|\s+")

Event = tuple[str | None, dict[str, Any] | str]
"""One SSE event: (event name or None, data as a JSON-able dict or a raw string)."""


def reply_texts(reply: Reply) -> tuple[str, str]:
    """(output text incl. tool arguments, reasoning text) the reply will produce."""
    output: list[str] = []
    thinking: list[str] = []
    for step in reply.steps:
        if isinstance(step, Text):
            output.append(step.text)
        elif isinstance(step, Reasoning):
            thinking.append(step.text)
        elif isinstance(step, ToolCall):
            output.append(tool_arguments_text(step))
    return "".join(output), "".join(thinking)


def tool_arguments_text(step: ToolCall) -> str:
    if step.raw_arguments is not None:
        return step.raw_arguments
    return json.dumps(step.arguments)


def pieces(value: str) -> list[str]:
    """Split text into word-sized deltas (each word keeps its trailing whitespace)."""
    return TOKEN_RE.findall(value) or [value]


def fragments(value: str, count: int = ARGUMENT_FRAGMENTS) -> list[str]:
    """Split tool-call arguments into `count` roughly equal fragments, as APIs stream them."""
    if not value:
        return []
    size = max(1, math.ceil(len(value) / count))
    return [value[i : i + size] for i in range(0, len(value), size)]


class ClientGone(Exception):
    """The client closed the connection while we were still answering."""


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: Any  # parsed JSON, or None when absent or not JSON
    raw: bytes = field(repr=False)
    index: int = 0
    # Every header line as sent, in order: `headers` keeps one value per name.
    header_lines: list[tuple[str, str]] = field(default_factory=list, repr=False)

    def header_count(self, name: str) -> int:
        """How many times the header `name` (any case) was sent."""
        return sum(1 for line, _ in self.header_lines if line.lower() == name.lower())

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["raw"] = self.raw.decode("utf-8", "replace")
        return data


@dataclass
class Disconnect:
    """A client that went away before the response was complete."""

    path: str
    request_index: int
    events_sent: int
    at: float


@dataclass(frozen=True)
class ResolvedUsage:
    """Usage with every bucket decided: what the renderer writes on the wire."""

    input: int
    output: int
    cache_read: int = 0
    cache_write: int = 0
    reasoning: int | None = None


class Renderer(Protocol):
    """Turns one reply's neutral steps into one API's wire format (one per request)."""

    def start_events(self) -> list[Event]: ...

    def step_events(self, step: Step) -> list[Event]: ...

    def error_events(self, step: ErrorEvent) -> list[Event]: ...

    def finish_events(self) -> list[Event]: ...

    def message(self) -> dict[str, Any]: ...


class Exchange:
    """One request and its response on the wire: the only code that touches the socket."""

    def __init__(
        self, fake: FakeServer, handler: _Handler, request: RecordedRequest, framing: str
    ) -> None:
        self.fake = fake
        self.request = request
        self.delay = 0.0
        self.events_sent = 0
        self._handler = handler
        self._sock: socket.socket = handler.connection
        self._framing = framing
        self._done = False

    # -- plain responses ------------------------------------------------------------

    def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self.send_bytes(status, json.dumps(body).encode(), "application/json", headers)

    def send_bytes(
        self,
        status: int,
        payload: bytes,
        content_type: str,
        headers: dict[str, str] | None = None,
        *,
        declared_length: int | None = None,
    ) -> None:
        """`declared_length` larger than the payload scripts a truncated body."""
        handler = self._handler
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(declared_length or len(payload)))
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.end_headers()
        self._write(payload)
        if declared_length is not None:
            self.close()

    # -- streams --------------------------------------------------------------------

    def start_stream(self, headers: dict[str, str] | None = None) -> None:
        handler = self._handler
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
        handler.send_header("Cache-Control", "no-cache")
        if self._framing == "chunked":
            handler.send_header("Transfer-Encoding", "chunked")
        else:
            handler.send_header("Connection", "close")
            handler.close_connection = True
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.end_headers()

    def send_event(self, data: dict[str, Any] | str, event: str | None = None) -> None:
        """Write one SSE event and flush it, after the per-event delay."""
        if self.events_sent and self.delay > 0:
            self.sleep(self.delay)
        elif self.client_gone():
            self._record_disconnect()
        payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
        frame = (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"
        self._write_chunk(frame.encode())
        self.events_sent += 1

    def send_events(self, events: Iterable[Event]) -> None:
        for name, data in events:
            self.send_event(data, name)

    def end_stream(self) -> None:
        """End the body cleanly (whether or not the terminal event was sent)."""
        if self._framing == "chunked":
            self._write(b"0\r\n\r\n")
        else:
            self.close()
        self._done = True

    # -- faults and pacing ----------------------------------------------------------

    def reset(self) -> None:
        """Abort with a TCP RST: SO_LINGER 0 makes close() discard and reset."""
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close()

    def close(self) -> None:
        self._handler.close_connection = True
        with contextlib.suppress(OSError):
            self._sock.close()
        self._done = True

    def sleep(self, seconds: float) -> None:
        """Sleep while watching the socket, so a client that leaves is seen at once."""
        deadline = time.monotonic() + seconds
        while True:
            if self.client_gone():
                self._record_disconnect()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if self.fake.stopping.is_set():
                raise ClientGone("server stopping")
            with contextlib.suppress(OSError, ValueError):
                select.select([self._sock], [], [], min(remaining, STOP_POLL_SECONDS))

    def client_gone(self) -> bool:
        """True when the peer has closed (EOF or RST is waiting on the socket)."""
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
            if not readable:
                return False
            return self._sock.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # -- internals ------------------------------------------------------------------

    def _write_chunk(self, payload: bytes) -> None:
        if self._framing == "chunked":
            payload = f"{len(payload):x}\r\n".encode() + payload + b"\r\n"
        self._write(payload)

    def _write(self, payload: bytes) -> None:
        try:
            self._handler.wfile.write(payload)
            self._handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self._record_disconnect()

    def _record_disconnect(self) -> None:
        self._handler.close_connection = True
        if not self._done:
            self.fake._record_disconnect(
                Disconnect(self.request.path, self.request.index, self.events_sent, time.time())
            )
        raise ClientGone(self.request.path)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # Never join handler threads on close: a stream sleeping in a long pause must not
    # hold up stop(); stop() shuts their sockets instead.
    block_on_close = False
    request_queue_size = LISTEN_BACKLOG
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], fake: FakeServer) -> None:
        self.fake = fake
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients dropping idle keep-alive connections is normal, not worth a traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError) or self.fake.stopping.is_set():
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeProvider/1.0"
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.fake._track(self.connection, add=True)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.server.fake._track(self.connection, add=False)

    def do_GET(self) -> None:
        self.server.fake._dispatch(self)

    def do_POST(self) -> None:
        self.server.fake._dispatch(self)

    def do_DELETE(self) -> None:
        self.server.fake._dispatch(self)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: hundreds of bench streams would flood the test output."""


class FakeServer:
    """A scripted provider on 127.0.0.1; use as a context manager or start()/stop().

    `requests` and `disconnects` are appended from handler threads (list appends are
    atomic); `disconnected` is set on the first client disconnect. `usage_for` may be
    given to replace the default chars/4 estimate. `simulate_cache=True` reports prompt
    caching the way the provider does (`cached_usage`, per subclass): opt-in per instance,
    so every other test keeps the plain estimate.
    """

    # Path prefix of the API under the root URL; `base_url` is what the SDK expects.
    api_prefix = ""
    provider = "fake"

    def __init__(
        self,
        *,
        script: Script | None = None,
        api_key: str | None = "test-key",
        delay: float = 0.0,
        validate: bool = True,
        models: Iterable[str] | None = None,
        usage_for: Callable[[RecordedRequest, str], Usage] | None = None,
        framing: str = "chunked",
        port: int = 0,
        simulate_cache: bool = False,
    ) -> None:
        if framing not in ("chunked", "close"):
            raise ValueError("framing is 'chunked' or 'close'")
        self.script = script if script is not None else Script()
        self.api_key = api_key
        self.delay = delay
        self.validate = validate
        self.models = set(models) if models is not None else None
        self.framing = framing
        self.requests: list[RecordedRequest] = []
        self.disconnects: list[Disconnect] = []
        self.disconnected = threading.Event()
        self.stopping = threading.Event()
        self._usage_hook = usage_for
        self.simulate_cache = simulate_cache
        # Handler threads answer concurrently; the prefix cache is read and written as one.
        self._cache_lock = threading.Lock()
        self._port = port
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> FakeServer:
        self._httpd = _HTTPServer((HOST, self._port), self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-{self.provider}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            live = list(self._sockets)
        for sock in live:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("server not started")
        return int(self._httpd.server_address[1])

    @property
    def root_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def base_url(self) -> str:
        """The base URL the provider's SDK (and our client) is configured with."""
        return self.root_url + self.api_prefix

    # -- scripting and inspection ---------------------------------------------------

    def push(self, *replies: Reply | Step) -> None:
        self.script.push(*replies)

    @property
    def last_request(self) -> RecordedRequest:
        return self.requests[-1]

    def wait_for_disconnect(self, timeout: float = 5.0) -> bool:
        return self.disconnected.wait(timeout)

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while len(self.requests) < count:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def usage_for(self, request: RecordedRequest, output_text: str) -> Usage:
        """Usage when the reply scripts none: chars/4 of the prompt and of the output.

        The hook for prefix-cache simulation: override, or pass `usage_for=`.
        """
        if self._usage_hook is not None:
            return self._usage_hook(request, output_text)
        body = request.body if isinstance(request.body, dict) else {}
        if self.simulate_cache:
            with self._cache_lock:
                return self.cached_usage(body, output_text)
        prompt = json.dumps(self.prompt_parts(body), sort_keys=True)
        return Usage(
            input=max(1, math.ceil(len(prompt) / CHARS_PER_TOKEN)),
            output=max(1, math.ceil(len(output_text) / CHARS_PER_TOKEN)),
        )

    def resolve_usage(self, request: RecordedRequest, reply: Reply) -> ResolvedUsage:
        """The usage to report: the scripted step, its gaps filled by `usage_for`.

        Called once per reply, before the first event (Anthropic reports input tokens in
        `message_start`), so a stateful cache simulation sees each request once.
        """
        output_text, reasoning_text = reply_texts(reply)
        estimate = self.usage_for(request, output_text + reasoning_text)
        scripted = reply.usage or estimate
        reasoning = scripted.reasoning
        if reasoning is None and reasoning_text:
            reasoning = max(1, math.ceil(len(reasoning_text) / CHARS_PER_TOKEN))
        return ResolvedUsage(
            input=scripted.input if scripted.input is not None else estimate.input or 0,
            output=scripted.output if scripted.output is not None else estimate.output or 0,
            cache_read=scripted.cache_read,
            cache_write=scripted.cache_write,
            reasoning=reasoning,
        )

    # -- prompt-cache simulation ------------------------------------------------------

    def cached_usage(self, body: dict[str, Any], output_text: str) -> Usage:
        """Usage with this provider's prompt caching applied to `body`, updating the cache.

        Called under the cache lock, once per model request. Subclasses that simulate
        caching override it together with `reset_cache`.
        """
        raise NotImplementedError(f"{type(self).__name__} does not simulate prompt caching")

    def reset_cache(self) -> None:
        """Forget every cached prefix (also done by POST /_fake/clear)."""

    @staticmethod
    def output_tokens(output_text: str) -> int:
        return max(1, math.ceil(len(output_text) / CHARS_PER_TOKEN))

    # -- subclass interface ---------------------------------------------------------

    def prompt_parts(self, body: dict[str, Any]) -> list[Any]:
        """The parts of a request body that count as prompt (for the usage estimate)."""
        return [body.get("system"), body.get("messages"), body.get("tools")]

    def handle(self, exchange: Exchange) -> None:
        raise NotImplementedError

    def play(
        self,
        exchange: Exchange,
        reply: Reply,
        renderer: Renderer,
        *,
        stream: bool,
        error_response: Callable[[HttpError], tuple[int, Any, dict[str, str]]],
        headers: dict[str, str] | None = None,
    ) -> None:
        """Play `reply` through `renderer`: the fault and pacing semantics live here."""
        if reply.http_error is not None:
            status, body, headers = error_response(reply.http_error)
            if isinstance(body, str):
                exchange.send_bytes(status, body.encode(), "text/html; charset=utf-8", headers)
            else:
                exchange.send_json(status, body, headers)
            return
        exchange.delay = self.delay if reply.delay is None else reply.delay
        if stream:
            exchange.start_stream(headers)
            exchange.send_events(renderer.start_events())
        for step in reply.steps:
            if isinstance(step, Drip):
                exchange.delay = step.seconds
            elif isinstance(step, Pause):
                exchange.sleep(step.seconds)
            elif isinstance(step, Reset):
                exchange.reset()
                return
            elif isinstance(step, Truncate):
                if stream:
                    exchange.end_stream()
                else:
                    payload = json.dumps(renderer.message()).encode()
                    exchange.send_bytes(
                        200,
                        payload[: len(payload) // 2],
                        "application/json",
                        declared_length=len(payload),
                    )
                return
            elif isinstance(step, ErrorEvent):
                if stream:
                    exchange.send_events(renderer.error_events(step))
                    exchange.end_stream()
                else:
                    kind_error = HttpError(None, kind=step.kind, message=step.message)
                    status, body, headers = error_response(kind_error)
                    exchange.send_json(status, body, headers)
                return
            elif not isinstance(step, Usage):
                events = renderer.step_events(step)
                if stream:
                    exchange.send_events(events)
        if stream:
            exchange.send_events(renderer.finish_events())
            exchange.end_stream()
        else:
            exchange.send_json(200, renderer.message(), headers)

    # -- dispatch -------------------------------------------------------------------

    def _dispatch(self, handler: _Handler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
        path = handler.path.split("?", 1)[0]
        headers = {name.lower(): value for name, value in handler.headers.items()}
        request = RecordedRequest(
            handler.command, path, headers, body, raw, header_lines=list(handler.headers.items())
        )
        exchange = Exchange(self, handler, request, self.framing)
        try:
            if path.startswith(CONTROL_PREFIX):
                self._control(exchange)
                return
            with self._lock:
                request.index = len(self.requests)
                self.requests.append(request)
            self.handle(exchange)
        except ClientGone:
            handler.close_connection = True

    def _control(self, exchange: Exchange) -> None:
        request = exchange.request
        name = request.path[len(CONTROL_PREFIX) :]
        if name == "requests" and request.method == "GET":
            exchange.send_json(200, [r.to_json() for r in self.requests])
        elif name == "disconnects" and request.method == "GET":
            exchange.send_json(200, [asdict(d) for d in self.disconnects])
        elif name == "script" and request.method == "POST":
            try:
                pushed = Script.from_json(request.body if request.body is not None else [])
            except (TypeError, ValueError) as exc:
                exchange.send_json(400, {"error": str(exc)})
                return
            while len(pushed):
                self.script.push(pushed.next_reply(""))
            if isinstance(request.body, dict) and request.body.get("default") is not None:
                self.script.default = pushed.default
            exchange.send_json(200, {"queued": len(self.script)})
        elif name == "clear" and request.method == "POST":
            with self._lock:
                self.requests.clear()
                self.disconnects.clear()
            self.disconnected.clear()
            self.script.clear()
            with self._cache_lock:
                self.reset_cache()
            exchange.send_json(200, {"cleared": True})
        else:
            exchange.send_json(404, {"error": f"no control endpoint {request.path}"})

    def _record_disconnect(self, disconnect: Disconnect) -> None:
        with self._lock:
            self.disconnects.append(disconnect)
        self.disconnected.set()

    def _track(self, sock: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._sockets.add(sock)
            else:
                self._sockets.discard(sock)
