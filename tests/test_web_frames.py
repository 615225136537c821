"""The web process's text frames (`openworker.web_frames`): written directly, they are
byte for byte what autobahn writes; anything but a plain text frame on an open socket
goes through autobahn."""

from __future__ import annotations

from typing import Any

import pytest
from autobahn.websocket.protocol import WebSocketProtocol as AutobahnProtocol
from daphne import server
from daphne.ws_protocol import WebSocketProtocol
from twisted.internet.testing import StringTransport

from openworker import web_frames
from openworker.web_frames import (
    FramingWebSocketFactory,
    FramingWebSocketProtocol,
    frame_text_directly,
    text_frame_header,
)


def opened(cls: type[WebSocketProtocol]) -> tuple[Any, StringTransport]:
    """A socket of `cls` past its handshake, its options from the factory Daphne uses."""
    socket = cls()
    socket.factory = FramingWebSocketFactory(None)
    transport = StringTransport()
    socket.transport = transport
    AutobahnProtocol._connectionMade(socket)  # the factory's options, the send queue
    socket.state = socket.STATE_OPEN
    socket.client_addr = None  # Daphne's debug line names it
    return socket, transport


def test_the_header_carries_the_length_in_one_two_or_eight_bytes() -> None:
    assert text_frame_header(0) == b"\x81\x00"
    assert text_frame_header(125) == b"\x81\x7d"
    assert text_frame_header(126) == b"\x81\x7e\x00\x7e"
    assert text_frame_header(0xFFFF) == b"\x81\x7e\xff\xff"
    assert text_frame_header(0x10000) == b"\x81\x7f" + (0x10000).to_bytes(8, "big")


@pytest.mark.parametrize("text", ["", "a", "x" * 125, "x" * 126, "é" * 40_000, "y" * 70_000])
def test_a_text_frame_is_written_as_autobahn_writes_it(text: str) -> None:
    direct, written = opened(FramingWebSocketProtocol)
    stock, expected = opened(WebSocketProtocol)
    direct.serverSend(text)
    stock.serverSend(text)
    assert written.value() == expected.value()


class Recorded(FramingWebSocketProtocol):
    """Records the sends handed on to Daphne's (and so autobahn's) own path."""

    def sendMessage(self, payload: bytes, isBinary: bool = False, **options: Any) -> None:
        self.handed_on.append(payload)


@pytest.mark.parametrize(
    "setting",
    ["binary", "compressed", "queued", "masked", "fragmented", "logged", "too large"],
)
def test_anything_but_a_plain_text_frame_goes_through_autobahn(setting: str) -> None:
    socket, transport = opened(Recorded)
    socket.handed_on = []
    socket.serverSend("plain")
    assert socket.handed_on == [] and transport.value() == b"\x81\x05plain"
    if setting == "compressed":
        socket._perMessageCompress = object()
    elif setting == "queued":
        socket.send_queue.append((b"earlier", False))
    elif setting == "masked":
        socket.maskServerFrames = True
    elif setting == "fragmented":
        socket.autoFragmentSize = 4
    elif setting == "logged":
        socket.logOctets = True
    elif setting == "too large":
        socket.maxMessagePayloadSize = 3  # autobahn refuses it
    if setting == "binary":
        socket.serverSend(b"bytes", True)
    else:
        socket.serverSend("plain")
    assert len(socket.handed_on) == 1
    assert transport.value() == b"\x81\x05plain"  # nothing more written directly


def test_the_web_server_builds_its_websocket_factory_from_this_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server, "WebSocketFactory", server.WebSocketFactory)  # restored
    frame_text_directly()
    assert server.WebSocketFactory is FramingWebSocketFactory
    assert web_frames.FramingWebSocketFactory.protocol is FramingWebSocketProtocol
