"""Embedded mode in-process: the in-memory channel layer carries an event published by an
asyncio task (how embedded turns run) to a signed-in owner's websocket."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client

from openworker.asgi import application
from openworker.runtime.live import events
from sessions.models import Session
from sessions.tasks import publish_session_event

pytestmark = pytest.mark.django_db(transaction=True)
ORIGIN = (b"origin", b"http://127.0.0.1:8000")
# What a browser sends with it: the socket's own host and port (the origin check's rule).
HOST = (b"host", b"127.0.0.1:8000")


def cookie_for(user) -> bytes:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def connect(
    path: str, *headers: tuple[bytes, bytes]
) -> tuple[WebsocketCommunicator, bool, int | None]:
    communicator = WebsocketCommunicator(application, path, headers=[HOST, *headers])
    connected, code = await communicator.connect(timeout=5)
    return communicator, connected, code


async def test_owner_receives_an_event_published_from_an_asyncio_task(owner):
    session = await Session.objects.acreate(owner=owner, title="t")
    cookie = await sync_to_async(cookie_for)(owner)
    ws, connected, _ = await connect(f"/ws/sessions/{session.pk}/", ORIGIN, (b"cookie", cookie))
    assert connected
    hello = await ws.receive_json_from(timeout=5)
    assert hello == {"type": "hello", "session": str(session.pk), "turns": [], "leaf": None}

    task = asyncio.create_task(
        events.apublish(session.pk, {"type": "notice", "text": "from a task"})
    )
    await task
    assert await ws.receive_json_from(timeout=5) == {"type": "notice", "text": "from a task"}
    await ws.disconnect()


async def test_celery_task_runs_eagerly_in_embedded_mode_and_reaches_the_socket(owner):
    session = await Session.objects.acreate(owner=owner)
    cookie = await sync_to_async(cookie_for)(owner)
    ws, connected, _ = await connect(f"/ws/sessions/{session.pk}/", ORIGIN, (b"cookie", cookie))
    assert connected
    await ws.receive_json_from(timeout=5)
    await sync_to_async(publish_session_event.delay)(str(session.pk), {"type": "notice", "n": 1})
    assert await ws.receive_json_from(timeout=5) == {"type": "notice", "n": 1}
    await ws.disconnect()


async def test_anonymous_socket_is_closed(owner):
    session = await Session.objects.acreate(owner=owner)
    _ws, connected, code = await connect(f"/ws/sessions/{session.pk}/", ORIGIN)
    assert not connected
    assert code == 4401


async def test_another_users_socket_is_closed_as_not_found(owner, teammate):
    session = await Session.objects.acreate(owner=owner)
    cookie = await sync_to_async(cookie_for)(teammate)
    _ws, connected, code = await connect(f"/ws/sessions/{session.pk}/", ORIGIN, (b"cookie", cookie))
    assert not connected
    assert code == 4404


async def test_forged_origin_is_refused(owner):
    session = await Session.objects.acreate(owner=owner)
    cookie = await sync_to_async(cookie_for)(owner)
    _ws, connected, _ = await connect(
        f"/ws/sessions/{session.pk}/", (b"origin", b"https://evil.example"), (b"cookie", cookie)
    )
    assert not connected


async def test_a_closed_socket_leaves_its_groups_without_a_thread_hop(owner, monkeypatch):
    """The socket reaches the database only through `socket_db`, so its disconnect skips
    Channels' `aclose_old_connections` (a thread hand-off at every turn's end) and still
    leaves the session's and the user's groups."""
    hops: list[str] = []

    async def counting_close() -> None:
        hops.append("aclose_old_connections")

    monkeypatch.setattr("channels.generic.websocket.aclose_old_connections", counting_close)
    session = await Session.objects.acreate(owner=owner)
    cookie = await sync_to_async(cookie_for)(owner)
    layer = get_channel_layer()
    groups = (events.session_group(session.pk), events.user_group(owner.pk))
    before = {group: set(layer.groups.get(group, ())) for group in groups}
    ws, connected, _ = await connect(f"/ws/sessions/{session.pk}/", ORIGIN, (b"cookie", cookie))
    assert connected
    await ws.receive_json_from(timeout=5)
    # This socket's channel, in both its session's and its user's group.
    added = [set(layer.groups.get(group, ())) - before[group] for group in groups]
    assert len(added[0]) == 1 and added[0] == added[1], added

    await ws.disconnect()
    await ws.wait()
    assert hops == []
    for group in groups:
        assert not added[0] & set(layer.groups.get(group, ())), group
