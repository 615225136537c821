"""The web process's access log: every request is logged, no query string is (OAuth and
SSO callbacks carry an authorization code and state there)."""

from __future__ import annotations

import time
from collections import deque

import click
import httpx
from autobahn.twisted import websocket as twisted_websocket
from autobahn.websocket import protocol
from autobahn.websocket.protocol import TrafficStats
from twisted.internet.testing import StringTransport

from openworker.web_server import (
    REDACTED_QUERY,
    path_without_query,
    plain_autobahn_log_arguments,
)
from tests.support import embedded

SECRET_CODE = "c0de-0f-the-callback-Zq81"
LAST = "/last-request-of-the-test"


def test_a_query_string_is_replaced_by_a_marker_and_a_plain_path_is_kept():
    assert path_without_query("/sso/callback?code=a&state=b") == "/sso/callback" + REDACTED_QUERY
    assert path_without_query("/sessions/?q=") == "/sessions/" + REDACTED_QUERY
    assert path_without_query("/healthz") == "/healthz"


def test_the_access_log_keeps_requests_and_leaves_their_query_strings_out(tmp_path):
    env = embedded.embedded_env(tmp_path)
    embedded.manage(env, "migrate", "--noinput")
    with embedded.daphne(env) as (base, proc):
        for path in (
            f"/healthz?code={SECRET_CODE}",
            f"/mcp/oauth/callback?code={SECRET_CODE}&state={SECRET_CODE}",
            f"/accounts/sso/callback/?code={SECRET_CODE}&state=s",
            LAST,
        ):
            httpx.get(base + path, timeout=10)
        # Daphne writes a request's line just after its response: wait for the last one.
        deadline = time.monotonic() + 10
        while LAST not in (output := proc.output()) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert f'"GET /healthz{REDACTED_QUERY}" 200' in output
    assert f'"GET {LAST}" 404' in output  # a request without a query, as Daphne logs it
    assert SECRET_CODE not in output


def test_autobahn_sends_a_frame_without_styling_its_debug_log_arguments(monkeypatch):
    # Autobahn builds a debug line's arguments for every frame, logged or not; the web
    # process gives it plain helpers (`plain_autobahn_log_arguments`).
    for module in (protocol, twisted_websocket):
        monkeypatch.setattr(module, "hltype", module.hltype)  # restored after the test
        monkeypatch.setattr(module, "hlval", module.hlval)
    styled: list[str] = []
    monkeypatch.setattr(click, "style", lambda text, **_: styled.append(text) or text)
    sender = twisted_websocket.WebSocketServerProtocol()
    sender.transport = StringTransport()
    sender.state = sender.STATE_OPEN
    sender.send_queue = deque()  # as `_connectionMade` sets it
    sender.trafficStats = TrafficStats()
    sender.logOctets = False
    sender.sendData(b"frame")
    assert styled, "autobahn no longer styles its log arguments: drop the plain helpers"

    styled.clear()
    plain_autobahn_log_arguments()
    sender.sendData(b"frame")
    assert sender.transport.value() == b"frameframe"
    assert styled == []
