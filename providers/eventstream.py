"""The AWS event-stream binary framing (`application/vnd.amazon.eventstream`).

Bedrock's ConverseStream answers with this framing instead of Server-Sent Events. One
message on the wire is:

    total length (uint32) | headers length (uint32) | prelude CRC32 (of the 8 bytes before)
    headers (name length uint8, name, value type uint8, value)...
    payload
    message CRC32 (of every byte before it, prelude included)

all big-endian. `EventStreamDecoder` is incremental: `feed()` takes chunks cut anywhere
(a chunk may end inside a prelude, a header or a CRC) and returns the complete messages;
`flush()` at the end of the body refuses leftover bytes (a truncated message). Every
prelude and message CRC is checked: a mismatch, an impossible length or an unknown header
type raises `StreamError`, because a corrupt frame cannot be resynchronised.

`encode_message` is the inverse, used by the fake Bedrock server and by tests.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import StreamError

PRELUDE_LENGTH = 12  # total length, headers length, prelude CRC: three uint32s
CRC_LENGTH = 4
MIN_MESSAGE_LENGTH = PRELUDE_LENGTH + CRC_LENGTH
# The limits the AWS SDKs enforce (botocore: 128 KiB of headers, 24 MiB of payload). A
# prelude claiming more is corrupt, not a big event: refusing it keeps a broken stream
# from making us buffer gigabytes while waiting for bytes that never come.
MAX_HEADERS_LENGTH = 128 * 1024
MAX_PAYLOAD_LENGTH = 24 * 1024 * 1024

# Header value types (the framing's own numbering).
TYPE_TRUE = 0
TYPE_FALSE = 1
TYPE_BYTE = 2
TYPE_SHORT = 3
TYPE_INTEGER = 4
TYPE_LONG = 5
TYPE_BYTES = 6
TYPE_STRING = 7
TYPE_TIMESTAMP = 8
TYPE_UUID = 9

_FIXED_INTS = {
    TYPE_BYTE: struct.Struct("!b"),
    TYPE_SHORT: struct.Struct("!h"),
    TYPE_INTEGER: struct.Struct("!i"),
    TYPE_LONG: struct.Struct("!q"),
    TYPE_TIMESTAMP: struct.Struct("!q"),  # milliseconds since the epoch
}
_PRELUDE = struct.Struct("!III")
_UINT32 = struct.Struct("!I")
_UINT16 = struct.Struct("!H")


def _crc32(data: bytes | memoryview, crc: int = 0) -> int:
    return zlib.crc32(data, crc) & 0xFFFFFFFF


@dataclass(frozen=True)
class EventStreamMessage:
    """One decoded message: its headers (name → value) and raw payload bytes."""

    headers: dict[str, Any] = field(default_factory=dict)
    payload: bytes = b""

    @property
    def message_type(self) -> str | None:
        """`event`, `exception` or `error` (the `:message-type` header)."""
        value = self.headers.get(":message-type")
        return value if isinstance(value, str) else None

    @property
    def event_type(self) -> str | None:
        value = self.headers.get(":event-type")
        return value if isinstance(value, str) else None

    @property
    def exception_type(self) -> str | None:
        value = self.headers.get(":exception-type")
        return value if isinstance(value, str) else None


class EventStreamDecoder:
    """Incremental decoder: bytes in, complete `EventStreamMessage`s out."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> list[EventStreamMessage]:
        self._buffer += chunk
        messages: list[EventStreamMessage] = []
        while len(self._buffer) >= PRELUDE_LENGTH:
            total, headers_length, prelude_crc = _PRELUDE.unpack_from(self._buffer)
            if _crc32(memoryview(self._buffer)[:8]) != prelude_crc:
                raise StreamError("event stream prelude checksum mismatch")
            _check_lengths(total, headers_length)
            if len(self._buffer) < total:
                break
            frame = bytes(self._buffer[:total])
            del self._buffer[:total]
            messages.append(_decode_frame(frame, headers_length))
        return messages

    def flush(self) -> None:
        """The body ended: leftover bytes are a message cut short."""
        if self._buffer:
            pending = len(self._buffer)
            self._buffer.clear()
            raise StreamError(f"the event stream ended inside a message ({pending} bytes)")


def _check_lengths(total: int, headers_length: int) -> None:
    if headers_length > MAX_HEADERS_LENGTH:
        raise StreamError(f"event stream headers of {headers_length} bytes exceed the limit")
    payload_length = total - headers_length - MIN_MESSAGE_LENGTH
    if payload_length < 0:
        raise StreamError(
            f"event stream message length {total} is too small for {headers_length} "
            "bytes of headers"
        )
    if payload_length > MAX_PAYLOAD_LENGTH:
        raise StreamError(f"event stream payload of {payload_length} bytes exceeds the limit")


def _decode_frame(frame: bytes, headers_length: int) -> EventStreamMessage:
    (message_crc,) = _UINT32.unpack_from(frame, len(frame) - CRC_LENGTH)
    if _crc32(memoryview(frame)[:-CRC_LENGTH]) != message_crc:
        raise StreamError("event stream message checksum mismatch")
    headers_end = PRELUDE_LENGTH + headers_length
    headers = decode_headers(frame[PRELUDE_LENGTH:headers_end])
    return EventStreamMessage(headers, frame[headers_end:-CRC_LENGTH])


def decode_headers(data: bytes) -> dict[str, Any]:
    """The header block of one message. A repeated name keeps its last value."""
    headers: dict[str, Any] = {}
    position = 0
    try:
        while position < len(data):
            name_length = data[position]
            position += 1
            name = data[position : position + name_length].decode("utf-8")
            position += name_length
            kind = data[position]
            position += 1
            value: Any
            if kind == TYPE_TRUE:
                value = True
            elif kind == TYPE_FALSE:
                value = False
            elif kind in _FIXED_INTS:
                codec = _FIXED_INTS[kind]
                (value,) = codec.unpack_from(data, position)
                position += codec.size
            elif kind in (TYPE_BYTES, TYPE_STRING):
                (length,) = _UINT16.unpack_from(data, position)
                position += _UINT16.size
                raw = data[position : position + length]
                if len(raw) != length:
                    raise StreamError("event stream header value is cut short")
                position += length
                value = raw.decode("utf-8") if kind == TYPE_STRING else raw
            elif kind == TYPE_UUID:
                raw = data[position : position + 16]
                if len(raw) != 16:
                    raise StreamError("event stream header value is cut short")
                value = uuid.UUID(bytes=raw)
                position += 16
            else:
                raise StreamError(f"unknown event stream header type {kind}")
            headers[name] = value
    except (IndexError, struct.error, UnicodeDecodeError):
        raise StreamError("malformed event stream headers") from None
    return headers


def encode_headers(headers: Mapping[str, Any]) -> bytes:
    """Header block for `headers`: str → string, bytes → byte array, bool, int → int32
    (long when it does not fit), UUID → uuid."""
    out = bytearray()
    for name, value in headers.items():
        encoded_name = name.encode("utf-8")
        out += bytes([len(encoded_name)]) + encoded_name
        if isinstance(value, bool):
            out.append(TYPE_TRUE if value else TYPE_FALSE)
        elif isinstance(value, int):
            kind = TYPE_INTEGER if -(2**31) <= value < 2**31 else TYPE_LONG
            out.append(kind)
            out += _FIXED_INTS[kind].pack(value)
        elif isinstance(value, str | bytes):
            raw = value.encode("utf-8") if isinstance(value, str) else value
            out.append(TYPE_STRING if isinstance(value, str) else TYPE_BYTES)
            out += _UINT16.pack(len(raw)) + raw
        elif isinstance(value, uuid.UUID):
            out.append(TYPE_UUID)
            out += value.bytes
        else:
            raise TypeError(f"cannot encode header {name!r} of type {type(value).__name__}")
    return bytes(out)


def encode_message(headers: Mapping[str, Any], payload: bytes = b"") -> bytes:
    """One complete message, both CRCs computed."""
    header_bytes = encode_headers(headers)
    total = PRELUDE_LENGTH + len(header_bytes) + len(payload) + CRC_LENGTH
    prefix = struct.pack("!II", total, len(header_bytes))
    prelude = prefix + _UINT32.pack(_crc32(prefix))
    body = prelude + header_bytes + payload
    return body + _UINT32.pack(_crc32(body))
