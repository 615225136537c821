"""The web process's text frames, written in one step.

Every streamed delta leaves Daphne as a websocket text frame. Autobahn's `sendMessage`
builds it through a path made for every case (type assertions, traffic counters,
compression, fragmenting, masking, fuzzing lengths, frame and octet logging, a debug log
call): most of Daphne's CPU from a socket's `send` to the transport (py-spy of
bench/stream_path.py, docs/PERFORMANCE.md session 23). A server's unmasked,
unfragmented, uncompressed text frame is a header of two, four or ten bytes and the
UTF-8 payload (RFC 6455, section 5.2): written here directly when nothing else applies,
by autobahn otherwise.
"""

from __future__ import annotations

from typing import Any

from daphne.ws_protocol import WebSocketFactory, WebSocketProtocol

_FIN_TEXT = 0x81  # FIN, no RSV bits (no extension), opcode 1 (text)


def text_frame_header(length: int) -> bytes:
    """The header of a final, unmasked text frame carrying `length` payload bytes."""
    if length <= 125:
        return bytes((_FIN_TEXT, length))
    if length <= 0xFFFF:
        return bytes((_FIN_TEXT, 126)) + length.to_bytes(2, "big")
    return bytes((_FIN_TEXT, 127)) + length.to_bytes(8, "big")


class FramingWebSocketProtocol(WebSocketProtocol):
    """Daphne's websocket protocol, its plain text frames written directly."""

    def serverSend(self, content: Any, binary: bool = False) -> None:
        if (
            binary
            or self.state != self.STATE_OPEN
            or self._perMessageCompress is not None
            or self.send_queue
            or self.autoFragmentSize
            or self.maskServerFrames
            or self.trackedTimings
            or self.logFrames
            or self.logOctets
        ):
            super().serverSend(content, binary)
            return
        payload = content.encode("utf8")
        if 0 < self.maxMessagePayloadSize < len(payload):
            super().serverSend(content, binary)  # autobahn's refusal, as before
            return
        self.transport.write(text_frame_header(len(payload)) + payload)


class FramingWebSocketFactory(WebSocketFactory):
    protocol = FramingWebSocketProtocol


def frame_text_directly() -> None:
    """Have Daphne's server build its websocket factory (in `Server.run`) from this
    module's: its name is looked up in `daphne.server` when the server runs."""
    from daphne import server

    server.WebSocketFactory = FramingWebSocketFactory  # type: ignore[misc]
