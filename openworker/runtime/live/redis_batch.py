"""Many small Redis writes from one event loop, sent in batches on one connection.

A worker process streams hundreds of turns from one event loop, and each coalesced delta
is a replay-buffer append and a publish. One round trip per command made Redis latency,
not CPU, the limit (bench/stream_path.py: seconds of added latency at 200 turns). Here
every command queued while a batch is in flight goes out in the next one, which is
written when the one before is answered or `OVERLAP_SECONDS` after it went out, which
ever comes first (`CommandBatcher`): under load each batch carries the backlog, and no
command waits a whole slow round trip for its turn.

Commands keep the order they were queued in, within a batch and across batches (one
connection per batcher, answered in order). Two batchers (the replay buffer's and the
channel layer's) run side by side, on their own connections, with no order between them.

A batch is written with one `write` and its replies parsed by hiredis as they arrive,
by one reader task per connection: redis-py's pipeline built objects and awaited a
reader per command, the largest Redis cost of a streaming worker (cProfile of
bench/stream_path.py). Replies are
Redis's own values (bytes, ints, lists; an error reply is a `ResponseError`), without
redis-py's per-command conversions. Reads that want those use `client_for(url)`.
"""

from __future__ import annotations

import asyncio
import collections
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
# While a batch is in flight, the next one waits for its replies at most this long after
# it went out, then is written behind it (`CommandBatcher`).
OVERLAP_SECONDS = 0.002


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
    """One Redis connection, made on first use (AUTH and SELECT from the URL, as
    redis-py reads it), with its hiredis reply parser; whoever holds it writes commands
    and reads their replies (`CommandBatcher`, `subscription.Subscription`). Any failure
    drops the connection (a half-read reply stream cannot be resumed) and the next use
    connects again."""

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
        # Held while a connection is made: two users on one loop make one, not two.
        self._connecting: asyncio.Lock | None = None

    @property
    def connected(self) -> bool:
        return self._writer is not None

    async def opened(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Any]:
        """The connection, made if need be (AUTH and SELECT done), and its hiredis reply
        parser. `RedisConnectionError` when it cannot be made."""
        if self._writer is None:
            if self._connecting is None:
                self._connecting = asyncio.Lock()
            async with self._connecting:
                if self._writer is None:
                    await self._connect()
        assert self._reader is not None and self._writer is not None
        return self._reader, self._writer, self._parser

    def drop(self) -> None:
        """Close the connection now (the next use makes a new one)."""
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = self._parser = None

    async def _connect(self) -> None:
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                if self.path is not None:
                    reader, writer = await asyncio.open_unix_connection(self.path)
                else:
                    reader, writer = await asyncio.open_connection(
                        self.host, self.port, ssl=self.tls
                    )
                parser = hiredis.Reader(replyError=ResponseError)
                if self.setup:
                    writer.write(b"".join(map(pack, self.setup)))
                    for reply in await _replies(reader, parser, len(self.setup)):
                        if isinstance(reply, ResponseError):
                            raise RedisConnectionError(
                                f"Redis refused the connection setup: {reply}"
                            )
        except (OSError, EOFError) as exc:
            if writer is not None:
                writer.close()
            raise RedisConnectionError(f"Redis connection failed: {exc}") from exc
        except BaseException:
            if writer is not None:
                writer.close()
            raise
        # Only now: nobody writes on a connection whose AUTH and SELECT are not done.
        self._reader, self._writer, self._parser = reader, writer, parser

    async def aclose(self) -> None:
        writer = self._writer
        self.drop()
        if writer is not None:
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def _replies(reader: asyncio.StreamReader, parser: Any, count: int) -> list[Any]:
    """The next `count` replies on a connection nobody else reads."""
    replies: list[Any] = []
    while len(replies) < count:
        reply = parser.gets()
        if reply is False:
            data = await reader.read(READ_BYTES)
            if not data:
                raise EOFError("Redis closed the connection")
            parser.feed(data)
        else:
            replies.append(reply)
    return replies


# Who learns a command's outcome: the future its caller awaits, or (a command sent with
# `submit_nowait`) a callback told only of a failure.
OnError = Callable[[BaseException], None]
_Pending = tuple[tuple[Any, ...], asyncio.Future[Any] | None, OnError | None]


class _Flight:
    """One batch written and not yet answered in full: its commands, the replies read so
    far, when it went out, and a future settled once every reply is in (or it failed)."""

    __slots__ = ("answered", "batch", "replies", "retried", "sent_at")

    def __init__(
        self, batch: list[_Pending], sent_at: float, answered: asyncio.Future[None]
    ) -> None:
        self.batch = batch
        self.replies: list[Any] = []
        self.sent_at = sent_at
        self.answered = answered
        self.retried = False


class CommandBatcher:
    """Commands from one event loop, written in batches on one connection; replies read
    by one task and matched to their batches in order.

    A batch goes out at once when nothing is in flight. While a batch is in flight, what
    is queued meanwhile waits for its replies, as before, but never more than
    `OVERLAP_SECONDS` after the newest batch went out: then it is written behind it
    (pipelined; Redis answers each connection in order). Waiting for the whole round trip
    held every delta up to it, and under load a round trip (Redis and this loop each
    waiting for a core on a busy box) took 20 ms at p90 and 50 at p99 in
    bench/stream_path.py at K = 1000 (docs/PERFORMANCE.md, session 26)."""

    def __init__(self, url: str) -> None:
        self.pipe = RespPipe(url)
        self._pending: list[_Pending] = []
        self._drain_task: asyncio.Task[None] | None = None
        self._in_flight: collections.deque[_Flight] = collections.deque()
        self._unanswered = 0
        self._reader_task: asyncio.Task[None] | None = None
        _BATCHERS.add(self)

    @property
    def backlog(self) -> int:
        """Commands queued or in flight behind the oldest batch in flight: how far the
        publisher is behind (the emitter widens its coalescing window with it)."""
        behind = self._unanswered - (len(self._in_flight[0].batch) if self._in_flight else 0)
        return len(self._pending) + behind

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
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                if self._in_flight:
                    newest = self._in_flight[-1]
                    wait = newest.sent_at + OVERLAP_SECONDS - loop.time()
                    if wait > 0:
                        await asyncio.wait((newest.answered,), timeout=wait)
                        continue
                batch = self._pending[:MAX_BATCH]
                del self._pending[:MAX_BATCH]
                await self._write(batch)
        finally:
            self._drain_task = None

    async def _write(self, batch: list[_Pending], *, retried: bool = False) -> None:
        """Write `batch` behind what is in flight, or fail it (a bad argument, no
        connection)."""
        try:
            payload = b"".join([pack(args) for args, _, _ in batch])  # DataError: nothing sent
            reused = self.pipe.connected
            reader, writer, parser = await self.pipe.opened()
        except asyncio.CancelledError:
            _cancel(batch)
            raise
        except Exception as exc:
            _fail_all(batch, exc)
            return
        loop = asyncio.get_running_loop()
        flight = _Flight(batch, loop.time(), loop.create_future())
        # Sent on a connection made earlier, it is tried once more on a new one if that
        # connection turns out to be dead (Redis restarted while it sat idle).
        flight.retried = retried or not reused
        self._in_flight.append(flight)
        self._unanswered += len(batch)
        writer.write(payload)
        if self._reader_task is None:
            self._reader_task = loop.create_task(self._read(reader, parser))

    async def _read(self, reader: asyncio.StreamReader, parser: Any) -> None:
        """Read replies into the batches in flight, oldest first, until the connection
        fails or is closed: then every batch still in flight fails (or goes once more)."""
        try:
            while True:
                data = await reader.read(READ_BYTES)
                if not data:
                    raise EOFError("Redis closed the connection")
                parser.feed(data)
                reply = parser.gets()
                while reply is not False:
                    flight = self._in_flight[0]  # IndexError: a reply nobody asked for
                    flight.replies.append(reply)
                    if len(flight.replies) == len(flight.batch):
                        self._in_flight.popleft()
                        self._unanswered -= len(flight.batch)
                        _settle(flight)
                    reply = parser.gets()
        except asyncio.CancelledError:
            self._lost(RedisConnectionError("the Redis connection was closed"), retry=False)
            raise
        except Exception as exc:  # OSError, EOFError, a protocol error
            self._lost(RedisConnectionError(f"Redis connection failed: {exc}"))

    def _lost(self, failure: BaseException, *, retry: bool = True) -> None:
        """The connection under the batches in flight failed: drop it; fail them, or
        (written on a connection made before them, once) write them again on a new one."""
        self._reader_task = None
        self.pipe.drop()
        flights, self._in_flight = list(self._in_flight), collections.deque()
        self._unanswered = 0
        again: list[_Pending] = []
        for flight in flights:
            if flight.retried or not retry:
                _fail_all(flight.batch, failure)
            else:
                again.extend(flight.batch)
            if not flight.answered.done():
                flight.answered.set_result(None)
        if again:
            # What is safe to repeat goes out first on a new connection, ahead of what
            # was queued after it (an XADD with an explicit id refuses its duplicate, a
            # repeated PUBLISH carries a seq the socket already has).
            task = asyncio.get_running_loop().create_task(self._write(again, retried=True))
            _RETRIES.add(task)
            task.add_done_callback(_RETRIES.discard)

    async def aclose(self) -> None:
        reader = self._reader_task
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        await self.pipe.aclose()


_RETRIES: set[asyncio.Task[None]] = set()


def _settle(flight: _Flight) -> None:
    for (_, future, on_error), reply in zip(flight.batch, flight.replies, strict=True):
        if isinstance(reply, Exception):
            _fail(future, on_error, reply)
        elif future is not None and not future.done():  # not if its caller gave up
            future.set_result(reply)
    if not flight.answered.done():
        flight.answered.set_result(None)


def _fail_all(batch: list[_Pending], error: BaseException) -> None:
    for _, future, on_error in batch:
        _fail(future, on_error, error)


def _cancel(batch: list[_Pending]) -> None:
    for _, future, _ in batch:
        if future is not None and not future.done():
            future.cancel()


def _fail(
    future: asyncio.Future[Any] | None, on_error: OnError | None, error: BaseException
) -> None:
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
