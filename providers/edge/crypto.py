"""Authenticated encryption of provider keys at rest, with a rotating key ring.

MultiFernet over `settings.ENCRYPTION_KEYS` (newest first): the first key encrypts, every
key decrypts, so a new key can be added, everything re-encrypted (`rotate_keys`), and the
old key removed. Master keys come from the environment only, never the database.
"""

from __future__ import annotations

from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class DecryptionError(Exception):
    """A stored secret could not be decrypted with any key of the ring."""


@lru_cache(maxsize=4)
def _ring(keys: tuple[str, ...]) -> MultiFernet:
    if not keys:
        raise ImproperlyConfigured("No encryption keys configured (OPENWORKER_ENCRYPTION_KEYS).")
    try:
        return MultiFernet([Fernet(key.encode()) for key in keys])
    except ValueError as exc:
        raise ImproperlyConfigured(
            "OPENWORKER_ENCRYPTION_KEYS must be Fernet keys (32 url-safe base64 bytes)."
        ) from exc


def key_ring() -> MultiFernet:
    return _ring(tuple(settings.ENCRYPTION_KEYS))


def encrypt(plaintext: str) -> str:
    return key_ring().encrypt(plaintext.encode()).decode()


def decrypt(token: str) -> str:
    try:
        return key_ring().decrypt(token.encode()).decode()
    except InvalidToken:
        raise DecryptionError(
            "stored secret cannot be decrypted with the current key ring"
        ) from None


def rotate(token: str) -> str:
    """Re-encrypt under the newest key (MultiFernet.rotate keeps the original timestamp)."""
    try:
        return key_ring().rotate(token.encode()).decode()
    except InvalidToken:
        raise DecryptionError(
            "stored secret cannot be decrypted with the current key ring"
        ) from None
