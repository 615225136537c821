"""Sockets do not outlive the sign-in that opened them."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from openworker.asgi import application
from sessions.models import Session

pytestmark = pytest.mark.django_db(transaction=True)


async def signed_in_socket(user, session) -> tuple[WebsocketCommunicator, Client]:
    client = Client()
    await sync_to_async(client.force_login)(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    ws = WebsocketCommunicator(
        application,
        f"/ws/sessions/{session.pk}/",
        headers=[
            (b"origin", b"http://127.0.0.1:8000"),
            (b"host", b"127.0.0.1:8000"),
            (b"cookie", cookie),
        ],
    )
    connected, _ = await ws.connect(timeout=5)
    assert connected
    await ws.receive_json_from(timeout=5)
    return ws, client


async def assert_closed(ws: WebsocketCommunicator) -> None:
    output = await ws.receive_output(timeout=5)
    assert output == {"type": "websocket.close", "code": 4401}


async def test_signing_out_closes_that_browsers_socket_but_not_another(owner):
    session = await Session.objects.acreate(owner=owner)
    ws1, client1 = await signed_in_socket(owner, session)
    ws2, _ = await signed_in_socket(owner, session)
    await sync_to_async(client1.post)("/accounts/logout/")
    await assert_closed(ws1)
    assert await ws2.receive_nothing(timeout=0.5)
    await ws2.disconnect()


async def test_a_password_change_closes_every_socket_of_the_user(owner):
    session = await Session.objects.acreate(owner=owner)
    ws1, _ = await signed_in_socket(owner, session)
    ws2, _ = await signed_in_socket(owner, session)

    def change() -> None:
        owner.set_password("a-brand-new-pass-9")
        owner.save()

    await sync_to_async(change)()
    await assert_closed(ws1)
    await assert_closed(ws2)


async def test_deactivation_closes_the_users_sockets(owner, teammate):
    session = await Session.objects.acreate(owner=owner)
    other = await Session.objects.acreate(owner=teammate)
    ws, _ = await signed_in_socket(owner, session)
    bystander, _ = await signed_in_socket(teammate, other)

    def deactivate() -> None:
        owner.is_active = False
        owner.save()

    await sync_to_async(deactivate)()
    await assert_closed(ws)
    assert await bystander.receive_nothing(timeout=0.5)
    await bystander.disconnect()


async def test_oversized_frames_get_an_error_and_the_socket_stays_open(owner):
    session = await Session.objects.acreate(owner=owner)
    ws, _ = await signed_in_socket(owner, session)
    await ws.send_to(text_data='{"type":"send","text":"' + "x" * 70_000 + '"}')
    error = await ws.receive_json_from(timeout=5)
    assert error == {"type": "error", "error": "Frames are limited to 64 KiB."}
    await ws.send_json_to({"type": "nope"})
    assert (await ws.receive_json_from(timeout=5))["type"] == "error"
    await ws.disconnect()
