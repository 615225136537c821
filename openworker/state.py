"""Embedded mode's local state folder: dev secrets generated once, kept across restarts.

Without this, every restart of `make run` would mint a new SECRET_KEY (signing out every
browser) and a new encryption key (making every stored provider key unreadable).
The folder is git-ignored; production never uses it (settings refuse to start without
keys from the environment when DEBUG is off).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from cryptography.fernet import Fernet


def state_dir(base_dir: Path) -> Path:
    path = Path(os.environ.get("OPENWORKER_STATE_DIR") or base_dir / ".state")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _read_or_create(path: Path, make: callable) -> str:  # type: ignore[valid-type]
    if path.exists():
        return path.read_text().strip()
    value = make()
    # O_EXCL: two processes starting at once must not each write a different key.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")
    return value


def dev_secret_key(folder: Path) -> str:
    return _read_or_create(folder / "secret_key", lambda: secrets.token_urlsafe(50))


def dev_encryption_key(folder: Path) -> str:
    return _read_or_create(folder / "encryption_key", lambda: Fernet.generate_key().decode())
