"""The one HTTP client every wire module uses: guarded, retrying, streaming, cancellable.

Every rule lives here once, in coroutines on an event loop: the SSRF-checked connect
(`AsyncGuardedTransport`), timeouts, error translation (`errors.error_from_response`),
retries, cancel and the streaming of Server-Sent Events (`astream_sse`) or raw body
chunks (`astream_bytes`). The blocking `post_json` (the seed's `complete()`) and the
wire clients' blocking `stream()` are derived from them by `providers.blocking`, which
runs the same coroutine on a private event loop: the engine's path, hundreds of turns on
one loop, is the one that must be fast, and the few blocking callers pay a thread
hand-off instead of a second copy of every rule.

This module is the single owner of retries (the wire modules never retry): retryable
statuses and connection failures are retried only while nothing has been handed to the
caller, so a reply is never duplicated. Redirects are never followed: a user-settable base
URL that redirects could otherwise lead the request (and its key) around the SSRF guard.

Cancel reaches the socket: a fired `CancelToken` (from any thread) cancels the read the
stream's task is awaiting, which closes the response and its connection, so the upstream
sees the disconnect at once.

Headers are never logged (they carry keys) and URLs are logged without their query.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import h11
import httpcore
import httpx

from . import blocking
from .cancel import CancelToken
from .chunked import ChunkedDecoder
from .errors import (
    OutboundBlockedError,
    ProviderError,
    RequestCancelled,
    StreamError,
    UpstreamUnavailableError,
    error_from_response,
    redact,
)
from .kept_connections import loop_keeper
from .outbound import AsyncGuardedTransport, OutboundPolicy
from .sse import SSEDecoder, SSEEvent, SSEProtocolError

# The statuses both official SDKs retry, plus Anthropic's 529 "overloaded".
RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
# Ceiling for one computed backoff step; Retry-After has its own cap.
MAX_BACKOFF_SECONDS = 8.0
# An error body is a message, not a payload: read this much of it at most.
MAX_ERROR_BODY_BYTES = 64 * 1024
# Non-streaming replies can carry images or long outputs; past this it is not a reply.
MAX_JSON_BODY_BYTES = 64 * 1024 * 1024
SENSITIVE_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "x-amz-security-token",
    }
)
# httpx logs every request URL at INFO, so a key must never travel in the query string.
SENSITIVE_QUERY_PARAMS = frozenset({"key", "api_key", "apikey", "access_token"})

logger = logging.getLogger(__name__)

# What one attempt's body becomes: `feed(chunk)` gives the items a read completes,
# `flush()` those left at the end of the body. A fresh pair per attempt.
Decoder = tuple[Callable[[bytes], Iterable[Any]], Callable[[], Iterable[Any]]]


class _AsyncCancelGuard:
    """A `CancelToken` reaching an awaited read: the token may fire from any thread, and
    while the stream's task is awaiting the network inside `section()` that await is
    cancelled (the task's own cancellation, counted back with `uncancel()`) and becomes
    `RequestCancelled`. Outside a section a fired token only makes `check()` raise: the
    task may be doing someone else's work between two reads, and must not be cancelled
    there."""

    def __init__(self, token: CancelToken | None) -> None:
        self.token = token
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._armed = False
        self._fired = False
        self._unregister = token.on_cancel(self._fire) if token is not None else None

    def _fire(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to wake
            self._loop.call_soon_threadsafe(self._cancel_awaiting)

    def _cancel_awaiting(self) -> None:
        if self._armed and not self._fired and self._task is not None:
            self._fired = True
            self._task.cancel()

    def check(self) -> None:
        if self.token is not None and self.token.cancelled:
            raise RequestCancelled()

    def section(self) -> _AsyncCancelGuard:
        """`with guard.section():` around an awaited read. The guard is its own context
        manager (not a `contextlib` generator): entered once per read of every stream."""
        self.check()
        self._armed = True
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        self._armed = False
        if kind is None or not issubclass(kind, asyncio.CancelledError) or not self._fired:
            return False
        self._fired = False
        if self._task is not None:
            self._task.uncancel()
        raise RequestCancelled() from None

    def close(self) -> None:
        if self._unregister is not None:
            self._unregister()
            self._unregister = None


def _error_from_body(
    response: httpx.Response,
    body: bytes,
    model: str,
    cancel: CancelToken | None,
    secrets: tuple[str, ...],
) -> ProviderError:
    if cancel is not None and cancel.cancelled:
        return RequestCancelled()
    return error_from_response(
        response.status_code,
        body[:MAX_ERROR_BODY_BYTES].decode("utf-8", errors="replace"),
        model=model,
        headers=dict(response.headers),
        secrets=secrets,
    )


def encode_body(body: Mapping[str, Any]) -> bytes:
    """Byte-stable JSON: the dict's own key order (prompt caches match on bytes)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _safe_url(url: str) -> str:
    parsed = httpx.URL(url)
    return str(parsed.copy_with(query=None, fragment=None, userinfo=b""))


@functools.lru_cache(maxsize=256)
def _parse_url(url: str) -> httpx.URL:
    """`url` parsed, or `OutboundBlockedError`. Base URLs are user-set: one that does not
    parse (`0177.0.0.1`, a backslash, a control character) is refused like any other bad
    target, as a typed error the engine turns into a friendly message, never a raw
    `httpx.InvalidURL`. The same string rules as the guard's, which only sees parsed URLs.

    Cached (an `httpx.URL` is immutable, and a refusal is raised again, never cached):
    every request of every turn parsed its endpoint's URL three times, ~60 µs each."""
    if "\\" in url or any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise OutboundBlockedError("backslashes, whitespace or control characters in the URL")
    try:
        return httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise OutboundBlockedError(f"not a valid URL: {exc}") from None


def _secrets(url: str, headers: Mapping[str, str]) -> tuple[str, ...]:
    """The key material of a request, for redaction. Refuses keys in the URL (they would
    be logged by httpx and kept in access logs): wire modules send keys as headers.
    Parses `url` first (`_parse_url`): every request method starts here."""
    for name in _parse_url(url).params:
        if name.lower() in SENSITIVE_QUERY_PARAMS:
            raise ValueError(f"send the {name!r} credential as a header, not in the URL")
    found: list[str] = []
    for name, value in headers.items():
        if name.lower() in SENSITIVE_HEADERS and value:
            found.append(value)
            _scheme, _, token = value.partition(" ")
            if token:
                found.append(token)
    return tuple(found)


def _request_headers(
    client: httpx.AsyncClient, headers: Mapping[str, str]
) -> list[tuple[str, str]]:
    """The client's default headers, then JSON's content type, then the call's own, a
    later name replacing an earlier one whatever its case (as `client.build_request`
    merged them, without building three `httpx.Headers` per request)."""
    merged: dict[str, tuple[str, str]] = {}
    for raw_name, raw_value in client.headers.raw:
        name = raw_name.decode("latin-1")
        merged[name.lower()] = (name, raw_value.decode("latin-1"))
    merged["content-type"] = ("Content-Type", "application/json")
    for name, value in headers.items():
        merged[name.lower()] = (name, value)
    return list(merged.values())


def _sse_decoder() -> Decoder:
    decoder = SSEDecoder()
    return decoder.feed, decoder.flush


def _chunk_decoder() -> Decoder:
    return (lambda chunk: (chunk,) if chunk else ()), tuple


def _whole_body_decoder() -> Decoder:
    """One item, the whole body, once it has all arrived (a JSON reply)."""
    body = bytearray()

    def feed(chunk: bytes) -> tuple[()]:
        body.extend(chunk)
        if len(body) > MAX_JSON_BODY_BYTES:
            raise ProviderError(f"the reply is larger than {MAX_JSON_BODY_BYTES} bytes")
        return ()

    return feed, lambda: (bytes(body),)


class Transport:
    """JSON-over-HTTP and streaming client for the wire modules, on the running event
    loop; `post_json` is its blocking face (see the module docstring).

    `read_timeout` is the read-idle timeout: the most seconds allowed between two reads,
    kept well under the SDKs' 600 s so a dead stream is noticed in minutes, not ten.
    At most `max_retries` retries (so `max_retries + 1` attempts) of retryable statuses and
    connection failures, only before anything was returned; Retry-After is honoured up to
    `retry_after_cap` seconds, and a longer one is raised at once with `retry_after` set.
    `sleep` replaces the retry wait in tests (a clock that records, and returns at once).

    Pooled connections belong to the event loop they were opened on, so there is one
    `httpx.AsyncClient` per loop that used this transport (in practice: the engine's, and
    the private loop of the blocking callers), each made on first use.
    """

    def __init__(
        self,
        *,
        policy: OutboundPolicy,
        connect_timeout: float = 10.0,
        read_timeout: float = 120.0,
        max_retries: int = 2,
        retry_after_cap: float = 30.0,
        backoff_base: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.read_timeout = read_timeout
        self.max_retries = max_retries
        self.retry_after_cap = retry_after_cap
        self.backoff_base = backoff_base
        self._sleep = sleep
        self._policy = policy
        self._timeout = httpx.Timeout(
            connect=connect_timeout, read=read_timeout, write=read_timeout, pool=connect_timeout
        )
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        self._clients_lock = threading.Lock()

    def post_json(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: dict[str, Any],
        model: str,
        cancel: CancelToken | None = None,
    ) -> dict[str, Any]:
        """`apost_json`, blocking (on the private loop of `providers.blocking`)."""
        return blocking.run(
            self.apost_json(url, headers=headers, body=body, model=model, cancel=cancel)
        )

    async def apost_json(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: dict[str, Any],
        model: str,
        cancel: CancelToken | None = None,
    ) -> dict[str, Any]:
        """POST `body` and return the JSON object answered. Raises a `ProviderError`.
        A failure while the body is read is retried like one before the headers (nothing
        has been returned yet)."""
        raw = b""
        stream = self._astream(
            url, headers, body, model, cancel, _whole_body_decoder, streaming=False
        )
        async with contextlib.aclosing(stream):
            async for whole in stream:  # one item: the body, once complete
                raw = whole
        try:
            data = json.loads(raw)
        except ValueError:
            snippet = raw[:200].decode("utf-8", errors="replace")
            raise ProviderError(
                redact(
                    f"the upstream answered with a body that is not JSON: {snippet}",
                    _secrets(url, headers),
                )
            ) from None
        if not isinstance(data, dict):
            raise ProviderError("the upstream answered with JSON that is not an object")
        return data

    def astream_sse(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: dict[str, Any],
        model: str,
        cancel: CancelToken | None = None,
    ) -> AsyncIterator[SSEEvent]:
        """POST `body` and yield its Server-Sent Events as they arrive (nothing is sent
        before the first `__anext__`; `aclose()` releases the connection at once).

        Raises `StreamError` when the connection fails mid-stream; whether the stream
        ended with its terminal event is for the caller (the wire module) to judge.
        The generator is `_astream`'s own, not a wrapper of it: one generator hop fewer
        for every event of every turn.
        """
        request_headers = {"Accept": "text/event-stream", **headers}
        return self._astream(url, request_headers, body, model, cancel, _sse_decoder)

    def astream_bytes(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: dict[str, Any],
        model: str,
        cancel: CancelToken | None = None,
    ) -> AsyncIterator[bytes]:
        """POST `body` and yield the raw response body chunks as they arrive.

        For streams that are not SSE (Bedrock's binary event stream): framing is the
        caller's. Same retry and cancel rules as `astream_sse`. The request body is
        `encode_body(body)`, so a caller that signs the body signs those bytes.
        """
        return self._astream(url, headers, body, model, cancel, _chunk_decoder)

    async def _astream(
        self,
        url: str,
        headers: Mapping[str, str],
        body: dict[str, Any],
        model: str,
        cancel: CancelToken | None,
        new_decoder: Callable[[], Decoder],
        *,
        streaming: bool = True,
    ) -> AsyncIterator[Any]:
        """POST and yield what a fresh decoder (per attempt) makes of the body: retried
        only while nothing has been yielded; cancel reaches an awaited read. A body read
        whole (`streaming=False`) that fails is "unavailable", not "lost mid-stream"."""
        content = encode_body(body)
        secrets = _secrets(url, headers)
        guard = _AsyncCancelGuard(cancel)
        attempt = 0
        try:
            while True:
                yielded = False
                try:
                    async with self._aexchange(
                        url, headers, content, model, guard, secrets
                    ) as response:
                        feed, flush = new_decoder()
                        async for chunk in self._abody_chunks(
                            response, guard, secrets, mid_stream=streaming
                        ):
                            for item in feed(chunk):
                                guard.check()
                                yielded = True
                                yield item
                        for item in flush():
                            yielded = True
                            yield item
                    return
                except SSEProtocolError as exc:
                    raise StreamError(str(exc)) from None
                except ProviderError as error:
                    if yielded:
                        raise
                    attempt = await self._abefore_retry(error, attempt, url, guard)
        finally:
            guard.close()

    def close(self) -> None:
        """Release the blocking callers' connections (they live on the private loop).
        A caller on an event loop uses `aclose`, which also closes that loop's."""
        loop = blocking.running_loop_if_started()
        with self._clients_lock:
            client = self._clients.pop(loop, None) if loop is not None else None
        if client is not None:
            blocking.run(client.aclose())

    async def aclose(self) -> None:
        """Close this loop's connections, then the blocking callers' ones (awaited, not
        blocked on)."""
        loop = asyncio.get_running_loop()
        private = blocking.running_loop_if_started()
        with self._clients_lock:
            own = self._clients.pop(loop, None)
            other = self._clients.pop(private, None) if private not in (None, loop) else None
        if own is not None:
            await own.aclose()
        if other is not None and private is not None:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(other.aclose(), private))

    def _async_client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = httpx.AsyncClient(
                transport=AsyncGuardedTransport(self._policy, shared_pool=loop_keeper()),
                timeout=self._timeout,
                follow_redirects=False,
                trust_env=False,
            )
            with self._clients_lock:
                self._clients[loop] = client
        return client

    @contextlib.asynccontextmanager
    async def _aexchange(
        self,
        url: str,
        headers: Mapping[str, str],
        content: bytes,
        model: str,
        guard: _AsyncCancelGuard,
        secrets: tuple[str, ...],
    ) -> AsyncIterator[httpx.Response]:
        """One HTTP attempt: a 2xx response with its body unread, or a raised error."""
        client = self._async_client()
        response: httpx.Response | None = None
        try:
            request = httpx.Request(
                "POST",
                _parse_url(url),
                headers=_request_headers(client, headers),
                content=content,
                extensions={"timeout": self._timeout.as_dict()},
            )
            try:
                with guard.section():
                    # The client's transport itself (the guard, then the pool): what
                    # `client.send` adds is for features no provider call uses (auth
                    # flows, redirects, a cookie jar, event hooks), and cost a fifth of a
                    # request's CPU. No jar also means no upstream's cookie is kept.
                    response = await client._transport.handle_async_request(request)
                    response.request = request
            except Exception as exc:
                raise self._failure(exc, guard.token, secrets, mid_stream=False) from None
            if not response.is_success:
                raise await self._astatus_error(response, model, guard, secrets)
            yield response
        finally:
            if response is not None:
                await response.aclose()

    async def _abody_chunks(
        self,
        response: httpx.Response,
        guard: _AsyncCancelGuard,
        secrets: tuple[str, ...],
        *,
        mid_stream: bool,
    ) -> AsyncIterator[bytes]:
        raw = _http11_body(response)
        if raw is None:
            chunks = response.aiter_bytes().__aiter__()
            while True:
                try:
                    with guard.section():
                        chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except Exception as exc:
                    raise self._failure(exc, guard.token, secrets, mid_stream=mid_stream) from None
                yield chunk
            guard.check()
            return
        # The lean reader (see `_http11_body`): httpcore's `_receive_response_body` and
        # `_receive_event` flattened into this generator, `Data` payloads until
        # `EndOfMessage`, the guard armed around each read that waits on the network.
        state, network, timeout = raw
        try:
            while True:
                event = state.next_event()
                while event is h11.NEED_DATA:
                    if _at_chunk_boundary(state):
                        # From here the data chunks are decoded here, and h11 gets the
                        # bytes from the last chunk on (`providers/chunked.py`).
                        decoder = ChunkedDecoder()
                        while decoder.rest is None:
                            with guard.section():
                                data = await network.read(READ_NUM_BYTES, timeout=timeout)
                            if not data:
                                raise h11.RemoteProtocolError(
                                    "peer closed connection without sending complete "
                                    "message body (incomplete chunked read)"
                                )
                            for piece in decoder.feed(data):
                                yield piece
                            decoder.check()  # a broken frame after them
                        state.receive_data(decoder.rest)
                        event = state.next_event()
                        continue
                    with guard.section():
                        data = await network.read(READ_NUM_BYTES, timeout=timeout)
                    if not data and state.their_state is h11.SEND_RESPONSE:
                        raise httpcore.RemoteProtocolError(
                            "Server disconnected without sending a response."
                        )
                    state.receive_data(data)
                    event = state.next_event()
                if type(event) is h11.Data:
                    yield bytes(event.data)
                elif type(event) is h11.EndOfMessage or event is h11.PAUSED:
                    break
        except Exception as exc:
            raise self._failure(exc, guard.token, secrets, mid_stream=mid_stream) from None
        guard.check()

    async def _astatus_error(
        self,
        response: httpx.Response,
        model: str,
        guard: _AsyncCancelGuard,
        secrets: tuple[str, ...],
    ) -> ProviderError:
        body = bytearray()
        try:
            with guard.section():
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) >= MAX_ERROR_BODY_BYTES:
                        break
        except httpx.HTTPError:
            pass  # a partial error body still says something
        return _error_from_body(response, bytes(body), model, guard.token, secrets)

    async def _abefore_retry(
        self, error: ProviderError, attempt: int, url: str, guard: _AsyncCancelGuard
    ) -> int:
        """Wait before the next attempt and return its number, or re-raise `error`."""
        delay = self._retry_delay(error, attempt, url)
        if self._sleep is not time.sleep:
            self._sleep(delay)  # a test's clock
        else:
            with guard.section():
                await asyncio.sleep(delay)
        guard.check()
        return attempt + 1

    def _failure(
        self,
        exc: Exception,
        cancel: CancelToken | None,
        secrets: tuple[str, ...],
        *,
        mid_stream: bool,
    ) -> Exception:
        """The ProviderError for an exception raised while talking to the upstream."""
        if cancel is not None and cancel.cancelled:
            return RequestCancelled()
        if isinstance(exc, ProviderError):
            return exc
        if not isinstance(
            exc,
            (httpx.HTTPError, httpcore.NetworkError, httpcore.TimeoutException, h11.ProtocolError),
        ):
            return exc
        detail = redact(str(exc) or type(exc).__name__, secrets)
        if isinstance(exc, (httpx.TimeoutException, httpcore.TimeoutException)):
            if mid_stream:
                return StreamError(f"no data from the upstream for {self.read_timeout:g} s")
            return UpstreamUnavailableError(f"timed out: {detail}")
        if mid_stream:
            return StreamError(f"the connection was lost mid-stream: {detail}")
        return UpstreamUnavailableError(detail)

    def _retry_delay(self, error: ProviderError, attempt: int, url: str) -> float:
        """How long to wait before retrying after `error`, or re-raise it."""
        if not self._retryable(error) or attempt >= self.max_retries:
            raise error
        if error.retry_after is not None:
            if error.retry_after > self.retry_after_cap:
                raise error
            delay = error.retry_after
        else:
            step = min(MAX_BACKOFF_SECONDS, self.backoff_base * 2**attempt)
            delay = step * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not a secret
        logger.info(
            "provider request to %s failed (%s %s); retry %d of %d in %.2f s",
            _safe_url(url),
            error.kind,
            error.status or "-",
            attempt + 1,
            self.max_retries,
            delay,
        )
        return delay

    @staticmethod
    def _retryable(error: ProviderError) -> bool:
        if isinstance(error, RequestCancelled) or not error.retryable:
            return False
        if error.status is not None:
            return error.status in RETRY_STATUSES
        return isinstance(error, (UpstreamUnavailableError, StreamError))


# -- the lean body reader -------------------------------------------------------------
#
# A streamed reply is one small read per token, hundreds of streams on one loop (the
# engine's). httpx hands a body over through six nested async generators (Response,
# BoundAsyncStream, AsyncResponseStream with an exception-mapping context manager per
# chunk, httpcore's PoolByteStream and HTTP11ConnectionByteStream, its body loop), each
# a hop per read: more than a third of the cost of reading a token
# (bench/stream_path.py --mode embedded, docs/PERFORMANCE.md). For a plain HTTP/1.1
# body (no Content-Encoding) the transport runs httpcore's own body loop itself, on the
# same h11 state and network stream: the same framing checks and errors, and the
# connection is released by `response.aclose()` exactly as before (back to the pool
# when h11 saw the whole body). Anything else (a compressed body, another httpx or
# httpcore layout) takes httpx's path.

# httpcore's read size for a body (`AsyncHTTP11Connection.READ_NUM_BYTES`).
READ_NUM_BYTES = 64 * 1024


try:  # h11's reader class, to know where it stands (private: checked, never required)
    from h11._readers import ChunkedReader as _H11_CHUNKED_READER
except ImportError:  # pragma: no cover - another h11 layout: h11 reads every chunk
    _H11_CHUNKED_READER = None


def _at_chunk_boundary(state: h11.Connection) -> bool:
    """h11 is reading a chunked body, between two chunks, with nothing buffered: the
    point from which `ChunkedDecoder` can take over the data chunks. False for anything
    else (a Content-Length body, a chunk half read, another h11 layout): h11 goes on."""
    reader = getattr(state, "_reader", None)
    return (
        _H11_CHUNKED_READER is not None
        and type(reader) is _H11_CHUNKED_READER
        and getattr(reader, "_bytes_in_chunk", None) == 0
        and getattr(reader, "_bytes_to_discard", None) == b""
        and getattr(reader, "_reading_trailer", None) is False
        and not state.trailing_data[0]
    )


def _http11_body(response: httpx.Response) -> tuple[Any, Any, float | None] | None:
    """(h11 connection, network stream, read timeout) under a streamed HTTP/1.1 response
    whose body bytes are the payload, or None when that is not what httpx built."""
    if response.headers.get("content-encoding", "identity").strip().lower() != "identity":
        return None
    # httpx's response stream, under the client's `BoundAsyncStream` when the client sent
    # the request, or as the transport returned it (`Transport._aexchange`).
    stream = getattr(response.stream, "_stream", response.stream)
    pool_stream = getattr(stream, "_httpcore_stream", None)
    body = getattr(pool_stream, "_stream", None)
    connection = getattr(body, "_connection", None)
    state = getattr(connection, "_h11_state", None)
    network = getattr(connection, "_network_stream", None)
    request = getattr(body, "_request", None)
    if not isinstance(state, h11.Connection) or network is None or request is None:
        return None
    if getattr(pool_stream, "_closed", True) or getattr(body, "_closed", True):
        return None
    timeout = request.extensions.get("timeout", {}).get("read")
    return state, network, timeout
