"""Many small Redis writes from one event loop, sent as one pipeline per round trip.

A worker process streams hundreds of turns from one event loop, and each coalesced delta
is a replay-buffer append and a publish. One round trip per command made Redis latency,
not CPU, the limit (bench/stream_path.py: seconds of added latency at 200 turns). Here
every command queued while a pipeline is in flight goes out in the next one: nothing
waits for a timer, and under load each round trip carries the whole backlog.

Commands keep the order they were queued in, within a batch and across batches (one
pipeline at a time per batcher). Two batchers (the replay buffer's and the channel
layer's) run side by side, on their own connections, with no order between them.

A batch is written with one `write` and its replies parsed by hiredis as they arrive
(`RespPipe`): redis-py's pipeline built objects and awaited a reader per command, the
largest Redis cost of a streaming worker (cProfile of bench/stream_path.py). Replies are
Redis's own values (bytes, ints, lists; an error reply is a `ResponseError`), without
redis-py's per-command conversions. Reads that want those use `client_for(url)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import types
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection, parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError

from openworker.runtime.live.loop_local import LoopLocal

logger = logging.getLogger(__name__)

# Bound one pipeline: a burst after a stall goes out in several round trips rather than
# one huge reply buffer.
MAX_BATCH = 512
READ_BYTES = 64 * 1024
CONNECT_TIMEOUT_SECONDS = 10.0


def pack(args: Sequence[Any]) -> bytes:
    """One command in RESP: an array of bulk strings (str as UTF-8, ints and floats as
    their text, as redis-py encodes them). hiredis packs it in C: a quarter of the CPU
    of doing it here, for every append and publish of a streaming worker."""
    try:
        return hiredis.pack_command(args if isinstance(args, tuple) else tuple(args))
    except TypeError:  # None, a bool (hiredis refuses it too), any other object
        # Named by type only: the arguments carry transcripts.
        bad = [
            type(a).__name__
            for a in args
            if isinstance(a, bool) or not isinstance(a, str | bytes | int | float)
        ]
        raise DataError(f"cannot send {', '.join(bad) or 'these arguments'} to Redis") from None


def _tls_context(options: dict[str, Any]) -> ssl.SSLContext:
    """`rediss://` as redis-py reads it: verified against the system's CAs (or
    `ssl_ca_certs`), unless `ssl_cert_reqs=none` (or `optional`) says otherwise."""
    context = ssl.create_default_context(cafile=options.get("ssl_ca_certs"))
    requirement = str(options.get("ssl_cert_reqs") or "required").lower()
    if requirement in ("none", "optional"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE if requirement == "none" else ssl.CERT_OPTIONAL
    return context


class RespPipe:
    """One Redis connection for batches of commands: written at once, replies parsed by
    hiredis. Connects on first use (AUTH and SELECT from the URL, as redis-py reads it);
    any failure drops the connection (a half-read reply stream cannot be resumed) and the
    next batch connects again."""

    def __init__(self, url: str) -> None:
        options = parse_url(url)
        self.path: str | None = options.get("path")
        self.host = options.get("host") or "localhost"
        self.port = int(options.get("port") or 6379)
        self.tls = (
            _tls_context(options) if options.get("connection_class") is SSLConnection else None
        )
        if options.get("connection_class") not in (None, SSLConnection, UnixDomainSocketConnection):
            raise ValueError(f"unsupported Redis URL scheme: {url.split(':', 1)[0]}")
        self.setup: list[tuple[Any, ...]] = []
        if options.get("password"):
            credentials = (options.get("username"), options["password"])
            self.setup.append(("AUTH", *[c for c in credentials if c]))
        if options.get("db"):
            self.setup.append(("SELECT", int(options["db"])))
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._parser: Any = None

    async def execute(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Every command's reply, in order (error replies as `ResponseError` values);
        `RedisConnectionError` when the connection fails."""
        payload = b"".join(pack(command) for command in commands)  # DataError: nothing sent
        reused = self._writer is not None
        try:
            return await self._execute_once(payload, len(commands))
        except (OSError, EOFError, RedisConnectionError) as exc:
            if not reused:
                raise RedisConnectionError(f"Redis connection failed: {exc}") from exc
        # A connection Redis dropped while it sat idle (a restart) fails on first use:
        # once more on a fresh one. What is batched is safe to repeat: an XADD with an
        # explicit id refuses its duplicate, a repeated PUBLISH carries a seq the socket
        # already has, EXPIRE and SELECT are idempotent.
        try:
            return await self._execute_once(payload, len(commands))
        except (OSError, EOFError) as exc:
            raise RedisConnectionError(f"Redis connection failed: {exc}") from exc

    async def opened(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Any]:
        """The connection, made if need be (AUTH and SELECT done), and its hiredis reply
        parser: for a caller that reads replies itself (`subscription.Subscription`).
        `RedisConnectionError` when it cannot be made."""
        if self._writer is None:
            try:
                await self._connect()
            except (OSError, EOFError) as exc:
                self._drop()
                raise RedisConnectionError(f"Redis connection failed: {exc}") from exc
            except BaseException:
                self._drop()
                raise
        assert self._reader is not None and self._writer is not None
        return self._reader, self._writer, self._parser

    def drop(self) -> None:
        """Close the connection now (the next use makes a new one)."""
        self._drop()

    async def _execute_once(self, payload: bytes, count: int) -> list[Any]:
        try:
            if self._writer is None:
                await self._connect()
            return await self._exchange(payload, count)
        except BaseException:
            self._drop()
            raise

    async def _connect(self) -> None:
        async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
            if self.path is not None:
                reader, writer = await asyncio.open_unix_connection(self.path)
            else:
                reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self.tls)
        self._reader, self._writer = reader, writer
        self._parser = hiredis.Reader(replyError=ResponseError)
        if self.setup:
            for reply in await self._exchange(b"".join(map(pack, self.setup)), len(self.setup)):
                if isinstance(reply, ResponseError):
                    raise RedisConnectionError(f"Redis refused the connection setup: {reply}")

    async def _exchange(self, payload: bytes, count: int) -> list[Any]:
        assert self._reader is not None and self._writer is not None
        self._writer.write(payload)
        replies: list[Any] = []
        parser = self._parser
        while len(replies) < count:
            reply = parser.gets()
            if reply is False:
                data = await self._reader.read(READ_BYTES)
                if not data:
                    raise EOFError("Redis closed the connection")
                parser.feed(data)
            else:
                replies.append(reply)
        return replies

    def _drop(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = self._parser = None

    async def aclose(self) -> None:
        writer = self._writer
        self._drop()
        if writer is not None:
            with contextlib.suppress(Exception):
                await writer.wait_closed()


# Who learns a command's outcome: the future its caller awaits, or (a command sent with
# `submit_nowait`) a callback told only of a failure.
OnError = Callable[[BaseException], None]
_Pending = tuple[tuple[Any, ...], asyncio.Future[Any] | None, OnError | None]


class CommandBatcher:
    def __init__(self, url: str) -> None:
        self.pipe = RespPipe(url)
        self._pending: list[_Pending] = []
        self._drain_task: asyncio.Task[None] | None = None
        _BATCHERS.add(self)

    @property
    def backlog(self) -> int:
        """Commands queued behind the pipeline in flight: how far the publisher is behind
        (the emitter widens its coalescing window with it)."""
        return len(self._pending)

    def submit(self, *args: Any) -> asyncio.Future[Any]:
        """Queue one command now (synchronously, so callers' order is Redis's order);
        the future resolves with its reply or its error."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((args, future, None))
        if self._drain_task is None:
            self._drain_task = loop.create_task(self._drain())
        return future

    def submit_nowait(self, on_error: OnError, *args: Any) -> None:
        """Queue one command whose reply nobody waits for: `on_error(error)` is called if
        it fails (an error reply, a lost connection). A streaming worker's deltas: a
        future and its done-callback per command were a twentieth of its CPU
        (docs/PERFORMANCE.md, session 22). `settled()` waits for such commands."""
        self._pending.append((args, None, on_error))
        if self._drain_task is None:
            self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    async def call(self, *args: Any) -> Any:
        return await self.submit(*args)

    async def settled(self) -> None:
        """Return once every command queued before this call has its outcome (callbacks
        of the failed ones called): a PING queued behind them, its own outcome ignored."""
        with contextlib.suppress(Exception):
            await self.call("PING")

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch = self._pending[:MAX_BATCH]
                del self._pending[:MAX_BATCH]
                await self._send(batch)
        finally:
            self._drain_task = None

    async def _send(self, batch: list[_Pending]) -> None:
        try:
            replies = await self.pipe.execute([args for args, _, _ in batch])
        except asyncio.CancelledError:
            for _, future, _ in batch:
                if future is not None and not future.done():
                    future.cancel()
            raise
        except Exception as exc:  # connection lost (or a bad argument): the batch failed
            for _, future, on_error in batch:
                _fail(future, on_error, exc)
            return
        for (_, future, on_error), reply in zip(batch, replies, strict=True):
            if isinstance(reply, Exception):
                _fail(future, on_error, reply)
            elif future is not None and not future.done():  # not if its caller gave up
                future.set_result(reply)

    async def aclose(self) -> None:
        await self.pipe.aclose()


def _fail(future: asyncio.Future[Any] | None, on_error: OnError | None, error: Exception) -> None:
    if future is not None:
        if not future.done():
            future.set_exception(error)
    elif on_error is not None:
        try:
            on_error(error)
        except Exception:  # one caller's callback must not stop the batch's others
            logger.exception("a Redis command's error callback failed")


# Every batcher of the process, for `backlog()`.
_BATCHERS: weakref.WeakSet[CommandBatcher] = weakref.WeakSet()


def backlog() -> int:
    """The longest queue of commands waiting behind a round trip, over this process's
    batchers (the replay buffer's and the channel layer's)."""
    return max((batcher.backlog for batcher in list(_BATCHERS)), default=0)


def _loop_cache(loop: asyncio.AbstractEventLoop) -> dict[tuple[str, str], Any]:
    cache: dict[tuple[str, str], Any] = {}
    on_loop_close(loop, lambda: _close_all(cache))
    return cache


_per_loop: LoopLocal[dict[tuple[str, str], Any]] = LoopLocal(_loop_cache)


def _loop_cached(kind: str, url: str, make: Callable[[], Any]) -> Any:
    """One `kind` of connection per event loop and URL (asyncio connections must not
    cross loops); they close with the loop."""
    cache = _per_loop.get()
    made = cache.get((kind, url))
    if made is None:
        made = cache[(kind, url)] = make()
    return made


def batcher_for(url: str) -> CommandBatcher:
    """This event loop's batcher for `url`."""
    return _loop_cached("batcher", url, lambda: CommandBatcher(url))


def client_for(url: str) -> Any:
    """This event loop's redis-py client for `url` (reads, with redis-py's replies)."""
    return _loop_cached("client", url, lambda: aioredis.Redis.from_url(url))


async def _close_all(cache: dict[tuple[str, str], Any]) -> None:
    for made in cache.values():
        with contextlib.suppress(Exception):
            await made.aclose()
    cache.clear()


def on_loop_close(loop: asyncio.AbstractEventLoop, cleanup: Callable[[], Awaitable[Any]]) -> None:
    """Run `cleanup()` on `loop` just before it closes (`async_to_sync` makes and closes
    loops): connections are closed by their loop, not left to the garbage collector and
    its "unclosed" warnings."""
    original = loop.close

    def close(self: asyncio.AbstractEventLoop) -> None:
        if not self.is_running() and not self.is_closed():
            with contextlib.suppress(Exception):
                self.run_until_complete(cleanup())
        original()

    loop.close = types.MethodType(close, loop)  # type: ignore[method-assign]
