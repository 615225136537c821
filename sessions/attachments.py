"""Attachment uploads: images and PDFs, checked by content (not the browser's word),
size-limited, and deduplicated per owner by SHA-256."""

from __future__ import annotations

import hashlib
from typing import Any

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.db import IntegrityError, transaction

from sessions.models import Attachment, Session

# Magic numbers of the types we accept; the browser-supplied content type is ignored.
_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
)
MAX_NAME_CHARS = 200


class AttachmentRejected(Exception):
    """The upload is not acceptable; the message is for the user."""


def sniff_mime(head: bytes) -> str | None:
    for signature, mime in _SIGNATURES:
        if head.startswith(signature):
            return mime
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def _clean_name(name: str) -> str:
    # Display only (the stored path is content-addressed): keep it printable and short.
    cleaned = "".join(ch for ch in name if ch.isprintable() and ch not in "/\\").strip()
    return (cleaned or "attachment")[:MAX_NAME_CHARS]


def attachment_create(*, owner: Any, session: Session | None, upload: UploadedFile) -> Attachment:
    if upload.size is None or upload.size > settings.MAX_ATTACHMENT_BYTES:
        raise AttachmentRejected(
            f"Files are limited to {settings.MAX_ATTACHMENT_BYTES // (1024 * 1024)} MB."
        )
    if upload.size == 0:
        raise AttachmentRejected("The file is empty.")
    upload.seek(0)
    mime = sniff_mime(upload.read(16))
    if mime is None:
        raise AttachmentRejected(
            "Only PNG, JPEG, GIF and WebP images and PDF files can be attached."
        )
    digest = hashlib.sha256()
    upload.seek(0)
    for chunk in upload.chunks():
        digest.update(chunk)
    sha = digest.hexdigest()
    existing = Attachment.objects.filter(owner=owner, sha256=sha).first()
    if existing is not None:
        return existing
    upload.seek(0)
    attachment = Attachment(
        owner=owner,
        session=session,
        name=_clean_name(upload.name or ""),
        mime=mime,
        size=upload.size,
        sha256=sha,
    )
    attachment.file.save(sha, upload, save=False)
    try:
        with transaction.atomic():
            attachment.save()
    except IntegrityError:
        # The same file uploaded twice at once: keep the first.
        return Attachment.objects.get(owner=owner, sha256=sha)
    return attachment


def attachment_meta(attachment: Attachment) -> dict[str, Any]:
    """What a message part says of its attachment (display; the bytes stay in the row)."""
    return {
        "id": str(attachment.pk),
        "name": attachment.name,
        "mime": attachment.mime,
        "size": attachment.size,
    }


def attachment_part(meta: dict[str, Any]) -> dict[str, Any]:
    """The canonical content part referring to an attachment (by id, never inline)."""
    ref = f"attachment:{meta['id']}"
    if str(meta["mime"]).startswith("image/"):
        part = {"type": "image_url", "image_url": {"url": ref}}
    else:
        part = {"type": "file", "file": {"filename": meta["name"], "file_data": ref}}
    return {**part, "attachment": meta}


def attachment_payload(attachment: Attachment) -> dict[str, Any]:
    return {
        "id": str(attachment.pk),
        "name": attachment.name,
        "mime": attachment.mime,
        "size": attachment.size,
        "sha256": attachment.sha256,
    }
