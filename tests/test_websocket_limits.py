"""The session socket's limits and origin rule: a bad frame (too big, too deep, binary,
NUL or unpaired surrogates) gets an error naming the limit and the socket keeps working;
an unexpected failure is logged and answered; the Origin must match scheme, host and port
(or CSRF_TRUSTED_ORIGINS), in process and through a real Daphne."""

from __future__ import annotations

import logging

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from openworker.asgi import application, origin_allowed
from openworker.runtime.turns import commands
from sessions.consumers import MAX_FRAME_DEPTH
from sessions.models import Message, Session, Turn
from tests.support.chat import session_cookie

HOST = (b"host", b"127.0.0.1:8000")
ORIGIN = (b"origin", b"http://127.0.0.1:8000")


async def socket(user, session, *headers: tuple[bytes, bytes]) -> WebsocketCommunicator:
    cookie = (b"cookie", (await sync_to_async(session_cookie)(user)).encode())
    ws = WebsocketCommunicator(
        application, f"/ws/sessions/{session.pk}/", headers=[*(headers or (HOST, ORIGIN)), cookie]
    )
    connected, _ = await ws.connect(timeout=5)
    assert connected
    assert (await ws.receive_json_from(timeout=5))["type"] == "hello"
    return ws


async def still_answers(ws: WebsocketCommunicator) -> None:
    await ws.send_json_to({"type": "nope"})
    reply = await ws.receive_json_from(timeout=5)
    assert reply == {"type": "error", "error": "Unknown message type 'nope'."}


BAD_FRAMES = [
    ('{"type":"send","text":"' + "x" * 70_000 + '"}', "limited to 64 KiB"),
    ('{"type":"send","text":"hi","attachments":' + "[" * 5_000 + "]" * 5_000 + "}", "nest at most"),
    ('{"type":"send","text":"hi","attachments":' + "[" * 20 + "]" * 20 + "}", "nest at most"),
    ('{"type":"send","text":"a\\u0000b"}', "contains a NUL character"),
    ('{"type":"send","text":"a\\ud800b"}', "not valid text"),
    ('{"type":"send","\\u0000":"x"}', "contains a NUL character"),
    ("not json", "must be JSON"),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("frame", "reason"), BAD_FRAMES)
async def test_a_bad_frame_gets_an_error_naming_the_limit_and_the_socket_keeps_working(
    owner, frame, reason
):
    session = await Session.objects.acreate(owner=owner)
    ws = await socket(owner, session)
    await ws.send_to(text_data=frame)
    error = await ws.receive_json_from(timeout=5)
    assert error["type"] == "error" and reason in error["error"]
    await still_answers(ws)
    assert not await Turn.objects.filter(session=session).aexists()
    assert not await Message.objects.filter(session=session).aexists()
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_binary_frame_gets_an_error_and_the_socket_keeps_working(owner):
    session = await Session.objects.acreate(owner=owner)
    ws = await socket(owner, session)
    await ws.send_to(bytes_data=b'{"type":"send","text":"hi"}')
    assert "not binary" in (await ws.receive_json_from(timeout=5))["error"]
    await still_answers(ws)
    await ws.disconnect()


def test_the_depth_limit_admits_our_own_messages():
    from sessions.consumers import frame_parse

    content, problem = frame_parse('{"type":"send","text":"hi","attachments":["a","b"]}', None)
    assert problem is None and content["attachments"] == ["a", "b"]
    deep = "[" * MAX_FRAME_DEPTH + "]" * MAX_FRAME_DEPTH
    assert frame_parse(deep, None)[1] is None
    assert frame_parse("[" + deep + "]", None)[1] is not None


@pytest.mark.django_db(transaction=True)
async def test_an_unexpected_failure_is_logged_answered_and_the_socket_survives(
    owner, monkeypatch, caplog
):
    def broken(**kwargs):
        raise RuntimeError("boom in turn_send")

    monkeypatch.setattr(commands, "turns_send", broken)
    session = await Session.objects.acreate(owner=owner)
    ws = await socket(owner, session)
    with caplog.at_level(logging.ERROR, logger="sessions.consumers"):
        await ws.send_json_to({"type": "send", "text": "hi"})
        error = await ws.receive_json_from(timeout=5)
    assert "went wrong on our side" in error["error"]
    assert "boom in turn_send" not in error["error"]
    assert any("a client message failed" in r.getMessage() for r in caplog.records)
    assert any("boom in turn_send" in (r.exc_text or "") for r in caplog.records)
    await still_answers(ws)
    await ws.disconnect()


# --- the Origin rule ---------------------------------------------------------------------

HOSTS = ["127.0.0.1", "localhost", "openworker.lan"]


def allowed(origin: str, host: str, *, secure: bool = False, trusted=(), proxy=None) -> bool:
    headers = [(b"origin", origin.encode()), (b"host", host.encode())]
    return origin_allowed(
        headers,
        secure=secure,
        allowed_hosts=HOSTS,
        trusted_origins=list(trusted),
        proxy_ssl_header=proxy,
    )


def test_the_origin_must_match_scheme_host_and_port():
    assert allowed("http://127.0.0.1:8000", "127.0.0.1:8000")
    assert not allowed("http://127.0.0.1:9999", "127.0.0.1:8000")  # another port
    assert not allowed("https://127.0.0.1:8000", "127.0.0.1:8000")  # another scheme
    assert not allowed("http://localhost:8000", "127.0.0.1:8000")  # another host
    assert allowed("https://openworker.lan", "openworker.lan", secure=True)
    assert allowed("https://openworker.lan", "openworker.lan:443", secure=True)
    assert not allowed("http://openworker.lan", "openworker.lan", secure=True)
    assert not allowed("http://evil.example", "evil.example")  # host not allowed


def test_trusted_origins_and_the_tls_proxy_header_follow_the_csrf_rule():
    assert allowed(
        "https://chat.example.com", "10.0.0.5:8000", trusted=["https://chat.example.com"]
    )
    assert allowed("https://a.example.com", "10.0.0.5:8000", trusted=["https://*.example.com"])
    assert not allowed("http://a.example.com", "10.0.0.5:8000", trusted=["https://*.example.com"])
    proxy = ("HTTP_X_FORWARDED_PROTO", "https")
    headers = [
        (b"origin", b"https://openworker.lan"),
        (b"host", b"openworker.lan"),
        (b"x-forwarded-proto", b"https"),
    ]
    assert origin_allowed(
        headers, secure=False, allowed_hosts=HOSTS, trusted_origins=[], proxy_ssl_header=proxy
    )
    assert not allowed("https://openworker.lan", "openworker.lan")  # no proxy header trusted


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "origin",
    [b"http://127.0.0.1:9999", b"https://127.0.0.1:8000", b"null", b"http://localhost:8000"],
)
async def test_a_page_on_another_port_or_scheme_cannot_open_the_socket(owner, origin):
    session = await Session.objects.acreate(owner=owner)
    cookie = (b"cookie", (await sync_to_async(session_cookie)(owner)).encode())
    ws = WebsocketCommunicator(
        application, f"/ws/sessions/{session.pk}/", headers=[HOST, (b"origin", origin), cookie]
    )
    connected, _ = await ws.connect(timeout=5)
    assert not connected


@pytest.mark.distributed
@pytest.mark.django_db(transaction=True)
def test_daphne_refuses_an_origin_on_another_port(daphne_server, owner):
    session = Session.objects.create(owner=owner)
    url = daphne_server.replace("http://", "ws://") + f"/ws/sessions/{session.pk}/"
    other_port = daphne_server.rsplit(":", 1)[0] + ":1"
    headers = {"Cookie": session_cookie(owner), "Origin": other_port}
    with pytest.raises(InvalidStatus) as excinfo:
        connect(url, additional_headers=headers, open_timeout=10)
    assert excinfo.value.response.status_code == 403
    headers["Origin"] = daphne_server
    with connect(url, additional_headers=headers, open_timeout=10) as ws:
        assert '"hello"' in ws.recv(timeout=10)
        ws.send('{"type":"send","text":"hi","attachments":' + "[" * 3000 + "]" * 3000 + "}")
        assert "nest at most" in ws.recv(timeout=10)
        ws.send('{"type":"nope"}')
        assert "Unknown message type" in ws.recv(timeout=10)
