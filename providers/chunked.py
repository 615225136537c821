"""The data chunks of an HTTP/1.1 chunked body (RFC 9112 §7.1), decoded without h11.

A streamed reply arrives as one small chunk per event, and h11 turns each into an event
through its receive buffer, two regular expressions and its state machine: about a tenth
of the cost of reading a token on the engine's loop (bench/stream_path.py). This decoder
handles the data chunks only. At the last chunk (size 0) it stops and hands back the
bytes from that chunk's size line on, so h11 reads the end of the message itself
(trailers, end of message) and the connection goes back to the pool as before.

Framing errors are h11's own `RemoteProtocolError`, which the transport maps as any
other broken stream. The payload that came before an error in the same read is handed
over first and the error raised after it (`check`, or the next `feed`), as h11 does with
its events: a stream whose last good event and broken frame arrived together keeps that
event, and it is not retried as a stream that had given nothing.
"""

from __future__ import annotations

import h11

# h11's own limits: a size of at most 20 hex digits, a header line of at most 64 KiB.
MAX_SIZE_DIGITS = 20
MAX_LINE_BYTES = 64 * 1024
_HEX = frozenset(b"0123456789abcdefABCDEF")


class ChunkedDecoder:
    """Feed the body's bytes as they arrive, get the payload pieces; `rest` is set (the
    bytes of the last chunk and what follows) once the last chunk begins."""

    def __init__(self) -> None:
        self._line = b""  # an unfinished size line
        self._remaining = 0  # payload bytes left in the current chunk
        self._crlf = b""  # what is left of the CRLF closing the current chunk
        self.rest: bytes | None = None
        # A framing error found after payload of the same read: raised once that is out.
        self._error: h11.RemoteProtocolError | None = None

    def check(self) -> None:
        """Raise the framing error found after the payload `feed` last returned."""
        if self._error is not None:
            raise self._error

    def feed(self, data: bytes) -> list[bytes]:
        self.check()
        pieces: list[bytes] = []
        try:
            return self._feed(data, pieces)
        except h11.RemoteProtocolError as error:
            if not pieces:
                raise
            self._error = error
            return pieces

    def _feed(self, data: bytes, pieces: list[bytes]) -> list[bytes]:
        if self._line:  # a size line began in an earlier read (its CRLF may be split too)
            data, self._line = self._line + data, b""
        position = 0
        end = len(data)
        while position < end:
            if self._remaining:
                take = min(self._remaining, end - position)
                pieces.append(data[position : position + take])
                position += take
                self._remaining -= take
                if not self._remaining:
                    self._crlf = b"\r\n"
                continue
            if self._crlf:
                expected = self._crlf
                got = data[position : position + len(expected)]
                if got != expected[: len(got)]:
                    raise h11.RemoteProtocolError(f"malformed chunk footer: {got!r}")
                self._crlf = expected[len(got) :]
                position += len(got)
                continue
            newline = data.find(b"\r\n", position)
            if newline < 0:
                self._line = data[position:]
                if len(self._line) > MAX_LINE_BYTES:
                    raise h11.RemoteProtocolError("chunk header too long")
                return pieces
            size = _chunk_size(data[position:newline])
            if size == 0:
                self.rest = data[position:]
                return pieces
            self._remaining = size
            position = newline + 2
        return pieces


def _chunk_size(line: bytes) -> int:
    """The size of `chunk-size [ chunk-ext ]`; extensions are ignored, as h11 does."""
    digits = line.split(b";", 1)[0].rstrip(b" \t")
    if not digits or len(digits) > MAX_SIZE_DIGITS or not _HEX.issuperset(digits):
        raise h11.RemoteProtocolError(f"illegal chunk header: {line!r}")
    return int(digits, 16)
