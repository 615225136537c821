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
from typing import NamedTuple

_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"
# A single line or event beyond this is not an LLM stream but a runaway or hostile upstream;
# generous because one data line may carry a whole tool-call argument or an image.
MAX_EVENT_BYTES = 32 * 1024 * 1024


class SSEProtocolError(ValueError):
    """The stream broke a limit of this parser (an oversized line or event)."""


class SSEEvent(NamedTuple):
    """One dispatched event. A named tuple, not a frozen dataclass: one is made per token
    of every stream, and a frozen dataclass's `__init__` costs three times as much."""

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
                # `_line` inlined for the two lines of every event: its blank line and
                # its fields (the rest of `_line` is for the stream's first line).
                if not line:
                    event = self._dispatch()
                    if event is not None:
                        events.append(event)
                elif line[:1] != b":":
                    self._field(line)
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
        if raw[:1] != b":":
            self._field(raw)
        return None

    def _field(self, raw: bytes) -> None:
        """A non-blank, non-comment line: `name: value` (WHATWG "process the field")."""
        if raw.startswith(b"data:"):
            # The common line, without decoding and splitting the name: "data:" is ASCII,
            # so decoding the value alone gives the same text.
            value = raw[6:] if raw[5:6] == b" " else raw[5:]
            self._data.append(value.decode("utf-8", errors="replace"))
            self._data_size += len(raw)
            if self._data_size > self._max:
                raise SSEProtocolError(f"SSE event larger than {self._max} bytes")
            return
        if raw.startswith(b"event:"):
            value = raw[7:] if raw[6:7] == b" " else raw[6:]
            self._event_type = value.decode("utf-8", errors="replace")
            return
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

    def _dispatch(self) -> SSEEvent | None:
        if not self._data:
            self._event_type = ""
            self._retry = None
            return None
        data = self._data
        event = SSEEvent(
            self._event_type or None,
            data[0] if len(data) == 1 else "\n".join(data),
            self._last_id or None,
            self._retry,
        )
        self._event_type = ""
        self._data = []
        self._data_size = 0
        self._retry = None
        return event
