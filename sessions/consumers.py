"""The websocket of one chat session: `/ws/sessions/<id>/` (protocol: docs/PROTOCOL.md).

Only the signed-in owner may connect; anyone else is closed before `accept()` so not
even the existence of the session leaks. Every client message is checked again against
the owner. Server events come from the session's channel-layer group; events of a turn
carry `turn` and a per-turn `seq`, and this consumer guarantees that one socket sees each
(turn, seq) at most once and without gaps: a missing range is filled from the turn's
replay buffer before the next live event is forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from channels.sessions import InstanceSessionWrapper

from openworker import compact_json
from openworker.middleware import text_problem
from openworker.runtime.live import events
from openworker.runtime.live.replay import get_replay_buffer
from openworker.runtime.turns import commands
from openworker.runtime.turns.send_batch import send_batcher
from openworker.runtime.turns.socket_db import socket_db
from sessions import selectors

logger = logging.getLogger(__name__)

# Application close codes (4000-4999 are ours): the page reacts to each differently.
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
# A chat message is text plus attachment ids; anything bigger is not a client of ours.
MAX_FRAME_BYTES = 64 * 1024
# Our messages nest two levels (`{"attachments": [...]}`); a deep frame is an attack on
# the parser and on every handler that walks it.
MAX_FRAME_DEPTH = 8
# An active turn silent this long on this socket is checked against its replay buffer:
# the channel layer may have dropped its latest events (even its final status), and a
# gap is otherwise only noticed when a later event arrives.
STALL_SECONDS = 1.0
# A turn waiting for a worker (its last event `turn.queued`) is silent by design until it
# starts or its place changes (announced at most every two seconds), so its buffer is
# re-read only after this long: at K = 1,000, 800 waiting turns re-read every
# STALL_SECONDS were a tenth of Daphne's CPU (py-spy, bench/stream_path.py --profile).
QUEUED_STALL_SECONDS = 5.0
# How often the socket looks for turns it has not heard of at all (started from another
# tab while every one of their events was dropped).
ACTIVE_POLL_SECONDS = 5.0
# A live event that arrives with a gap before it waits this long, re-reading the buffer
# every GAP_RETRY_SECONDS, for the missing events to be in the buffer.
GAP_WAIT_SECONDS = 0.5
GAP_RETRY_SECONDS = 0.02
# A gap still open after GAP_WAIT_SECONDS is waited out, not crossed: the worker is
# repairing the buffer after a Redis failure (openworker/streaming.py), and `_watch`
# re-reads it. Only a gap open this long is crossed (its events are gone for good; the
# turn's committed message then shows the whole reply).
GAP_GIVE_UP_SECONDS = 30.0
# Live events kept per turn while waiting at a gap (beyond this the buffer has them).
MAX_HELD_EVENTS = 5_000
SETTLED = {"completed", "failed", "cancelled", "interrupted", "awaiting_approval"}


def _is_seq(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _optional_seq(value: Any) -> bool:
    return value is None or _is_seq(value)


class SessionConsumer(AsyncJsonWebsocketConsumer):
    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Channels' `AsyncConsumer.__call__`, with `_dispatch_each` in place of its
        `await_many_dispatch` (which costs an `asyncio.wait` and a new task per message)."""
        self.scope = scope
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self.channel_name = await self.channel_layer.new_channel()
        self.channel_receive = functools.partial(self.channel_layer.receive, self.channel_name)
        self.base_send = send
        # Turn events go out below Channels' session middleware: its `send` saves the
        # session on `http.response.start` only, and reading the session's state for
        # every frame was a fifth of the socket's send path (bench/stream_path.py
        # --mode embedded). Everything else (accept, close, errors) goes through it.
        self.frame_send = _below_session_middleware(send)
        with contextlib.suppress(StopConsumer):
            await _dispatch_each([receive, self.channel_receive], self.dispatch)

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        session_id = self.scope["url_route"]["kwargs"]["session_id"]
        session = await socket_db(selectors.session_get_for_user)(session_id=session_id, user=user)
        if session is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.session = session
        self.session_id = str(session.pk)
        self.user = user
        # (turn id → last seq this socket has) from `?resume=<turn>:<seq>,...`.
        self.sent: dict[str, int] = _parse_resume(self.scope.get("query_string", b""))
        self.group = events.session_group(self.session_id)
        # Join before replaying: nothing published from now on can be missed.
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.channel_layer.group_add(events.user_group(user.pk), self.channel_name)
        await self.accept()
        turns = await socket_db(_active_turn_states)(session)
        # `leaf`: the active leaf now; a page that shows another one (switched in a tab
        # while this one was away) fetches the path (docs/PROTOCOL.md "Branches").
        await self.send_json(
            {
                "type": "hello",
                "session": self.session_id,
                "turns": turns,
                "leaf": session.active_seq,
            }
        )
        # Active turn → loop time this socket last heard of it.
        self.tracking: dict[str, float] = {}
        # Tracked turns waiting for a worker (their last event `turn.queued`).
        self.queued: set[str] = set()
        self.deliver_lock = asyncio.Lock()
        # Turn id → loop time this socket first waited at a gap in its events.
        self.gaps: dict[str, float] = {}
        # Turn id → live events that arrived past a gap, by seq (bounded).
        self.held: dict[str, dict[int, dict[str, Any]]] = {}
        # Sends of this socket not answered yet: their turn is tracked once it is known.
        self.sending = 0
        for state in turns:
            self._track(state["turn"])
            await self._fill(state["turn"])
        self.watcher = asyncio.ensure_future(self._watch())
        idle_watch().add(self)

    async def disconnect(self, code: int) -> None:
        idle_watch().discard(self)
        watcher = getattr(self, "watcher", None)
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
        group = getattr(self, "group", None)
        if group:
            await self.channel_layer.group_discard(group, self.channel_name)
            await self.channel_layer.group_discard(
                events.user_group(self.user.pk), self.channel_name
            )

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """A refused frame gets an `error` naming the limit and the socket keeps working;
        whatever else goes wrong is logged and answered, never left to kill the reader."""
        try:
            content, problem = frame_parse(text_data, bytes_data)
            if problem is not None:
                await self._error(problem)
                return
            await self.receive_json(content)
        except StopConsumer:
            raise
        except Exception:
            logger.exception("session socket %s: a client message failed", self.session_id)
            await self._error("Something went wrong on our side; that message was not handled.")

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict) or not isinstance(content.get("type"), str):
            await self._error("Every message needs a type.")
            return
        handler = {
            "send": self._on_send,
            "stop": self._on_stop,
            "approve": self._on_decide,
            "deny": self._on_decide,
            "resume": self._on_resume,
            "retry": self._on_retry,
            "edit": self._on_edit,
            "regenerate": self._on_regenerate,
            "switch": self._on_switch,
            "continue": self._on_continue,
        }.get(content["type"])
        if handler is None:
            await self._error(f"Unknown message type {content['type'][:40]!r}.")
            return
        try:
            await handler(content)
        except commands.TurnRefused as exc:
            await self._error(str(exc))

    # --- client messages ---------------------------------------------------------------

    async def _on_send(self, content: dict[str, Any]) -> None:
        text = content.get("text", "")
        attachment_ids = content.get("attachments") or []
        model = content.get("model")
        if (
            not isinstance(text, str)
            or not isinstance(attachment_ids, list)
            or not all(isinstance(a, str) for a in attachment_ids)
            or (model is not None and not isinstance(model, str))
        ):
            await self._error("send takes text (string), attachments (ids) and model (string).")
            return
        self.sending += 1
        try:
            # Written together with the other sends this process received meanwhile.
            turn = await send_batcher().send(
                commands.SendRequest(
                    session=self.session,
                    user=self.user,
                    text=text,
                    attachment_ids=attachment_ids,
                    model=model,
                )
            )
        finally:
            self.sending -= 1
        self._track(str(turn.pk))

    async def _on_stop(self, content: dict[str, Any]) -> None:
        turn = await self._turn(content)
        if turn is not None:
            await socket_db(commands.turn_request_stop)(turn=turn)

    async def _on_decide(self, content: dict[str, Any]) -> None:
        turn = await self._turn(content)
        if turn is None:
            return
        call_id = content.get("call_id")
        if not isinstance(call_id, str):
            await self._error("approve/deny take turn and call_id.")
            return
        await socket_db(commands.turn_decide_tool)(
            turn=turn, call_id=call_id, approved=content["type"] == "approve"
        )

    async def _on_retry(self, content: dict[str, Any]) -> None:
        turn = await self._turn(content)
        if turn is not None:
            await socket_db(commands.turn_retry)(turn=turn)

    # --- the tree (docs/PROTOCOL.md "Branches") ----------------------------------------

    async def _on_edit(self, content: dict[str, Any]) -> None:
        text = content.get("text", "")
        attachment_ids = content.get("attachments")
        model = content.get("model")
        if (
            not isinstance(text, str)
            or not _is_seq(content.get("message"))
            or not _optional_seq(content.get("leaf"))
            or (
                attachment_ids is not None
                and (
                    not isinstance(attachment_ids, list)
                    or not all(isinstance(a, str) for a in attachment_ids)
                )
            )
            or (model is not None and not isinstance(model, str))
        ):
            await self._error(
                "edit takes message (a seq), text (string), attachments (ids), model and leaf."
            )
            return
        turn = await socket_db(commands.turn_edit)(
            session=self.session,
            user=self.user,
            message=content["message"],
            text=text,
            attachment_ids=attachment_ids,
            model=model,
            leaf=content.get("leaf"),
        )
        self._track(str(turn.pk))

    async def _on_regenerate(self, content: dict[str, Any]) -> None:
        model = content.get("model")
        if (
            not _is_seq(content.get("message"))
            or not _optional_seq(content.get("leaf"))
            or (model is not None and not isinstance(model, str))
        ):
            await self._error("regenerate takes message (a seq), model and leaf.")
            return
        turn = await socket_db(commands.turn_regenerate)(
            session=self.session,
            user=self.user,
            message=content["message"],
            model=model,
            leaf=content.get("leaf"),
        )
        self._track(str(turn.pk))

    async def _on_switch(self, content: dict[str, Any]) -> None:
        if not _is_seq(content.get("message")) or not _optional_seq(content.get("leaf")):
            await self._error("switch takes message (a seq) and leaf.")
            return
        await socket_db(commands.branch_switch)(
            session=self.session, message=content["message"], leaf=content.get("leaf")
        )

    async def _on_continue(self, content: dict[str, Any]) -> None:
        if not _optional_seq(content.get("leaf")):
            await self._error("continue takes turn and leaf.")
            return
        turn = await self._turn(content)
        if turn is None:
            return
        started = await socket_db(commands.turn_continue)(
            turn=turn, user=self.user, leaf=content.get("leaf")
        )
        self._track(str(started.pk))

    async def _on_resume(self, content: dict[str, Any]) -> None:
        turn = await self._turn(content)
        if turn is None:
            return
        after = content.get("after", 0)
        if not isinstance(after, int) or after < 0:
            await self._error("resume takes turn and after (a sequence number).")
            return
        turn_id = str(turn.pk)
        self.sent[turn_id] = max(self.sent.get(turn_id, 0), after)
        await self._fill(turn_id)

    async def _turn(self, content: dict[str, Any]) -> Any:
        turn = await socket_db(selectors.turn_get_for_session)(
            session=self.session, turn_id=content.get("turn")
        )
        if turn is None:
            await self._error("Unknown turn.")
        return turn

    async def _error(self, message: str) -> None:
        await self.send_json({"type": "error", "error": message})

    # --- server events -----------------------------------------------------------------

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' `dispatch` without its per-message `aclose_old_connections`, a thread
        hop each. Turn events never touch the database: at hundreds of streaming sockets
        those hops were the Daphne process's largest cost (bench/stream_path.py). The
        socket's own messages (connect, receive, disconnect) reach the database only
        through `socket_db`, whose calls release or keep their connection themselves, so
        the hop only cost them: about a tenth of Daphne's CPU per turn at K = 1000
        (py-spy, a turn's connect, send and disconnect)."""
        if message.get("type") == events.GROUP_MESSAGE_TYPE:
            await self.session_event(message)
            return
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        """Channels' `websocket_disconnect` without its `aclose_old_connections`, for the
        reason `dispatch` drops it: this socket reaches the database only through
        `socket_db`. The hop was a thread hand-off at every turn's end, while the next
        wave's turns were starting: 5 % of Daphne's samples on its loop and 9 % on the
        executor's thread (`bench/stream_path.py --ks 1000 --tokens 2 --profile`)."""
        for group in self.groups:
            await self.channel_layer.group_discard(group, self.channel_name)
        await self.disconnect(message["code"])
        raise StopConsumer()

    async def session_event(self, message: dict[str, Any]) -> None:
        event = message["event"]
        turn_id = event.get("turn")
        seq = event.get("seq")
        if not turn_id or not isinstance(seq, int):
            await self.send_json(event)
            return
        if seq > self.sent.get(turn_id, 0) + 1:
            await self._fill_gap(turn_id, seq)
            if seq > self.sent.get(turn_id, 0) + 1:
                # Held, with the gap before it: `_watch` re-reads the buffer (which the
                # worker repairs) and delivers in order at its next tick.
                held = self.held.setdefault(turn_id, {})
                if len(held) < MAX_HELD_EVENTS:
                    held[seq] = event
                self.tracking.setdefault(turn_id, 0.0)
                await self._fill(turn_id)
                return
        await self._deliver(event)

    async def user_event(self, message: dict[str, Any]) -> None:
        """Account notices: signed out (this browser session), password changed or
        deactivated (every session): close the socket."""
        event = message["event"]
        if event.get("type") != "account.closed":
            return
        key = event.get("session_key")
        if key and key != getattr(self.scope.get("session"), "session_key", None):
            return
        await self.close(code=CLOSE_UNAUTHENTICATED)

    async def _fill_gap(self, turn_id: str, seq: int) -> None:
        """Fill the events before `seq` from the replay buffer, waiting a little for any
        the buffer does not have yet: the worker appends and publishes on separate
        connections, so a publish can overtake the append of an earlier event. Past
        GAP_WAIT_SECONDS the socket moves on (the transcript is authoritative)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GAP_WAIT_SECONDS
        while True:
            await self._fill(turn_id)
            if self.sent.get(turn_id, 0) >= seq - 1 or loop.time() >= deadline:
                return
            await asyncio.sleep(GAP_RETRY_SECONDS)

    async def _fill(self, turn_id: str) -> None:
        """Send what the replay buffer has after this socket's position for the turn, up
        to the first hole in it (unless that gap has been open GAP_GIVE_UP_SECONDS)."""
        try:
            missed = await get_replay_buffer().read_after(turn_id, self.sent.get(turn_id, 0))
        except Exception:
            missed = []  # the transcript stays authoritative; the page reloads it
        held = self.held.pop(turn_id, {})
        by_seq = {**held, **{event["seq"]: event for event in missed}}
        for seq in sorted(by_seq):
            if seq > self.sent.get(turn_id, 0) + 1 and not self._gap_given_up(turn_id):
                # Keep what is past the gap for the next try.
                later = {k: v for k, v in held.items() if k >= seq}
                if later:
                    self.held[turn_id] = later
                return
            await self._deliver(by_seq[seq])

    def _gap_given_up(self, turn_id: str) -> bool:
        """Whether this socket has waited long enough at the turn's gap (noting when it
        first saw it)."""
        now = asyncio.get_running_loop().time()
        since = self.gaps.setdefault(turn_id, now)
        return now - since >= GAP_GIVE_UP_SECONDS

    async def _deliver(self, event: dict[str, Any]) -> None:
        """Send a turn event unless this socket already has it; `sent` only grows, so
        order is kept and nothing goes out twice whoever calls."""
        turn_id = event["turn"]
        async with self.deliver_lock:
            if event["seq"] <= self.sent.get(turn_id, 0):
                return
            await self.frame_send({"type": "websocket.send", "text": compact_json.dumps(event)})
            self.sent[turn_id] = event["seq"]
            self.gaps.pop(turn_id, None)  # progress: any wait at a gap starts again
        kind = event.get("type")
        if kind == "turn.status" and event.get("status") in SETTLED:
            self.tracking.pop(turn_id, None)
            self.queued.discard(turn_id)
        elif kind == "turn.queued":
            self.queued.add(turn_id)
            self._track(turn_id)
        elif kind != "turn.status" or event.get("status") == "running":
            self.queued.discard(turn_id)
            self._track(turn_id)

    def _track(self, turn_id: str) -> None:
        """Heard from the turn now (or re-read it): `_watch` re-reads its buffer after
        STALL_SECONDS of silence, QUEUED_STALL_SECONDS while it waits for a worker."""
        quiet = QUEUED_STALL_SECONDS - STALL_SECONDS if turn_id in self.queued else 0.0
        self.tracking[turn_id] = asyncio.get_running_loop().time() + quiet

    async def _watch(self) -> None:
        """Recover from dropped events: re-read the buffer of any active turn that has
        been silent on this socket. (Active turns this socket never heard of at all are
        found by the process's `IdleTurnWatch`.)"""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(STALL_SECONDS / 2)
            now = loop.time()
            for turn_id, last in list(self.tracking.items()):
                if now - last >= STALL_SECONDS:
                    self._track(turn_id)
                    await self._fill(turn_id)

    def wants_turn_poll(self) -> bool:
        """Whether the process's poll should look for this socket's turns: only while it
        knows of no active turn (one it tracks is recovered from its buffer, and a second
        turn's events name it), and not while its own send waits for the database (its
        turn is tracked when it returns; behind a burst of sends the database queue is
        the bottleneck: bench/stream_path.py --mode embedded)."""
        return not self.tracking and not self.sending

    def turns_found(self, turn_ids: set[str]) -> None:
        for turn_id in turn_ids - self.tracking.keys():
            self._track(turn_id)


class IdleTurnWatch:
    """Looks, every ACTIVE_POLL_SECONDS, for active turns that the idle sockets of this
    process's event loop never heard of, in one query for all of them.

    Each socket polling on its own was one query per idle socket per interval on
    Daphne's one sync thread: at 2,000 open sockets 400 queries a second, behind which
    new handshakes and sends queued until Daphne dropped them (bench/stream_path.py
    --ks 2000)."""

    def __init__(self) -> None:
        self._sockets: set[SessionConsumer] = set()
        self._task: asyncio.Task[None] | None = None

    def add(self, socket: SessionConsumer) -> None:
        self._sockets.add(socket)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def discard(self, socket: SessionConsumer) -> None:
        self._sockets.discard(socket)

    async def _run(self) -> None:
        while self._sockets:
            await asyncio.sleep(ACTIVE_POLL_SECONDS)
            idle = [socket for socket in self._sockets if socket.wants_turn_poll()]
            if not idle:
                continue
            try:
                active = await socket_db(_active_turn_ids_by_session)(
                    {socket.session_id for socket in idle}
                )
            except Exception:
                logger.warning("polling %d sockets for active turns failed", len(idle))
                continue
            for socket in idle:
                found = active.get(socket.session_id)
                if found and socket in self._sockets and socket.wants_turn_poll():
                    socket.turns_found(found)


_idle_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, IdleTurnWatch] = (
    weakref.WeakKeyDictionary()
)


def idle_watch() -> IdleTurnWatch:
    """The running event loop's watch."""
    loop = asyncio.get_running_loop()
    watch = _idle_watches.get(loop)
    if watch is None:
        watch = _idle_watches[loop] = IdleTurnWatch()
    return watch


async def _dispatch_each(
    sources: list[Callable[[], Awaitable[Any]]], dispatch: Callable[[Any], Awaitable[None]]
) -> None:
    """Dispatch every message of every source, one handler at a time (as Channels does),
    until a handler stops the consumer or fails.

    One long-lived reader per source: a message already queued is taken without
    suspending, where `await_many_dispatch` waits on all sources and starts a new task
    for each message: 14 % of the Daphne process's CPU at 200 streaming sockets
    (bench/stream_path.py)."""
    turn = asyncio.Lock()

    async def pump(source: Callable[[], Awaitable[Any]]) -> None:
        while True:
            message = await source()
            async with turn:
                await dispatch(message)

    readers = [asyncio.ensure_future(pump(source)) for source in sources]
    try:
        done, _ = await asyncio.wait(readers, return_when=asyncio.FIRST_COMPLETED)
        for reader in done:
            reader.result()  # StopConsumer, or a handler's error, goes to the caller
    finally:
        for reader in readers:
            reader.cancel()
        for reader in readers:
            with contextlib.suppress(asyncio.CancelledError, StopConsumer, Exception):
                await reader


def _below_session_middleware(send: Callable[[Any], Awaitable[None]]) -> Any:
    """The send under Channels' `InstanceSessionWrapper`, if `send` is its; else `send`."""
    wrapper = getattr(send, "__self__", None)
    if isinstance(wrapper, InstanceSessionWrapper):
        return wrapper.real_send
    return send


def frame_parse(text_data: str | None, bytes_data: bytes | None) -> tuple[Any, str | None]:
    """(the frame's JSON, None) or (None, why it is refused, naming the limit). Pure."""
    if text_data is None:
        return None, "Frames must be JSON text, not binary."
    if len(text_data.encode("utf-8", "surrogatepass")) > MAX_FRAME_BYTES:
        return None, f"Frames are limited to {MAX_FRAME_BYTES // 1024} KiB."
    try:
        content = json.loads(text_data)
    except RecursionError:
        return None, f"Frames may nest at most {MAX_FRAME_DEPTH} levels."
    except ValueError:
        return None, "Messages must be JSON."
    stack: list[tuple[Any, int]] = [(content, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)) and depth >= MAX_FRAME_DEPTH:
            return None, f"Frames may nest at most {MAX_FRAME_DEPTH} levels."
        if isinstance(value, dict):
            for key, item in value.items():
                problem = text_problem(f"The key {key[:40]!r}", key)
                if problem is not None:
                    return None, problem
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str):
            problem = text_problem("A text value", value)
            if problem is not None:
                return None, problem
    return content, None


def _active_turn_states(session: Any) -> list[dict[str, Any]]:
    states = []
    for turn in selectors.active_turns(session=session):
        state: dict[str, Any] = {"turn": str(turn.pk), "status": turn.status, "model": turn.model}
        if turn.status == turn.Status.AWAITING_APPROVAL:
            state["pending"] = selectors.turn_pending_calls(turn=turn)
        states.append(state)
    return states


def _active_turn_ids_by_session(session_ids: set[str]) -> dict[str, set[str]]:
    """Session id → its turns that are producing events (a turn awaiting approval is
    quiet by design)."""
    return selectors.active_turn_ids_by_session(session_ids=session_ids)


def _parse_resume(query_string: bytes) -> dict[str, int]:
    out: dict[str, int] = {}
    values = parse_qs(query_string.decode("latin-1")).get("resume", [])
    for value in values:
        for item in value.split(","):
            turn, _, seq = item.partition(":")
            if turn and seq.isdigit() and len(turn) <= 64:
                out[turn] = int(seq)
    return out
