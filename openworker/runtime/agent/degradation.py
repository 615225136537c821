"""Attachment degradation: fit PDFs and images to what the ACTIVE model can read (seed 000).

Outbound-only: the persisted history keeps every attachment as the user sent it, and this
module rewrites a copy just before it goes to the model, so a mid-session switch to a model
that can read them sends the originals again. A model whose capabilities do not say True
(False, or unknown) gets:

- a PDF (`{"type": "file", "file": {"filename", "file_data": "data:application/pdf;base64,..."}}`)
  as a text part holding the text pypdf extracts, labelled and capped;
- an image (`{"type": "image_url", ...}`) as the seed's fixed placeholder text.

The engine's footprint: `outbound = adapt_for_model(outbound, caps)` before each request,
and `degradation_note(history, caps)` appended to the status line the user sees.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pypdf import PdfReader

from providers.json_copy import json_copy
from providers.types import ModelCapabilities

IMAGE_PLACEHOLDER = "[image attachment — not viewable by this model]"
IMAGES_NOTE = " — earlier images can't be read by this model"
PDFS_NOTE = " — earlier PDFs are sent to this model as extracted text"
# ~25k tokens of a document per attachment: room for a long report while a session with a
# few PDFs still fits the common 128k window. Past it, a note tells the model text is missing.
PDF_TEXT_MAX_CHARS = 100_000
# Extraction runs again for every request of a session; keep the last few documents' text.
# The key is a digest of the data, so the cache never holds the PDFs themselves.
PDF_CACHE_SIZE = 32

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PdfText:
    """What could be read from one PDF: its text (capped), page count, or why not."""

    text: str = ""
    pages: int = 0
    truncated: bool = False
    problem: str | None = None


_cache: OrderedDict[str, PdfText] = OrderedDict()
_cache_lock = threading.Lock()  # the engine runs turns on several threads


def extract_pdf_text(data: bytes, *, max_chars: int | None = None) -> PdfText:
    """The text of a PDF, page by page, stopping once `max_chars` are collected.

    Encrypted documents are tried with the empty password (the common "no open password,
    restricted permissions" case); beyond that the problem is reported, never raised.
    """
    if max_chars is None:
        max_chars = PDF_TEXT_MAX_CHARS
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            return PdfText(problem="encrypted with a password")
        pages = len(reader.pages)
        parts: list[str] = []
        collected = 0
        truncated = False
        for page in reader.pages:
            text = (page.extract_text() or "").strip()
            if not text:
                continue
            parts.append(text)
            collected += len(text) + 2
            if collected > max_chars:
                truncated = True
                break
    except Exception as exc:
        # pypdf raises a wide range of types on malformed input; a bad attachment must not
        # fail the turn, so any of them becomes a placeholder.
        logger.info("PDF text extraction failed: %s", type(exc).__name__)
        return PdfText(problem="unreadable (damaged or not a PDF)")
    text = "\n\n".join(parts)
    if len(text) > max_chars:
        text, truncated = text[:max_chars], True
    return PdfText(text=text, pages=pages, truncated=truncated)


def _cached_extract(data_url: str) -> PdfText:
    key = hashlib.sha256(data_url.encode("utf-8", "surrogatepass")).hexdigest()
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    data = _decode_data_url(data_url)
    result = PdfText(problem="unreadable (no PDF data)") if data is None else extract_pdf_text(data)
    with _cache_lock:
        _cache[key] = result
        while len(_cache) > PDF_CACHE_SIZE:
            _cache.popitem(last=False)
    return result


def _decode_data_url(data_url: str) -> bytes | None:
    header, sep, payload = data_url.partition(",")
    if not sep or not header.startswith("data:") or ";base64" not in header:
        return None
    try:
        return base64.b64decode(payload, validate=False)
    except (binascii.Error, ValueError):
        return None


def pdf_part_as_text(part: Mapping[str, Any]) -> dict[str, Any]:
    """The text part that stands in for a PDF `file` part."""
    file = part.get("file") or {}
    name = file.get("filename") or "document.pdf"
    data_url = file.get("file_data")
    if not isinstance(data_url, str):
        return _text(f'[PDF attachment "{name}" — not readable by this model]')
    result = _cached_extract(data_url)
    if result.problem is not None:
        return _text(f'[PDF attachment "{name}" — {result.problem}; its text is unavailable]')
    pages = f"{result.pages} page{'s' if result.pages != 1 else ''}"
    if not result.text:
        return _text(f'[PDF attachment "{name}" — {pages}, no extractable text (scanned?)]')
    body = f'[PDF attachment "{name}" — text extracted, {pages}]\n{result.text}'
    if result.truncated:
        body += f"\n[truncated: only the first {PDF_TEXT_MAX_CHARS:,} characters are included]"
    return _text(body)


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _parts(messages: Iterable[Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            yield from (p for p in content if isinstance(p, Mapping))


def history_has_images(messages: Iterable[Mapping[str, Any]]) -> bool:
    return any(p.get("type") == "image_url" for p in _parts(messages))


def history_has_pdfs(messages: Iterable[Mapping[str, Any]]) -> bool:
    return any(p.get("type") == "file" for p in _parts(messages))


def adapt_for_model(
    messages: list[dict[str, Any]], caps: ModelCapabilities | None
) -> list[dict[str, Any]]:
    """A deep copy of `messages` with the attachments `caps` cannot read degraded to text.

    Always a copy, even when nothing changes: later outbound steps (cache markers) may
    edit it in place without reaching the persisted history. Unknown capabilities (None)
    count as "cannot": a text stand-in is safer than a request the provider rejects.
    """
    out = json_copy(messages)
    read_pdf = caps is not None and caps.pdf is True
    see_images = caps is not None and caps.vision is True
    if read_pdf and see_images:
        return out
    for message in out:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        adapted = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "file" and not read_pdf:
                adapted.append(pdf_part_as_text(part))
            elif kind == "image_url" and not see_images:
                adapted.append(_text(IMAGE_PLACEHOLDER))
            else:
                adapted.append(part)
        message["content"] = adapted
    return out


def degradation_note(
    messages: Iterable[Mapping[str, Any]], caps: ModelCapabilities | None
) -> str | None:
    """The status-line suffix telling the user what the active model cannot see, or None."""
    messages = list(messages)
    notes = []
    if not (caps is not None and caps.vision) and history_has_images(messages):
        notes.append(IMAGES_NOTE)
    if not (caps is not None and caps.pdf) and history_has_pdfs(messages):
        notes.append(PDFS_NOTE)
    return "".join(notes) or None
