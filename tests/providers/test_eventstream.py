from __future__ import annotations

import json
import struct
import uuid

import pytest
from botocore.eventstream import EventStreamBuffer

from providers.errors import StreamError
from providers.eventstream import (
    EventStreamDecoder,
    decode_headers,
    encode_message,
)

EVENT_HEADERS = {
    ":event-type": "contentBlockDelta",
    ":content-type": "application/json",
    ":message-type": "event",
}
PAYLOAD = json.dumps({"contentBlockIndex": 0, "delta": {"text": "Grüezi"}}).encode()


def _frames() -> bytes:
    return encode_message(EVENT_HEADERS, PAYLOAD) + encode_message(
        {":message-type": "event", ":event-type": "messageStop"}, b'{"stopReason":"end_turn"}'
    )


def test_botocore_decodes_what_our_encoder_writes():
    buffer = EventStreamBuffer()
    buffer.add_data(_frames())
    messages = list(buffer)

    assert messages[0].headers == EVENT_HEADERS
    assert messages[0].payload == PAYLOAD
    assert messages[1].headers[":event-type"] == "messageStop"


def test_messages_reassemble_across_every_possible_chunk_boundary():
    data = _frames()
    for cut in range(1, len(data)):
        decoder = EventStreamDecoder()
        messages = decoder.feed(data[:cut]) + decoder.feed(data[cut:])
        decoder.flush()
        assert [m.event_type for m in messages] == ["contentBlockDelta", "messageStop"], cut
        assert messages[0].payload == PAYLOAD


def test_byte_at_a_time_feeding_yields_each_message_once_complete():
    decoder = EventStreamDecoder()
    seen = []
    for byte in _frames():
        seen.extend(decoder.feed(bytes([byte])))
    assert [m.event_type for m in seen] == ["contentBlockDelta", "messageStop"]


def test_a_corrupted_payload_fails_the_message_checksum():
    frame = bytearray(encode_message(EVENT_HEADERS, PAYLOAD))
    frame[-10] ^= 0xFF
    with pytest.raises(StreamError, match="message checksum"):
        EventStreamDecoder().feed(bytes(frame))


def test_a_corrupted_length_fails_the_prelude_checksum():
    frame = bytearray(encode_message(EVENT_HEADERS, PAYLOAD))
    frame[3] ^= 0x01
    with pytest.raises(StreamError, match="prelude checksum"):
        EventStreamDecoder().feed(bytes(frame))


def test_a_stream_ending_inside_a_message_is_an_error_at_flush():
    decoder = EventStreamDecoder()
    assert decoder.feed(encode_message(EVENT_HEADERS, PAYLOAD)[:-5]) == []
    with pytest.raises(StreamError, match="ended inside a message"):
        decoder.flush()


def test_an_impossible_length_is_refused_instead_of_buffered():
    prefix = struct.pack("!II", 10, 0)  # shorter than prelude + CRC
    import zlib

    prelude = prefix + struct.pack("!I", zlib.crc32(prefix))
    with pytest.raises(StreamError, match="too small"):
        EventStreamDecoder().feed(prelude)


def test_every_header_value_type_decodes():
    value_uuid = uuid.uuid4()
    raw = bytearray()

    def name(text: str) -> bytes:
        return bytes([len(text)]) + text.encode()

    raw += name("t") + b"\x00"
    raw += name("f") + b"\x01"
    raw += name("b") + b"\x02" + struct.pack("!b", -5)
    raw += name("s") + b"\x03" + struct.pack("!h", 300)
    raw += name("i") + b"\x04" + struct.pack("!i", 70000)
    raw += name("l") + b"\x05" + struct.pack("!q", 2**40)
    raw += name("y") + b"\x06" + struct.pack("!H", 3) + b"\x00\x01\x02"
    raw += name("str") + b"\x07" + struct.pack("!H", 2) + b"ok"
    raw += name("ts") + b"\x08" + struct.pack("!q", 1_700_000_000_000)
    raw += name("u") + b"\x09" + value_uuid.bytes

    assert decode_headers(bytes(raw)) == {
        "t": True,
        "f": False,
        "b": -5,
        "s": 300,
        "i": 70000,
        "l": 2**40,
        "y": b"\x00\x01\x02",
        "str": "ok",
        "ts": 1_700_000_000_000,
        "u": value_uuid,
    }


def test_an_unknown_header_type_is_a_stream_error():
    with pytest.raises(StreamError, match="header type"):
        decode_headers(b"\x01x\x0a")


def test_exception_frames_expose_their_type():
    frame = encode_message(
        {":message-type": "exception", ":exception-type": "throttlingException"},
        b'{"message":"slow down"}',
    )
    (message,) = EventStreamDecoder().feed(frame)
    assert message.message_type == "exception"
    assert message.exception_type == "throttlingException"
    assert message.event_type is None
