"""The one HTTP client every wire module uses: guarded, retrying, streaming, cancellable.

This module is the single owner of retries (the wire modules never retry): retryable
statuses and connection failures are retried only while nothing has been handed to the
caller, so a reply is never duplicated. Redirects are never followed: a user-settable base
URL that redirects could otherwise lead the request (and its key) around the SSRF guard.

Cancel reaches the socket. httpx has no way to interrupt a read blocked in another thread,
and closing a socket does not wake such a read on Linux; shutting it down does. So the
connection pool runs on a network backend whose streams register themselves with the
request that is using them, and a fired `CancelToken` shuts that socket down: the blocked
read returns at once and the upstream sees the disconnect.

Headers are never logged (they carry keys) and URLs are logged without their query.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Any

import httpcore
import httpx

from .cancel import CancelToken
from .errors import (
    OutboundBlockedError,
    ProviderError,
    RequestCancelled,
    StreamError,
    UpstreamUnavailableError,
    error_from_response,
    redact,
)
from .outbound import AsyncGuardedTransport, GuardedTransport, OutboundPolicy
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
_current = threading.local()


class _Abort:
    """The connection one request is using, so that another thread can cut it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stream: _AbortableStream | None = None
        self._fired = False
        self._done = False

    def attach(self, stream: _AbortableStream) -> None:
        with self._lock:
            if self._done:
                return
            self._stream = stream
            stream.owner = self
            fired = self._fired
        if fired:
            stream.abort()

    def fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self._fired = True
            stream = self._stream
        if stream is not None and stream.owner is self:
            stream.abort()

    def detach(self) -> None:
        """The request is over; its connection may now serve another one."""
        with self._lock:
            self._done = True
            self._stream = None


class _AbortableStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner
        self.owner: _Abort | None = None
        self._claim()

    def _claim(self) -> None:
        abort = getattr(_current, "abort", None)
        if abort is not None and self.owner is not abort:
            abort.attach(self)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._claim()
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._claim()
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        return _AbortableStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)

    def abort(self) -> None:
        sock = self._inner.get_extra_info("socket")
        if sock is None:
            return
        with contextlib.suppress(OSError):
            # socket.socket's own shutdown: SSLSocket.shutdown would also drop its TLS
            # state under the feet of the thread that is reading.
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _AbortableBackend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _AbortableStream(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("unix sockets are not used for provider requests")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


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

    @contextlib.contextmanager
    def section(self) -> Iterator[None]:
        self.check()
        self._armed = True
        try:
            yield
        except asyncio.CancelledError:
            if not self._fired:
                raise
            self._fired = False
            if self._task is not None:
                self._task.uncancel()
            raise RequestCancelled() from None
        finally:
            self._armed = False

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


def _parse_url(url: str) -> httpx.URL:
    """`url` parsed, or `OutboundBlockedError`. Base URLs are user-set: one that does not
    parse (`0177.0.0.1`, a backslash, a control character) is refused like any other bad
    target, as a typed error the engine turns into a friendly message, never a raw
    `httpx.InvalidURL`. The same string rules as the guard's, which only sees parsed URLs."""
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


class Transport:
    """Blocking JSON-over-HTTP and SSE client for the wire modules.

    `read_timeout` is the read-idle timeout: the most seconds allowed between two reads,
    kept well under the SDKs' 600 s so a dead stream is noticed in minutes, not ten.
    At most `max_retries` retries (so `max_retries + 1` attempts) of retryable statuses and
    connection failures, only before anything was returned; Retry-After is honoured up to
    `retry_after_cap` seconds, and a longer one is raised at once with `retry_after` set.
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
        # Each client is made on first use: a turn reads on the event loop and never
        # needs the blocking one (and 200 turns' unused pools add up).
        self._sync_client: httpx.Client | None = None
        self._sync_lock = threading.Lock()
        self._aclient: httpx.AsyncClient | None = None

    @property
    def _client(self) -> httpx.Client:
        with self._sync_lock:
            if self._sync_client is None:
                self._sync_client = httpx.Client(
                    transport=GuardedTransport(self._policy, network_backend=_AbortableBackend()),
                    timeout=self._timeout,
                    follow_redirects=False,
                    trust_env=False,
                )
            return self._sync_client

    def post_json(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: dict[str, Any],
        model: str,
        cancel: CancelToken | None = None,
    ) -> dict[str, Any]:
        """POST `body` and return the JSON object answered. Raises a `ProviderError`."""
        content = encode_body(body)
        secrets = _secrets(url, headers)
        attempt = 0
        while True:
            try:
                with self._exchange(url, headers, content, model, cancel, secrets) as response:
                    raw = self._read_body(response, cancel, secrets)
                break
            except ProviderError as error:
                attempt = self._before_retry(error, attempt, url, cancel)
        try:
            data = json.loads(raw)
        except ValueError:
            snippet = raw[:200].decode("utf-8", errors="replace")
            raise ProviderError(
                redact(f"the upstream answered with a body that is not JSON: {snippet}", secrets)
            ) from None
        if not isinstance(data, dict):
            raise ProviderError("the upstream answered with JSON that is not an object")
        return data

    def stream_sse(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: dict[str, Any],
        model: str,
        cancel: CancelToken | None = None,
    ) -> Iterator[SSEEvent]:
        """POST `body` and yield its Server-Sent Events as they arrive.

        Raises `StreamError` when the connection fails mid-stream; whether the stream
        ended with its terminal event is for the caller (the wire module) to judge.
        """
        content = encode_body(body)
        secrets = _secrets(url, headers)
        request_headers = {"Accept": "text/event-stream", **headers}
        attempt = 0
        while True:
            yielded = False
            try:
                with self._exchange(
                    url, request_headers, content, model, cancel, secrets
                ) as response:
                    decoder = SSEDecoder()
                    for chunk in self._body_chunks(response, cancel, secrets):
                        for event in decoder.feed(chunk):
                            if cancel is not None and cancel.cancelled:
                                raise RequestCancelled()
                            yielded = True
                            yield event
                    decoder.flush()
                return
            except SSEProtocolError as exc:
                raise StreamError(str(exc)) from None
            except ProviderError as error:
                if yielded:
                    raise
                attempt = self._before_retry(error, attempt, url, cancel)

    def stream_bytes(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: dict[str, Any],
        model: str,
        cancel: CancelToken | None = None,
    ) -> Iterator[bytes]:
        """POST `body` and yield the raw response body chunks as they arrive.

        For streams that are not SSE (Bedrock's binary event stream): framing is the
        caller's. Same retry and cancel rules as `stream_sse`: retried only while nothing
        has been yielded; a connection lost mid-stream raises `StreamError`. The request
        body is `encode_body(body)`, so a caller that signs the body signs those bytes.
        """
        content = encode_body(body)
        secrets = _secrets(url, headers)
        attempt = 0
        while True:
            yielded = False
            try:
                with self._exchange(url, headers, content, model, cancel, secrets) as response:
                    for chunk in self._body_chunks(response, cancel, secrets):
                        if cancel is not None and cancel.cancelled:
                            raise RequestCancelled()
                        if chunk:
                            yielded = True
                            yield chunk
                return
            except ProviderError as error:
                if yielded:
                    raise
                attempt = self._before_retry(error, attempt, url, cancel)

    def close(self) -> None:
        if self._sync_client is not None:
            self._sync_client.close()

    # --- the event-loop twin -------------------------------------------------------------
    # The same requests, retries, errors and cancel semantics over `httpx.AsyncClient`, for
    # a runtime that streams many turns from one event loop: a thread per stream made the
    # threads' hand-offs of the GIL, not the work, the limit (docs/PERFORMANCE.md).

    async def astream_sse(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: dict[str, Any],
        model: str,
        cancel: CancelToken | None = None,
    ) -> AsyncIterator[SSEEvent]:
        """`stream_sse` on the running event loop."""

        def events() -> tuple[Callable[[bytes], Iterable[SSEEvent]], Callable[[], None]]:
            decoder = SSEDecoder()
            return decoder.feed, decoder.flush

        request_headers = {"Accept": "text/event-stream", **headers}
        stream = self._astream(url, request_headers, body, model, cancel, events)
        async with contextlib.aclosing(stream):  # leaving early releases the connection now
            async for event in stream:
                yield event

    async def astream_bytes(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: dict[str, Any],
        model: str,
        cancel: CancelToken | None = None,
    ) -> AsyncIterator[bytes]:
        """`stream_bytes` on the running event loop."""

        def chunks() -> tuple[Callable[[bytes], Iterable[bytes]], Callable[[], None]]:
            return (lambda chunk: (chunk,) if chunk else ()), (lambda: None)

        stream = self._astream(url, headers, body, model, cancel, chunks)
        async with contextlib.aclosing(stream):
            async for chunk in stream:
                yield chunk

    async def _astream(
        self,
        url: str,
        headers: Mapping[str, str],
        body: dict[str, Any],
        model: str,
        cancel: CancelToken | None,
        new_decoder: Callable[[], tuple[Callable[[bytes], Iterable[Any]], Callable[[], None]]],
    ) -> AsyncIterator[Any]:
        """POST and yield what a fresh decoder (per attempt) makes of the body: retried
        only while nothing has been yielded; cancel reaches an awaited read."""
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
                        async for chunk in self._abody_chunks(response, guard, secrets):
                            for item in feed(chunk):
                                guard.check()
                                yielded = True
                                yield item
                        flush()
                    return
                except SSEProtocolError as exc:
                    raise StreamError(str(exc)) from None
                except ProviderError as error:
                    if yielded:
                        raise
                    attempt = await self._abefore_retry(error, attempt, url, guard)
        finally:
            guard.close()

    async def aclose(self) -> None:
        if self._aclient is not None:
            await self._aclient.aclose()
            self._aclient = None
        self.close()

    def _async_client(self) -> httpx.AsyncClient:
        if self._aclient is None:
            self._aclient = httpx.AsyncClient(
                transport=AsyncGuardedTransport(self._policy),
                timeout=self._timeout,
                follow_redirects=False,
                trust_env=False,
            )
        return self._aclient

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
        client = self._async_client()
        response: httpx.Response | None = None
        try:
            request = client.build_request(
                "POST",
                url,
                headers={"Content-Type": "application/json", **headers},
                content=content,
            )
            try:
                with guard.section():
                    response = await client.send(request, stream=True)
            except Exception as exc:
                raise self._failure(exc, guard.token, secrets, mid_stream=False) from None
            if not response.is_success:
                raise await self._astatus_error(response, model, guard, secrets)
            yield response
        finally:
            if response is not None:
                await response.aclose()

    async def _abody_chunks(
        self, response: httpx.Response, guard: _AsyncCancelGuard, secrets: tuple[str, ...]
    ) -> AsyncIterator[bytes]:
        chunks = response.aiter_bytes().__aiter__()
        while True:
            try:
                with guard.section():
                    chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except Exception as exc:
                raise self._failure(exc, guard.token, secrets, mid_stream=True) from None
            yield chunk
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
        delay = self._retry_delay(error, attempt, url)
        if self._sleep is not time.sleep:
            self._sleep(delay)  # a test's clock
        else:
            with guard.section():
                await asyncio.sleep(delay)
        guard.check()
        return attempt + 1

    @contextlib.contextmanager
    def _exchange(
        self,
        url: str,
        headers: Mapping[str, str],
        content: bytes,
        model: str,
        cancel: CancelToken | None,
        secrets: tuple[str, ...],
    ) -> Iterator[httpx.Response]:
        """One HTTP attempt: a 2xx response with its body unread, or a raised error."""
        if cancel is not None and cancel.cancelled:
            raise RequestCancelled()
        abort = _Abort()
        unregister = cancel.on_cancel(abort.fire) if cancel is not None else None
        response: httpx.Response | None = None
        try:
            request = self._client.build_request(
                "POST",
                url,
                headers={"Content-Type": "application/json", **headers},
                content=content,
            )
            _current.abort = abort
            try:
                response = self._client.send(request, stream=True)
            except Exception as exc:
                raise self._failure(exc, cancel, secrets, mid_stream=False) from None
            finally:
                _current.abort = None
            if not response.is_success:
                raise self._status_error(response, model, cancel, secrets)
            yield response
        finally:
            if unregister is not None:
                unregister()
            abort.detach()
            if response is not None:
                response.close()

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
        if not isinstance(exc, httpx.HTTPError):
            return exc
        detail = redact(str(exc) or type(exc).__name__, secrets)
        if isinstance(exc, httpx.TimeoutException):
            if mid_stream:
                return StreamError(f"no data from the upstream for {self.read_timeout:g} s")
            return UpstreamUnavailableError(f"timed out: {detail}")
        if mid_stream:
            return StreamError(f"the connection was lost mid-stream: {detail}")
        return UpstreamUnavailableError(detail)

    def _status_error(
        self,
        response: httpx.Response,
        model: str,
        cancel: CancelToken | None,
        secrets: tuple[str, ...],
    ) -> ProviderError:
        body = bytearray()
        try:
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) >= MAX_ERROR_BODY_BYTES:
                    break
        except httpx.HTTPError:
            pass  # a partial error body still says something
        return _error_from_body(response, bytes(body), model, cancel, secrets)

    def _body_chunks(
        self, response: httpx.Response, cancel: CancelToken | None, secrets: tuple[str, ...]
    ) -> Iterator[bytes]:
        try:
            yield from response.iter_bytes()
        except Exception as exc:
            raise self._failure(exc, cancel, secrets, mid_stream=True) from None
        if cancel is not None and cancel.cancelled:
            raise RequestCancelled()

    def _read_body(
        self, response: httpx.Response, cancel: CancelToken | None, secrets: tuple[str, ...]
    ) -> bytes:
        body = bytearray()
        try:
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_JSON_BODY_BYTES:
                    raise ProviderError(f"the reply is larger than {MAX_JSON_BODY_BYTES} bytes")
        except httpx.HTTPError as exc:
            raise self._failure(exc, cancel, secrets, mid_stream=False) from None
        if cancel is not None and cancel.cancelled:
            raise RequestCancelled()
        return bytes(body)

    def _before_retry(
        self, error: ProviderError, attempt: int, url: str, cancel: CancelToken | None
    ) -> int:
        """Wait before the next attempt and return its number, or re-raise `error`."""
        self._wait(self._retry_delay(error, attempt, url), cancel)
        return attempt + 1

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

    def _wait(self, delay: float, cancel: CancelToken | None) -> None:
        if cancel is None or self._sleep is not time.sleep:
            self._sleep(delay)
        else:
            woken = threading.Event()
            unregister = cancel.on_cancel(woken.set)
            try:
                woken.wait(delay)
            finally:
                unregister()
        if cancel is not None and cancel.cancelled:
            raise RequestCancelled()
