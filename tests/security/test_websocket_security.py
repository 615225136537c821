"""Websocket security: the handshake (Origin, sign-in, ownership), per-frame authorisation,
frame size, and revocation of open sockets, in-process and through a real Daphne."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from openworker.asgi import application
from sessions.models import Session, Turn
from tests.security.figures import record
from tests.support.chat import session_cookie

ORIGIN = b"http://127.0.0.1:8000"
# DESIGN.md: sign-out, password change and deactivation close sockets within 60 s.
REVOCATION_DEADLINE_SECONDS = 60


async def handshake(path: str, *headers: tuple[bytes, bytes]) -> tuple[Any, bool, Any]:
    # A browser's handshake names the socket's host and port (the origin check's rule).
    ws = WebsocketCommunicator(application, path, headers=[(b"host", b"127.0.0.1:8000"), *headers])
    connected, code = await ws.connect(timeout=5)
    return ws, connected, code


async def cookie(user: Any) -> tuple[bytes, bytes]:
    return (b"cookie", (await sync_to_async(session_cookie)(user)).encode())


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "origin",
    [
        None,
        b"null",
        b"https://evil.example",
        b"http://127.0.0.1.evil.example",
        b"http://evil.example:8000",
        b"file://",
        b"",
    ],
)
async def test_a_forged_missing_or_null_origin_is_refused(owner: Any, origin: bytes | None) -> None:
    session = await Session.objects.acreate(owner=owner)
    headers = [await cookie(owner)] + ([(b"origin", origin)] if origin is not None else [])
    _ws, connected, _ = await handshake(f"/ws/sessions/{session.pk}/", *headers)
    assert not connected
    record("ws.origins_refused", 1, "forged/missing/null Origin handshakes refused")


@pytest.mark.django_db(transaction=True)
async def test_anonymous_and_other_users_are_refused(owner: Any, teammate: Any) -> None:
    session = await Session.objects.acreate(owner=owner)
    path = f"/ws/sessions/{session.pk}/"
    _ws, connected, code = await handshake(path, (b"origin", ORIGIN))
    assert (connected, code) == (False, 4401)
    _ws, connected, code = await handshake(path, (b"origin", ORIGIN), await cookie(teammate))
    assert (connected, code) == (False, 4404)
    _ws, connected, _ = await handshake(
        path, (b"origin", ORIGIN), (b"cookie", b"sessionid=forged-session-key")
    )
    assert not connected
    record("ws.handshakes_refused", 3, "anonymous / other user / forged cookie handshakes refused")


@pytest.mark.django_db(transaction=True)
async def test_a_socket_of_one_session_cannot_act_on_a_turn_of_another(
    owner: Any, teammate: Any
) -> None:
    mine = await Session.objects.acreate(owner=owner)
    my_other = await Session.objects.acreate(owner=owner)
    theirs = await Session.objects.acreate(owner=teammate)
    targets = []
    for session, status in ((my_other, "running"), (theirs, "running"), (theirs, "failed")):
        targets.append(await Turn.objects.acreate(session=session, model="m", status=status))
    paused = await Turn.objects.acreate(
        session=theirs, model="m", status="awaiting_approval", approvals={}
    )
    targets.append(paused)
    before = [await sync_to_async(_state)(t.pk) for t in targets]

    ws, connected, _ = await handshake(
        f"/ws/sessions/{mine.pk}/", (b"origin", ORIGIN), await cookie(owner)
    )
    assert connected
    assert (await ws.receive_json_from(timeout=5))["type"] == "hello"
    frames = 0
    for turn in targets:
        for message in (
            {"type": "stop", "turn": str(turn.pk)},
            {"type": "approve", "turn": str(turn.pk), "call_id": "call_1"},
            {"type": "deny", "turn": str(turn.pk), "call_id": "call_1"},
            {"type": "retry", "turn": str(turn.pk)},
            {"type": "resume", "turn": str(turn.pk), "after": 0},
        ):
            await ws.send_json_to(message)
            reply = await ws.receive_json_from(timeout=5)
            frames += 1
            assert reply == {"type": "error", "error": "Unknown turn."}, (message, reply)
            # approve/deny add a second error frame (a usage hint); nothing else may come.
            while not await ws.receive_nothing(timeout=0.05):
                assert (await ws.receive_json_from(timeout=1))["type"] == "error"
    assert await ws.receive_nothing(timeout=0.2)
    await ws.disconnect()
    after = [await sync_to_async(_state)(t.pk) for t in targets]
    assert after == before
    record("ws.cross_session_frames", frames, "frames aimed at another session's turn refused")


def _state(turn_id: Any) -> dict[str, Any]:
    return (
        Turn.objects.filter(pk=turn_id)
        .values("status", "cancel_requested", "approvals", "attempts")
        .get()
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["text", "bytes"])
async def test_frames_over_64_kib_are_refused_and_the_socket_stays_open(
    owner: Any, kind: str
) -> None:
    session = await Session.objects.acreate(owner=owner)
    ws, connected, _ = await handshake(
        f"/ws/sessions/{session.pk}/", (b"origin", ORIGIN), await cookie(owner)
    )
    assert connected
    await ws.receive_json_from(timeout=5)
    payload = '{"type":"send","text":"' + "x" * (64 * 1024) + '"}'
    if kind == "text":
        await ws.send_to(text_data=payload)
    else:
        await ws.send_to(bytes_data=payload.encode())
    error = await ws.receive_json_from(timeout=5)
    assert error["type"] == "error"
    assert ("64 KiB" if kind == "text" else "not binary") in error["error"]
    assert not await Turn.objects.filter(session=session).aexists()
    await ws.send_json_to({"type": "nope"})
    assert (await ws.receive_json_from(timeout=5))["type"] == "error"  # still answering
    await ws.disconnect()
    record("ws.oversized_frames", 1, "frames over 64 KiB refused with an error; socket kept")


# --- revocation through a real Daphne (distributed) ----------------------------------


def _closed_within(ws: Any, deadline: float) -> tuple[bool, float, Any]:
    """Read until the socket closes; (closed, seconds, close code)."""
    from websockets.exceptions import ConnectionClosed

    started = time.monotonic()
    while time.monotonic() - started < deadline:
        try:
            ws.recv(timeout=1)
        except TimeoutError:
            continue
        except ConnectionClosed as exc:
            return True, time.monotonic() - started, exc.rcvd.code if exc.rcvd else None
    return False, deadline, None


@pytest.mark.distributed
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("event", ["sign-out", "password change", "deactivation"])
def test_revocation_closes_sockets_through_daphne(
    daphne_server: str, owner: Any, event: str
) -> None:
    from websockets.sync.client import connect

    session = Session.objects.create(owner=owner)
    browser = Client()
    browser.force_login(owner)
    url = daphne_server.replace("http://", "ws://") + f"/ws/sessions/{session.pk}/"
    headers = {
        "Cookie": f"sessionid={browser.cookies['sessionid'].value}",
        "Origin": daphne_server,
    }
    with connect(url, additional_headers=headers, open_timeout=10) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "hello"
        if event == "sign-out":
            browser.post("/accounts/logout/")
        elif event == "password change":
            owner.set_password("a-brand-new-pass-77")
            owner.save()
        else:
            owner.is_active = False
            owner.save()
        closed, seconds, code = _closed_within(ws, REVOCATION_DEADLINE_SECONDS)
    assert closed and code == 4401, (closed, code)
    assert seconds < REVOCATION_DEADLINE_SECONDS
    record("ws.revocations_daphne", 1, "revocations closed the socket through Daphne (< 60 s)")
