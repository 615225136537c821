"""Attachment degradation on the outbound copy, with real PDFs built in the test."""

from __future__ import annotations

import base64
import copy
import io
from collections.abc import Iterator
from typing import Any

import pytest
from pypdf import PdfReader, PdfWriter

from openworker.runtime.agent import degradation
from openworker.runtime.agent.degradation import (
    IMAGE_PLACEHOLDER,
    IMAGES_NOTE,
    PDFS_NOTE,
    adapt_for_model,
    degradation_note,
    extract_pdf_text,
    history_has_images,
)
from providers.types import ModelCapabilities

TEXT_ONLY = ModelCapabilities(vision=False, pdf=False)
UNKNOWN = ModelCapabilities()
SEES_ALL = ModelCapabilities(vision=True, pdf=True)
IMAGE_PART = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


def make_pdf(pages: list[str]) -> bytes:
    """A minimal valid PDF: one Helvetica text line per page (an empty string: no text)."""
    count = len(pages)
    font_id = 3 + 2 * count
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids ["
        + b" ".join(f"{3 + 2 * i} 0 R".encode() for i in range(count))
        + f"] /Count {count} >>".encode(),
    ]
    for i, text in enumerate(pages):
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        stream = f"BT /F1 24 Tf 72 720 Td ({escaped}) Tj ET".encode() if text else b""
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 {font_id} 0 R >> >> /Contents {4 + 2 * i} 0 R >>".encode()
        )
        objects.append(f"<< /Length {len(stream)} >>\nstream\n".encode() + stream + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\n".encode()
    out += f"startxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def pdf_part(data: bytes, name: str = "report.pdf") -> dict[str, Any]:
    encoded = base64.b64encode(data).decode()
    return {
        "type": "file",
        "file": {"filename": name, "file_data": f"data:application/pdf;base64,{encoded}"},
    }


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": "see attached"}, *parts]}


@pytest.fixture(autouse=True)
def _empty_cache() -> Iterator[None]:
    degradation._cache.clear()
    yield
    degradation._cache.clear()


def test_the_handmade_pdf_is_real() -> None:
    reader = PdfReader(io.BytesIO(make_pdf(["Hello there", "Page two"])))
    assert len(reader.pages) == 2
    assert reader.pages[1].extract_text() == "Page two"


@pytest.mark.parametrize("caps", [TEXT_ONLY, UNKNOWN, None])
def test_a_pdf_becomes_its_labelled_text_for_a_model_without_pdf_support(
    caps: ModelCapabilities | None,
) -> None:
    messages = [user(pdf_part(make_pdf(["Revenue grew (12%)", "Costs fell"])))]
    out = adapt_for_model(messages, caps)
    assert out[0]["content"] == [
        {"type": "text", "text": "see attached"},
        {
            "type": "text",
            "text": '[PDF attachment "report.pdf" — text extracted, 2 pages]\n'
            "Revenue grew (12%)\n\nCosts fell",
        },
    ]


def test_a_pdf_is_sent_as_is_to_a_model_that_reads_pdfs() -> None:
    messages = [user(pdf_part(make_pdf(["Hello"])))]
    assert adapt_for_model(messages, ModelCapabilities(pdf=True, vision=False)) == messages


def test_an_image_becomes_the_seed_placeholder_for_a_model_without_vision() -> None:
    messages = [user(IMAGE_PART)]
    out = adapt_for_model(messages, ModelCapabilities(vision=False, pdf=True))
    assert out[0]["content"][1] == {
        "type": "text",
        "text": "[image attachment — not viewable by this model]",
    }
    assert out[0]["content"][1]["text"] == IMAGE_PLACEHOLDER


def test_an_image_is_kept_for_a_vision_model() -> None:
    messages = [user(IMAGE_PART)]
    assert adapt_for_model(messages, ModelCapabilities(vision=True, pdf=False)) == messages


def test_the_input_is_never_mutated_and_the_output_shares_nothing_with_it() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        user(pdf_part(make_pdf(["Body"])), IMAGE_PART),
        {"role": "assistant", "content": "ok", "tool_calls": []},
    ]
    before = copy.deepcopy(messages)
    for caps in (TEXT_ONLY, SEES_ALL):
        out = adapt_for_model(messages, caps)
        assert messages == before
        out[1]["content"][0]["cache_control"] = {"type": "ephemeral"}
        out[2]["extra"] = True
        assert messages == before


def test_string_content_and_other_parts_pass_through() -> None:
    messages = [
        {"role": "user", "content": "plain"},
        {"role": "tool", "tool_call_id": "t1", "content": [{"type": "text", "text": "result"}]},
    ]
    assert adapt_for_model(messages, TEXT_ONLY) == messages


def test_an_encrypted_pdf_becomes_a_placeholder_saying_so() -> None:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(make_pdf(["Secret plan"]))))
    writer.encrypt(user_password="hunter22", algorithm="RC4-128")
    buffer = io.BytesIO()
    writer.write(buffer)
    out = adapt_for_model([user(pdf_part(buffer.getvalue(), "plan.pdf"))], TEXT_ONLY)
    assert out[0]["content"][1]["text"] == (
        '[PDF attachment "plan.pdf" — encrypted with a password; its text is unavailable]'
    )


def test_a_pdf_encrypted_with_an_empty_password_is_still_read() -> None:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(make_pdf(["Open to all"]))))
    writer.encrypt(user_password="", owner_password="owner", algorithm="RC4-128")
    buffer = io.BytesIO()
    writer.write(buffer)
    assert extract_pdf_text(buffer.getvalue()).text == "Open to all"


@pytest.mark.parametrize(
    "file_data",
    [
        "data:application/pdf;base64," + base64.b64encode(b"not a pdf at all").decode(),
        "data:application/pdf;base64,%%%",
        "https://example.com/x.pdf",
    ],
)
def test_an_unreadable_pdf_becomes_a_placeholder(file_data: str) -> None:
    part = {"type": "file", "file": {"filename": "bad.pdf", "file_data": file_data}}
    text = adapt_for_model([user(part)], TEXT_ONLY)[0]["content"][1]["text"]
    assert text.startswith('[PDF attachment "bad.pdf" — unreadable')
    assert text.endswith("its text is unavailable]")


def test_a_pdf_without_text_says_so() -> None:
    text = adapt_for_model([user(pdf_part(make_pdf(["", ""]), "scan.pdf"))], TEXT_ONLY)
    assert text[0]["content"][1]["text"] == (
        '[PDF attachment "scan.pdf" — 2 pages, no extractable text (scanned?)]'
    )


def test_long_pdf_text_is_capped_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(degradation, "PDF_TEXT_MAX_CHARS", 20)
    messages = [user(pdf_part(make_pdf(["A" * 15, "B" * 15, "C" * 15])))]
    text = adapt_for_model(messages, TEXT_ONLY)[0]["content"][1]["text"]
    label, rest = text.split("\n", 1)
    body, note = rest.rsplit("\n", 1)
    assert label == '[PDF attachment "report.pdf" — text extracted, 3 pages]'
    assert body == "A" * 15 + "\n\nBBB"
    assert note == "[truncated: only the first 20 characters are included]"


def test_extraction_is_cached_by_content(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = degradation.extract_pdf_text
    monkeypatch.setattr(degradation, "extract_pdf_text", lambda data: calls.append(1) or real(data))
    messages = [user(pdf_part(make_pdf(["Once"])))]
    first = adapt_for_model(messages, TEXT_ONLY)
    assert adapt_for_model(messages, TEXT_ONLY) == first
    assert len(calls) == 1


def test_history_has_images() -> None:
    assert history_has_images([user(IMAGE_PART)])
    assert not history_has_images([user(), {"role": "assistant", "content": "x"}])


def test_degradation_note_names_what_the_model_cannot_see() -> None:
    with_image = [user(IMAGE_PART)]
    with_pdf = [user(pdf_part(b"%PDF"))]
    assert (
        degradation_note(with_image, TEXT_ONLY) == " — earlier images can't be read by this model"
    )
    assert degradation_note(with_image, SEES_ALL) is None
    assert degradation_note([user()], TEXT_ONLY) is None
    assert degradation_note(with_pdf, TEXT_ONLY) == PDFS_NOTE
    assert degradation_note(with_pdf, ModelCapabilities(pdf=True)) is None
    assert degradation_note(with_image + with_pdf, UNKNOWN) == IMAGES_NOTE + PDFS_NOTE
