"""Helpers for chat integration tests: provider profiles pointing at a fake upstream,
signed-in cookies, and reading a socket until a turn settles."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

from django.contrib.auth import get_user_model
from django.test import Client
from websockets.sync.client import ClientConnection, connect

from providers.edge.models import ProviderProfile
from sessions.models import Session

TERMINAL = {"completed", "failed", "cancelled", "interrupted", "awaiting_approval"}


def point_provider_at(user: Any, provider: str, base_url: str, api_key: str = "test-key") -> None:
    profile, _ = ProviderProfile.objects.get_or_create(owner=user, provider=provider)
    profile.set_api_key(api_key)
    profile.base_url = base_url
    profile.save()


def users_with_a_session(
    count: int, fake_base_url: str, *, prefix: str, model: str
) -> list[tuple[Any, Session]]:
    """`count` users (`<prefix>-<n>`), each with one session on `model`, their Anthropic
    key pointed at the fake at `fake_base_url`."""
    pairs = []
    for index in range(count):
        user = get_user_model().objects.create_user(f"{prefix}-{index}", password=None)
        point_provider_at(user, "anthropic", fake_base_url)
        pairs.append((user, Session.objects.create(owner=user, model=model)))
    return pairs


def session_cookie(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


async def read_until_status(
    ws: Any, statuses: set[str] = TERMINAL, timeout: float = 20
) -> list[dict]:
    """Receive events (channels WebsocketCommunicator) until a turn.status in `statuses`."""
    events: list[dict] = []
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no terminal status within {timeout}s; got {events}")
        event = await ws.receive_json_from(timeout=remaining)
        events.append(event)
        if event.get("type") == "turn.status" and event.get("status") in statuses:
            return events


def read_sync_until_status(
    ws: Any, statuses: set[str] = TERMINAL, timeout: float = 30
) -> list[dict]:
    """The same for a `websockets.sync` client."""
    events: list[dict] = []
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no terminal status within {timeout}s; got {events}")
        event = json.loads(ws.recv(timeout=remaining))
        events.append(event)
        if event.get("type") == "turn.status" and event.get("status") in statuses:
            return events


def streamed_text(events: list[dict]) -> str:
    return "".join(e.get("text", "") for e in events if e.get("type") == "delta")


def assert_gapless(events: list[dict]) -> None:
    """Per turn, sequence numbers are 1..n (or a contiguous run) with no repeat."""
    by_turn: dict[str, list[int]] = {}
    for event in events:
        if "turn" in event and isinstance(event.get("seq"), int):
            by_turn.setdefault(event["turn"], []).append(event["seq"])
    for turn, seqs in by_turn.items():
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (turn, seqs)


async def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError("condition not met in time")


@contextlib.contextmanager
def open_ws(base: str, user: Any, session: Any, query: str = "") -> Iterator[ClientConnection]:
    """A signed-in websocket to a Daphne process; the hello is read and checked."""
    url = base.replace("http://", "ws://") + f"/ws/sessions/{session.pk}/"
    if query:
        url += f"?{query}"
    headers = {"Cookie": session_cookie(user), "Origin": base}
    with connect(url, additional_headers=headers, open_timeout=10) as ws:
        hello = json.loads(ws.recv(timeout=10))
        assert hello["type"] == "hello"
        yield ws


def wait_for_turn_status(turn_id: Any, statuses: set[str], timeout: float) -> tuple[Any, float]:
    """Poll the database until the turn reaches one of `statuses`; returns (turn, seconds)."""
    from sessions.models import Turn

    started = time.monotonic()
    while time.monotonic() - started < timeout:
        turn = Turn.objects.get(pk=turn_id)
        if turn.status in statuses:
            return turn, time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"turn still {Turn.objects.get(pk=turn_id).status} after {timeout}s")
