"""Third-party browser code is vendored, pinned and licensed: every file under
static/vendor/ is named in its manifest with the sha256 it had when it was taken from the
npm package, and each library ships its licence."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

VENDOR = Path(__file__).resolve().parents[1] / "static" / "vendor"
MANIFEST = VENDOR / "manifest.json"


def entries() -> list[dict[str, str]]:
    return json.loads(MANIFEST.read_text())


def test_each_vendored_file_matches_its_pinned_hash() -> None:
    for entry in entries():
        digest = hashlib.sha256((VENDOR / entry["file"]).read_bytes()).hexdigest()
        assert digest == entry["sha256"], entry["file"]


def test_no_vendored_file_is_missing_from_the_manifest() -> None:
    listed = {entry["file"] for entry in entries()}
    present = {
        path.relative_to(VENDOR).as_posix()
        for path in VENDOR.rglob("*")
        if path.is_file() and path != MANIFEST
    }
    assert present == listed


def test_each_library_is_pinned_to_one_version_and_ships_its_licence() -> None:
    by_name: dict[str, set[str]] = {}
    for entry in entries():
        by_name.setdefault(entry["name"], set()).add(entry["version"])
        assert entry["license"], entry["file"]
    for name, versions in by_name.items():
        assert len(versions) == 1, name
        files = [e["file"] for e in entries() if e["name"] == name]
        assert any(Path(f).name == "LICENSE" for f in files), f"{name} has no licence file"
