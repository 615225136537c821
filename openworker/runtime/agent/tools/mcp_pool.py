"""Open MCP sessions kept per event loop and reused across calls and turns.

Opening a session (TCP, the initialize handshake, and the SDK's first tools/list) cost
about six times the call itself (bench/mcp_overhead.py). An SDK session belongs to the
loop and the task that opened it (its anyio task groups), so each pooled session has an
owner task on the pool's loop that opens it, holds it and closes it; calls from any
task of that loop share it (JSON-RPC multiplexes requests). One pool per loop: a
worker process's turn loop, Daphne's loop in embedded mode.

- Key: the server and whose credentials the session carries (`PoolKey.identity`, which
  the caller chooses: "server" for the server's own secret, a user's id where each user
  connects their own account), so no session ever carries one user's token for another.
- Invalidation: every checkout brings the fingerprint of how to reach the server (URL,
  command, headers, secret): an edited server or a changed secret no longer matches, and
  its old session is closed. `validate` (set by the caller) is asked on each sweep which
  pooled sessions are still current, so a disabled or deleted server's sessions close
  within `SWEEP_SECONDS` in every process, used or not.
- Tools: a `tools/list_changed` during a call is listed again on the same session once
  the call ends (`PooledOutcome.tools`, for the turn's registry); one announced while no
  call is out is listed by the owner and handed to `tools_listed` (the tool cache).
- Health: a session found closed is replaced; a reused stdio session is pinged first (its
  process may have died while idle, and a request written to it before its end of output
  is read would count as `lost`); a call the server provably never received
  (`unsent`) is sent once more on a new session; a call that may have reached it
  (`lost`, a timeout) is never sent again: the caller reports it.
- Bounds: `max_sessions` per loop, of which at most `max_stdio` are stdio subprocesses;
  the least recently used idle session makes room, and when all are busy the call gets a
  session of its own, closed after it. Idle sessions close after `idle_seconds`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from mcp import ClientSession

from openworker.runtime.agent.tools import mcp_client
from providers.cancel import CancelToken

logger = logging.getLogger(__name__)

# Long enough to span the model's thinking between two tool calls of a turn and the
# user's reading between turns; short enough that a worker does not hold connections
# (or stdio processes) for servers nobody has used for minutes.
IDLE_SECONDS = 300.0
# Open sessions per loop. Each costs tens of KiB and a socket (docs/PERFORMANCE.md).
MAX_SESSIONS = 64
# stdio sessions are processes on the host: far fewer of them.
MAX_STDIO = 8
# How often idle sessions are closed and the pooled ones checked with `validate`.
SWEEP_SECONDS = 15.0
# How long closing the pool waits for its sessions to say goodbye (DELETE, process exit).
CLOSE_SECONDS = 5.0
# A reused stdio session answers a ping within this, or is replaced before the call.
PING_SECONDS = 2.0

# opener(on_tools_changed, undelivered) → the async context manager of a new session.
Opener = Callable[[mcp_client.ToolsChanged, set[Any]], AbstractAsyncContextManager[ClientSession]]
# validate({key: fingerprint}) → the keys still current (their server enabled, unchanged).
Validator = Callable[[dict["PoolKey", str]], Awaitable[set["PoolKey"]]]
# tools_listed(key, tools): a server's new tool list, listed after it said it changed
# while no call was out on the session (a call lists it itself, see `PooledOutcome`).
ToolsListed = Callable[["PoolKey", list[dict[str, Any]]], Awaitable[None]]


@dataclass(frozen=True)
class PoolKey:
    """Which server, with whose credentials."""

    server: str
    identity: str


@dataclass(frozen=True)
class PooledOutcome:
    """A call's end, and the server's tool list when it changed since last listed on this
    session (`tools/list_changed`): listed again on the same session after the call."""

    outcome: mcp_client.CallOutcome
    tools: list[dict[str, Any]] | None = None
    reused: bool = False


@dataclass(eq=False)
class _Entry:
    key: PoolKey
    fingerprint: str
    stdio: bool
    pooled: bool = True
    session: ClientSession | None = None
    error: BaseException | None = None
    users: int = 0
    last_used: float = field(default_factory=time.monotonic)
    # Bumped by `tools/list_changed`; `listed` is the generation last listed here.
    tools_generation: int = 0
    listed_generation: int = 0
    undelivered: set[Any] = field(default_factory=set)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    list_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def usable(self) -> bool:
        return not (self.closed.is_set() or self.closing.is_set())

    async def own(self, opener: Opener, on_listed: ToolsListed | None) -> None:
        """The owner task: open, hold until told to close (or the transport fails), close."""

        async def on_changed() -> None:
            self.tools_generation += 1
            self.changed.set()

        refresher: asyncio.Task[None] | None = None
        try:
            async with opener(on_changed, self.undelivered) as session:
                self.session = session
                self.ready.set()
                if on_listed is not None:
                    refresher = asyncio.ensure_future(self._list_when_idle(session, on_listed))
                await self.closing.wait()
        except Exception as exc:
            self.error = exc
            if self.session is not None:
                # The type only: a transport error's text may carry the server's URL.
                logger.info(
                    "pooled MCP session to %s ended: %s", self.key.server, type(exc).__name__
                )
        finally:
            if refresher is not None:
                refresher.cancel()
            self.closed.set()
            self.ready.set()

    async def list_again(self, session: ClientSession) -> list[dict[str, Any]]:
        async with self.list_lock:
            generation = self.tools_generation
            tools = await mcp_client.list_tools(session)
            self.listed_generation = generation
            return tools

    async def _list_when_idle(self, session: ClientSession, on_listed: ToolsListed) -> None:
        """A change announced while no call is out (on the session's standalone stream,
        whenever the server likes): listed and handed on, so the next turn offers it."""
        while True:
            await self.changed.wait()
            self.changed.clear()
            if self.users or self.tools_generation == self.listed_generation:
                continue  # the call that is out lists it when it ends (or already did)
            try:
                tools = await self.list_again(session)
                await on_listed(self.key, tools)
            except Exception:
                logger.warning("listing %s's changed tools failed", self.key.server, exc_info=True)


class McpPool:
    """The open sessions of one event loop (`pool()` gives the running loop's)."""

    def __init__(
        self,
        *,
        idle_seconds: float = IDLE_SECONDS,
        max_sessions: int = MAX_SESSIONS,
        max_stdio: int = MAX_STDIO,
        sweep_seconds: float = SWEEP_SECONDS,
    ) -> None:
        self.idle_seconds = idle_seconds
        self.max_sessions = max_sessions
        self.max_stdio = max_stdio
        self.sweep_seconds = sweep_seconds
        self.validate: Validator | None = None
        self.tools_listed: ToolsListed | None = None
        self._entries: dict[PoolKey, _Entry] = {}
        self._closing: set[_Entry] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.opened = 0  # sessions opened over the pool's life (tests, the bench)

    def __len__(self) -> int:
        return len(self._entries)

    async def call_tool(
        self,
        key: PoolKey,
        fingerprint: str,
        opener: Opener,
        name: str,
        arguments: dict[str, Any],
        *,
        timeout: float,
        cancel: CancelToken | None = None,
        stdio: bool = False,
    ) -> PooledOutcome:
        """Call `name` on a pooled session to `key`. A reused session that turns out
        closed, or that the server no longer knows, is replaced and the call sent once
        more, only when it provably never reached the server. Connecting failures raise."""
        for attempt in range(2):
            entry, fresh = self._checkout(key, fingerprint, opener, stdio)
            try:
                session = await self._ready(entry)
                if (
                    stdio
                    and not fresh
                    and not attempt
                    and not await _answers_ping(session, entry.closed)
                ):
                    # Died (or hung) while idle: nothing was sent, a new process takes it.
                    self._discard(entry)
                    logger.info("pooled MCP stdio server %s did not answer; restarting", key.server)
                    continue
                before = entry.listed_generation
                outcome = await mcp_client.call_tool(
                    session,
                    name,
                    arguments,
                    timeout=timeout,
                    cancel=cancel,
                    closed=entry.closed,
                    undelivered=entry.undelivered,
                )
                if outcome.end == "unsent":
                    self._discard(entry)
                    if fresh or attempt:
                        return PooledOutcome(outcome)
                    logger.info("pooled MCP session to %s was gone; reconnecting", key.server)
                    continue
                if outcome.end == "lost":
                    self._discard(entry)
                tools = None
                if outcome.end == "ok" and entry.tools_generation != before:
                    tools = await entry.list_again(session)
                return PooledOutcome(outcome, tools, reused=not fresh)
            finally:
                self._release(entry)
        raise AssertionError("unreachable")

    async def _ready(self, entry: _Entry) -> ClientSession:
        await entry.ready.wait()
        if entry.session is None or entry.closed.is_set():
            self._discard(entry)
            if entry.error is not None:
                raise entry.error
            raise ConnectionError("the MCP session closed while opening")
        return entry.session

    # --- the entries ---------------------------------------------------------------

    def _checkout(
        self, key: PoolKey, fingerprint: str, opener: Opener, stdio: bool
    ) -> tuple[_Entry, bool]:
        entry = self._entries.get(key)
        if entry is not None and (entry.fingerprint != fingerprint or not entry.usable):
            self._discard(entry)  # edited, re-keyed, or dead: never reused
            entry = None
        fresh = entry is None
        if entry is None:
            pooled = self._make_room(stdio)
            entry = _Entry(key=key, fingerprint=fingerprint, stdio=stdio, pooled=pooled)
            # A context of its own: the owner outlives the turn that happened to open it.
            entry.task = asyncio.get_running_loop().create_task(
                entry.own(opener, self.tools_listed), context=contextvars.Context()
            )
            self.opened += 1
            if pooled:
                self._entries[key] = entry
                self._ensure_sweeper()
        entry.users += 1
        return entry, fresh

    def _release(self, entry: _Entry) -> None:
        entry.users -= 1
        entry.last_used = time.monotonic()
        if entry.users == 0 and entry.tools_generation != entry.listed_generation:
            entry.changed.set()  # announced after the call looked: listed now it is idle
        if not entry.pooled and entry.users == 0:
            self._close(entry)

    def _make_room(self, stdio: bool) -> bool:
        """Whether a new session may be pooled, closing the least recently used idle one
        where a bound is reached; False when everything under that bound is busy."""
        if stdio and not self._room_within(
            [e for e in self._entries.values() if e.stdio], self.max_stdio
        ):
            return False
        return self._room_within(list(self._entries.values()), self.max_sessions)

    def _room_within(self, members: list[_Entry], limit: int) -> bool:
        if len(members) < limit:
            return True
        idle = [e for e in members if e.users == 0]
        if not idle:
            return False
        self._discard(min(idle, key=lambda e: e.last_used))
        return True

    def _discard(self, entry: _Entry) -> None:
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
        if entry.users == 0 or not entry.usable:
            self._close(entry)
        else:
            # Still in use by another call: unlisted now, closed when that call is done.
            entry.pooled = False

    def _close(self, entry: _Entry) -> None:
        entry.closing.set()
        if entry.task is not None and not entry.task.done():
            self._closing.add(entry)
            entry.task.add_done_callback(lambda _t: self._closing.discard(entry))

    # --- idle sweep, validation, shutdown ---------------------------------------------

    def _ensure_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(
                self._sweep_forever(), context=contextvars.Context()
            )

    async def _sweep_forever(self) -> None:
        while self._entries:
            await asyncio.sleep(self.sweep_seconds)
            try:
                await self.sweep()
            except Exception:
                logger.warning("sweeping the MCP pool failed", exc_info=True)

    async def sweep(self) -> None:
        """Close sessions idle past `idle_seconds`, dead ones, and those `validate` no
        longer recognises (the server disabled, deleted or edited elsewhere)."""
        now = time.monotonic()
        for entry in list(self._entries.values()):
            idle = entry.users == 0 and now - entry.last_used >= self.idle_seconds
            if idle or not entry.usable:
                self._discard(entry)
        if self.validate is not None and self._entries:
            pooled = {key: e.fingerprint for key, e in self._entries.items()}
            current = await self.validate(pooled)
            for key in pooled:
                entry = self._entries.get(key)
                if key not in current and entry is not None and entry.fingerprint == pooled[key]:
                    self._discard(entry)

    async def aclose(self) -> None:
        """Close every session (the loop or the process is stopping), waiting a bounded
        time for each to end cleanly (HTTP DELETE of the session, stdio process exit)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for entry in list(self._entries.values()):
            self._entries.pop(entry.key, None)
            self._close(entry)
        tasks = [e.task for e in self._closing if e.task is not None and not e.task.done()]
        if not tasks:
            return
        _, stuck = await asyncio.wait(tasks, timeout=CLOSE_SECONDS)
        for task in stuck:
            task.cancel()
        if stuck:
            await asyncio.wait(stuck, timeout=CLOSE_SECONDS)


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, McpPool] = weakref.WeakKeyDictionary()


def pool() -> McpPool:
    """The running loop's pool."""
    loop = asyncio.get_running_loop()
    found = _pools.get(loop)
    if found is None:
        found = _pools[loop] = McpPool()
        for hook in _on_new_pool:
            hook(found)
    return found


# Called with each new pool (the Django side sets its validator this way).
_on_new_pool: list[Callable[[McpPool], None]] = []


def on_new_pool(hook: Callable[[McpPool], None]) -> None:
    _on_new_pool.append(hook)


async def aclose_running_loop_pool() -> None:
    """Close the running loop's pool, if it has one (shutdown hooks)."""
    found = _pools.pop(asyncio.get_running_loop(), None)
    if found is not None:
        await found.aclose()


@contextlib.asynccontextmanager
async def scoped(pool_: McpPool) -> AsyncIterator[McpPool]:
    """A pool closed on exit (the bench and tests)."""
    try:
        yield pool_
    finally:
        await pool_.aclose()


async def _answers_ping(session: ClientSession, closed: asyncio.Event) -> bool:
    """Whether the server behind `session` answers a ping within PING_SECONDS (False as
    soon as its connection ends)."""
    ping = asyncio.ensure_future(session.send_ping())
    ended = asyncio.ensure_future(closed.wait())
    try:
        done, _ = await asyncio.wait(
            {ping, ended}, timeout=PING_SECONDS, return_when=asyncio.FIRST_COMPLETED
        )
        return ping in done and ping.exception() is None
    finally:
        for waiter in (ping, ended):
            waiter.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(ping, ended, return_exceptions=True)
