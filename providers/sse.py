"""Incremental Server-Sent Events parsing (WHATWG HTML, "event stream interpretation").

Written here rather than taken from `httpx-sse` (0.4.3) because that library works on
already-decoded text lines and, checked against the spec, does not strip a BOM at stream
start, dispatches blocks that carry no `data` (an `event:`-only block), and accepts
`retry: -5` or `retry: +5` via `int()`. Splitting on bytes before decoding also makes a
UTF-8 character split across reads a non-issue: CR and LF never occur inside a multi-byte
sequence.

Contract: feed any byte chunks, get the events completed by them, in order. Lines end in
CR, LF or CRLF (a CRLF split between reads counts once). An event is dispatched on a blank
line; a block without `data` is not dispatched; an unterminated block at end of stream is
dropped (the spec's rule: an LLM stream cut mid-event is a broken stream, and whoever knows
the terminal event name reports it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"
# A single line or event beyond this is not an LLM stream but a runaway or hostile upstream;
# generous because one data line may carry a whole tool-call argument or an image.
MAX_EVENT_BYTES = 32 * 1024 * 1024


class SSEProtocolError(ValueError):
    """The stream broke a limit of this parser (an oversized line or event)."""


@dataclass(frozen=True)
class SSEEvent:
    event: str | None
    data: str
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Byte-fed, spec-following SSE parser; keeps state across `feed` calls."""

    def __init__(self, *, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._buffer = bytearray()
        self._skip_lf = False
        self._at_start = True
        self._event_type = ""
        self._data: list[str] = []
        self._data_size = 0
        self._last_id = ""
        self._retry: int | None = None

    def feed(self, chunk: bytes | str) -> list[SSEEvent]:
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8")
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        events: list[SSEEvent] = []
        if not self._at_start and b"\r" not in chunk:
            # The usual read: LF line ends only (every provider's), the buffer holding at
            # most the start of the read's first line. One split instead of a regex match
            # and a buffer copy per line: this runs for every token of every stream.
            lines = chunk.split(b"\n")
            if self._buffer:
                self._buffer += lines[0]
                lines[0] = bytes(self._buffer)
                self._buffer.clear()
            rest = lines.pop()
            for line in lines:
                event = self._line(line)
                if event is not None:
                    events.append(event)
            self._buffer += rest
            if len(self._buffer) > self._max:
                raise SSEProtocolError(f"SSE line longer than {self._max} bytes")
            return events
        start = 0
        for match in _LINE_END.finditer(chunk):
            self._buffer += chunk[start : match.start()]
            line = bytes(self._buffer)
            self._buffer.clear()
            start = match.end()
            if match.group() == b"\r" and start == len(chunk):
                self._skip_lf = True  # a CRLF may be split between this read and the next
            event = self._line(line)
            if event is not None:
                events.append(event)
        self._buffer += chunk[start:]
        if len(self._buffer) > self._max:
            raise SSEProtocolError(f"SSE line longer than {self._max} bytes")
        return events

    def flush(self) -> list[SSEEvent]:
        """End of stream: drop any unterminated line and block (see the module docstring)."""
        self._buffer.clear()
        self._skip_lf = False
        self._event_type = ""
        self._data = []
        self._data_size = 0
        self._retry = None
        return []

    def _line(self, raw: bytes) -> SSEEvent | None:
        if self._at_start:
            self._at_start = False
            if raw.startswith(_BOM):
                raw = raw[len(_BOM) :]
        if not raw:
            return self._dispatch()
        if raw[:1] == b":":
            return None
        line = raw.decode("utf-8", errors="replace")
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._data_size += len(raw)
            if self._data_size > self._max:
                raise SSEProtocolError(f"SSE event larger than {self._max} bytes")
        elif name == "event":
            self._event_type = value
        elif name == "id":
            if "\0" not in value:
                self._last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)
        return None

    def _dispatch(self) -> SSEEvent | None:
        if not self._data:
            self._event_type = ""
            self._retry = None
            return None
        event = SSEEvent(
            event=self._event_type or None,
            data="\n".join(self._data),
            id=self._last_id or None,
            retry=self._retry,
        )
        self._event_type = ""
        self._data = []
        self._data_size = 0
        self._retry = None
        return event
