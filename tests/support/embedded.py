"""A real Daphne process in embedded mode (`make run`'s configuration) on a state folder
of its own: SQLite there, the in-memory channel layer, turns as asyncio tasks inside
Daphne, dev secrets generated on first start.

Shared by tests/test_embedded_load.py and `bench/stream_path.py --mode embedded`. The
process is kept (not only its URL) so its output can be scanned for lock errors.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.support import procs

# What a distributed shell exports that would turn the process into something else
# (the same list as tests/e2e/test_embedded_smoke.py).
NOT_FOR_EMBEDDED = (
    "DATABASE_URL",
    "REDIS_URL",
    "SECRET_KEY",
    "OPENWORKER_ENCRYPTION_KEYS",
    "DEBUG",
    "ALLOWED_HOSTS",
    "DJANGO_ALLOW_ASYNC_UNSAFE",
)
# SQLite's message when a writer gave up waiting for the lock (SQLITE_BUSY), and the one
# for a shared-cache table lock (SQLITE_LOCKED): either is a refused or lost write.
LOCK_ERRORS = ("database is locked", "database table is locked")


def embedded_env(state: Path, **extra: str) -> dict[str, str]:
    """The environment of an embedded process whose state (database, dev keys) is `state`."""
    env = {k: v for k, v in os.environ.items() if k not in NOT_FOR_EMBEDDED}
    env.update(
        OPENWORKER_STATE_DIR=str(state),
        SQLITE_PATH=str(state / "db.sqlite3"),
        DJANGO_SETTINGS_MODULE="openworker.settings",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def manage(env: dict[str, str], *args: str) -> str:
    """`manage.py <args>` in `env` (migrate, shell -c ...); its stdout."""
    done = subprocess.run(
        [sys.executable, str(procs.REPO / "manage.py"), *args],
        cwd=procs.REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode:
        raise RuntimeError(f"manage.py {args[0]} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


@contextlib.contextmanager
def daphne(env: dict[str, str]) -> Iterator[tuple[str, procs.Proc]]:
    """Daphne as `make run` starts it; yields (base URL, process) once /healthz answers."""
    port = procs.free_port()
    proc = procs.Proc(
        "daphne-embedded",
        [*procs.WEB_SERVER, "-b", "127.0.0.1", "-p", str(port),
         "openworker.asgi:application"],
        env,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + procs.START_TIMEOUT_SECONDS
    while True:
        if proc.popen.poll() is not None:
            proc.fail("exited during start-up")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                break
        if time.monotonic() > deadline:
            proc.fail("did not become healthy")
        time.sleep(0.2)
    try:
        yield base, proc
    finally:
        proc.stop()


def lock_errors(output: str) -> int:
    """How many times the process said a database lock refused it."""
    return sum(output.count(message) for message in LOCK_ERRORS)


def stored_turns(database: Path, turn_ids: list[str]) -> dict[str, tuple[str, str]]:
    """turn id → (status, stored assistant text), read straight from the SQLite file
    (read-only, so the check itself takes no lock). UUIDs are stored as 32 hex digits."""
    keys = {turn_id.replace("-", ""): turn_id for turn_id in turn_ids}
    marks = ",".join("?" * len(keys))
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as conn:
        statuses = dict(
            conn.execute(
                f"SELECT id, status FROM chat_sessions_turn WHERE id IN ({marks})",  # noqa: S608
                list(keys),
            ).fetchall()
        )
        texts: dict[str, list[str]] = {}
        for turn, content in conn.execute(
            "SELECT turn_id, content FROM chat_sessions_message "  # noqa: S608
            f"WHERE role = 'assistant' AND turn_id IN ({marks}) ORDER BY seq",
            list(keys),
        ):
            value = json.loads(content)
            texts.setdefault(turn, []).append(
                value if isinstance(value, str) else json.dumps(value)
            )
    return {
        keys[key]: (statuses.get(key, ""), "".join(texts.get(key, [])))
        for key in keys
        if key in statuses
    }


def journal_mode(database: Path) -> str:
    """The file's journal mode (WAL is a property of the file once set)."""
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as conn:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0])
