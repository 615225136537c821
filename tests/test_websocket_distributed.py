"""Distributed mode with real processes: a Celery worker publishes to a session's
channel-layer group (Redis) and a websocket client, connected through a Daphne process as
the signed-in owner, receives it."""

from __future__ import annotations

import json

import httpx
import pytest
from django.test import Client
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from sessions.models import Session
from sessions.tasks import publish_session_event

pytestmark = [pytest.mark.distributed, pytest.mark.django_db(transaction=True)]


def ws_url(base: str, session: Session) -> str:
    return base.replace("http://", "ws://") + f"/ws/sessions/{session.pk}/"


def cookie_for(user) -> str:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def test_worker_event_reaches_the_owners_socket_through_daphne(daphne_server, celery_worker, owner):
    session = Session.objects.create(owner=owner, title="distributed")
    headers = {"Cookie": cookie_for(owner), "Origin": daphne_server}
    with connect(ws_url(daphne_server, session), additional_headers=headers, open_timeout=10) as ws:
        hello = json.loads(ws.recv(timeout=10))
        assert hello == {"type": "hello", "session": str(session.pk), "turns": [], "leaf": None}
        publish_session_event.delay(str(session.pk), {"type": "notice", "text": "from the worker"})
        assert json.loads(ws.recv(timeout=20)) == {"type": "notice", "text": "from the worker"}


def test_daphne_refuses_another_users_socket_at_the_handshake(daphne_server, owner, teammate):
    # Closed before accept: Daphne answers the handshake with 403, revealing nothing.
    session = Session.objects.create(owner=owner)
    headers = {"Cookie": cookie_for(teammate), "Origin": daphne_server}
    with pytest.raises(InvalidStatus) as excinfo:
        connect(ws_url(daphne_server, session), additional_headers=headers, open_timeout=10)
    assert excinfo.value.response.status_code == 403


def test_daphne_refuses_a_forged_origin(daphne_server, owner):
    session = Session.objects.create(owner=owner)
    headers = {"Cookie": cookie_for(owner), "Origin": "https://evil.example"}
    with pytest.raises(InvalidStatus) as excinfo:
        connect(ws_url(daphne_server, session), additional_headers=headers, open_timeout=10)
    assert excinfo.value.response.status_code == 403


def test_healthz_checks_postgres_redis_and_the_broker(daphne_server):
    data = httpx.get(f"{daphne_server}/healthz", timeout=10).json()
    assert data["mode"] == "distributed"
    assert data["status"] == "ok"
    assert data["checks"]["database"]["detail"] == "postgresql"
    assert set(data["checks"]) == {"database", "channel_layer", "broker"}
