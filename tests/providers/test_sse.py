from __future__ import annotations

from collections.abc import Iterable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from providers.sse import SSEDecoder, SSEEvent, SSEProtocolError


def iter_sse(byte_chunks: Iterable[bytes]) -> Iterator[SSEEvent]:
    """The decoder as the transport drives it: each chunk fed as it comes, then flushed."""
    decoder = SSEDecoder()
    for chunk in byte_chunks:
        yield from decoder.feed(chunk)
    yield from decoder.flush()


def parse(data: bytes) -> list[SSEEvent]:
    return list(iter_sse([data]))


def test_basic_event_with_type_and_data():
    assert parse(b'event: message_start\ndata: {"a":1}\n\n') == [
        SSEEvent(event="message_start", data='{"a":1}')
    ]


def test_event_without_a_type_has_none():
    assert parse(b"data: hi\n\n") == [SSEEvent(event=None, data="hi")]


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"])
def test_every_line_ending_is_understood(eol):
    stream = b"event: a" + eol + b"data: 1" + eol + eol + b"data: 2" + eol + eol
    assert parse(stream) == [SSEEvent("a", "1"), SSEEvent(None, "2")]


def test_crlf_split_between_reads_counts_once():
    decoder = SSEDecoder()
    out = decoder.feed(b"data: one\r")
    out += decoder.feed(b"\n\r")
    out += decoder.feed(b"\ndata: two\r\n\r\n")
    assert out == [SSEEvent(None, "one"), SSEEvent(None, "two")]


def test_multibyte_character_split_across_reads():
    text = "data: 你好 ☃ 🎉\n\n".encode()
    split = text.index("🎉".encode()) + 2
    decoder = SSEDecoder()
    events = decoder.feed(text[:split]) + decoder.feed(text[split:])
    assert events == [SSEEvent(None, "你好 ☃ 🎉")]


def test_comments_are_ignored():
    assert parse(b": ping\n\n:another\ndata: x\n: mid\n\n") == [SSEEvent(None, "x")]


def test_multi_line_data_is_joined_with_newlines():
    assert parse(b"data: a\ndata:b\ndata\ndata:  c\n\n") == [SSEEvent(None, "a\nb\n\n c")]


def test_only_one_leading_space_is_stripped():
    assert parse(b"data:   x \n\n") == [SSEEvent(None, "  x ")]


def test_field_without_colon_has_empty_value():
    assert parse(b"data\n\n") == [SSEEvent(None, "")]
    assert parse(b"event\ndata: x\n\n") == [SSEEvent(None, "x")]


def test_bom_at_stream_start_is_stripped_even_when_split():
    decoder = SSEDecoder()
    events = decoder.feed(b"\xef\xbb") + decoder.feed(b"\xbfdata: x\n\n")
    assert events == [SSEEvent(None, "x")]


def test_bom_later_in_the_stream_is_data():
    events = parse(b"data: a\n\n\xef\xbb\xbfdata: b\n\n")
    assert events == [SSEEvent(None, "a")]  # the second line's field name is "\ufeffdata"


def test_blocks_without_data_are_not_dispatched():
    assert parse(b"event: ping\n\nid: 3\n\nretry: 10\n\ndata: x\n\n") == [
        SSEEvent(None, "x", id="3")
    ]


def test_event_type_does_not_leak_into_the_next_event():
    assert parse(b"event: a\ndata: 1\n\ndata: 2\n\n") == [SSEEvent("a", "1"), SSEEvent(None, "2")]


def test_id_persists_and_ids_with_nul_are_ignored():
    events = parse(b"id: 7\ndata: a\n\ndata: b\n\nid: x\x00y\ndata: c\n\nid\ndata: d\n\n")
    assert [e.id for e in events] == ["7", "7", "7", None]


def test_retry_only_accepts_ascii_digits():
    assert parse(b"retry: 1500\ndata: a\n\n")[0].retry == 1500
    assert parse(b"retry: -5\ndata: a\n\n")[0].retry is None
    assert parse(b"retry: +5\ndata: a\n\n")[0].retry is None
    assert parse(b"retry: \xd9\xa3\ndata: a\n\n")[0].retry is None  # Arabic-Indic digit


def test_unknown_fields_are_ignored():
    assert parse(b"foo: bar\ndata: a\n\n") == [SSEEvent(None, "a")]


def test_unterminated_final_event_is_dropped():
    assert parse(b"data: a\n\ndata: cut off") == [SSEEvent(None, "a")]
    assert parse(b"data: a\n\ndata: b\n") == [SSEEvent(None, "a")]


def test_str_chunks_are_accepted():
    decoder = SSEDecoder()
    assert decoder.feed("data: é\n\n") == [SSEEvent(None, "é")]


def test_events_are_yielded_as_soon_as_they_complete():
    def chunks():
        yield b"data: first\n\n"
        raise AssertionError("the parser read ahead before handing out the first event")

    assert next(iter_sse(chunks())) == SSEEvent(None, "first")


def test_invalid_utf8_is_replaced_not_fatal():
    assert parse(b"data: \xff\n\n") == [SSEEvent(None, "\ufffd")]


def test_oversized_line_is_refused():
    decoder = SSEDecoder(max_event_bytes=64)
    with pytest.raises(SSEProtocolError):
        decoder.feed(b"data: " + b"x" * 100)


def test_oversized_event_is_refused():
    decoder = SSEDecoder(max_event_bytes=64)
    with pytest.raises(SSEProtocolError):
        decoder.feed(b"data: 0123456789\n" * 10)


ANTHROPIC_STREAM = (
    "\ufeffevent: message_start\r\n"
    'data: {"type":"message_start","message":{"id":"msg_1"}}\r\n'
    "\r\n"
    ": keep-alive\n"
    "event: ping\n"
    'data: {"type": "ping"}\n'
    "\n"
    "event: content_block_delta\r"
    'data: {"type":"content_block_delta","delta":{"text":"héllo 世界 🎉"}}\r'
    "\r"
    "data: line one\n"
    "data: line two\n"
    "id: 42\n"
    "retry: 3000\n"
    "\n"
    "event: message_stop\n"
    "data\n"
    "\n"
    "data: [DONE]\n\n"
).encode()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(ANTHROPIC_STREAM)), max_size=40))
def test_any_rechunking_yields_the_same_events(cuts):
    points = sorted(set(cuts))
    pieces = [
        ANTHROPIC_STREAM[a:b]
        for a, b in zip([0, *points], [*points, len(ANTHROPIC_STREAM)], strict=True)
    ]
    assert list(iter_sse(pieces)) == list(iter_sse([ANTHROPIC_STREAM]))


def test_reference_stream_parses_as_expected():
    events = list(iter_sse([ANTHROPIC_STREAM]))
    assert [e.event for e in events] == [
        "message_start",
        "ping",
        "content_block_delta",
        None,
        "message_stop",
        None,
    ]
    assert "héllo 世界 🎉" in events[2].data
    assert events[3] == SSEEvent(None, "line one\nline two", id="42", retry=3000)
    assert events[4].data == ""
    assert events[5].data == "[DONE]"


_SSE_LINE = st.one_of(
    st.just(""),
    st.sampled_from([": c", "data", "event", "id: 1", "retry: 5"]),
    st.builds(
        lambda f, v: f"{f}: {v}",
        st.sampled_from(["data", "event", "id"]),
        st.text(
            alphabet=st.characters(blacklist_characters="\r\n\x00", blacklist_categories=("Cs",)),
            max_size=8,
        ),
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(_SSE_LINE, max_size=20),
    st.sampled_from(["\n", "\r", "\r\n"]),
    st.lists(st.integers(min_value=0, max_value=400), max_size=20),
)
def test_random_streams_survive_any_rechunking_and_line_ending(lines, eol, cuts):
    stream = eol.join([*lines, "", ""]).encode()
    points = sorted({c for c in cuts if c <= len(stream)})
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    expected = list(iter_sse([stream.replace(b"\r\n", b"\n").replace(b"\r", b"\n")]))
    assert list(iter_sse(pieces)) == expected
