"""The security suite's figures: how much each test tried, kept for docs/SECURITY.md.

A test calls `record("ssrf.hostile_targets", 52, "hostile targets refused ...")`; counts
under one key add up across tests. At the end of the session `tests/security/conftest.py`
prints them and merges them into `artifacts/security-figures.json` (git-ignored), so the
embedded and distributed phases of `make test` both land in the one file.
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

ARTIFACT = Path(__file__).resolve().parents[2] / "artifacts" / "security-figures.json"

_lock = threading.Lock()


@dataclass
class Figure:
    key: str
    count: int
    what: str
    command: str


FIGURES: dict[str, Figure] = {}


def _command() -> str:
    """The pytest command line that produced the figure (as typed, minus the venv path)."""
    args = [a for a in sys.argv[1:] if a]
    return " ".join([".venv/bin/pytest", *args])


def record(key: str, count: int, what: str) -> None:
    """Add `count` to figure `key` (created with description `what` on first use)."""
    with _lock:
        figure = FIGURES.get(key)
        if figure is None:
            FIGURES[key] = Figure(key, count, what, _command())
        else:
            figure.count += count


def lines() -> list[str]:
    return [f"{f.key}: {f.count} {f.what}" for f in sorted(FIGURES.values(), key=lambda f: f.key)]


def write_artifact(path: Path = ARTIFACT) -> None:
    """Merge this run's figures into the JSON artifact (a key from this run replaces the
    same key from an earlier run; other keys are kept)."""
    if not FIGURES:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        existing = json.loads(path.read_text())
    except (OSError, ValueError):
        existing = {}
    for figure in FIGURES.values():
        existing[figure.key] = {
            "count": figure.count,
            "what": figure.what,
            "command": figure.command,
        }
    path.write_text(json.dumps(dict(sorted(existing.items())), indent=2) + "\n")
