"""The chunked-body decoder the transport reads data chunks with (h11 reads the rest)."""

from __future__ import annotations

import h11
import pytest

from providers.chunked import ChunkedDecoder

CHUNKS = [b'event: a\ndata: {"n":1}\n\n', b"x" * 300, b"\r\n"]
TAIL = b"0\r\nX-Trailer: 1\r\n\r\n"


def framed(chunks: list[bytes], *, extension: bytes = b"") -> bytes:
    return b"".join(f"{len(c):x}".encode() + extension + b"\r\n" + c + b"\r\n" for c in chunks)


def decode(body: bytes, step: int) -> tuple[bytes, bytes | None]:
    decoder = ChunkedDecoder()
    payload = b""
    rest: bytes | None = None
    for i in range(0, len(body), step):
        if rest is not None:
            rest += body[i : i + step]
            continue
        payload += b"".join(decoder.feed(body[i : i + step]))
        rest = decoder.rest
    return payload, rest


@pytest.mark.parametrize("step", [1, 2, 3, 5, 7, 64, 10_000])
def test_reads_split_anywhere_give_the_payload_and_hand_back_the_last_chunk(step: int):
    body = framed(CHUNKS, extension=b";name=value") + TAIL
    assert decode(body, step) == (b"".join(CHUNKS), TAIL)


def test_upper_and_lower_case_sizes_and_padding_before_the_line_end():
    body = b"1A \r\n" + b"y" * 26 + b"\r\n1a\r\n" + b"z" * 26 + b"\r\n" + TAIL
    assert decode(body, 4) == (b"y" * 26 + b"z" * 26, TAIL)


def test_nothing_after_the_last_chunk_is_taken_as_payload():
    decoder = ChunkedDecoder()
    assert decoder.feed(b"3\r\nabc\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n") == [b"abc"]
    assert decoder.rest == b"0\r\n\r\nHTTP/1.1 200 OK\r\n"


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\nabc\r\n",  # not hex
        b"\r\nabc\r\n",  # no size
        b"-3\r\nabc\r\n",
        b"1" * 21 + b"\r\n",  # more digits than h11 allows
    ],
)
def test_an_illegal_size_line_is_h11s_protocol_error(body: bytes):
    with pytest.raises(h11.RemoteProtocolError, match="chunk header"):
        ChunkedDecoder().feed(body)


def test_a_chunk_not_closed_by_crlf_is_a_protocol_error_after_its_payload():
    decoder = ChunkedDecoder()
    assert decoder.feed(b"3\r\nabcXY") == [b"abc"]
    with pytest.raises(h11.RemoteProtocolError, match="footer"):
        decoder.check()


def test_payload_read_together_with_a_broken_frame_is_handed_over_before_the_error():
    decoder = ChunkedDecoder()
    assert decoder.feed(framed([b"event one"]) + b"zz\r\nnot a chunk\r\n") == [b"event one"]
    with pytest.raises(h11.RemoteProtocolError, match="chunk header"):
        decoder.check()
    with pytest.raises(h11.RemoteProtocolError, match="chunk header"):
        decoder.feed(b"more")  # nothing is decoded past the error


def test_a_size_line_that_never_ends_is_refused():
    decoder = ChunkedDecoder()
    with pytest.raises(h11.RemoteProtocolError, match="too long"):
        for _ in range(100):
            decoder.feed(b"1" * 1024)
