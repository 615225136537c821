"""Benchmark: a 5,000-message session in the web app.

Run from the repository root: `.venv/bin/python bench/long_session.py`. It builds a
throw-away embedded-mode database (SQLite in a temp folder), fills a session with
user/assistant/tool messages in turns, then measures through Django's test client:

- the chat page's first paint: server time (best of REPEATS) and SQL query count;
- each further page ("load earlier", `?before=<seq>`): time and query count;
- the JSON and Markdown exports: time to stream the whole body, and peak Python memory
  (tracemalloc) while streaming, for 1,000 and 5,000 messages, to show it does not grow
  with the session.

Targets: first page <= 300 ms with the same query count at 1,000 and 5,000 messages;
export peak memory at 5,000 within 1.5x of the 1,000-message figure. Exits non-zero on
a MISS. Bounded: well under a minute.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STATE = tempfile.mkdtemp(prefix="ow-bench-long-")
for name in ("DATABASE_URL", "REDIS_URL"):
    os.environ.pop(name, None)
os.environ.update(
    {
        "DJANGO_SETTINGS_MODULE": "openworker.settings",
        "OPENWORKER_STATE_DIR": STATE,
        "SQLITE_PATH": str(Path(STATE) / "bench.sqlite3"),
        "MEDIA_ROOT": str(Path(STATE) / "media"),
        "OPENWORKER_LEASE_SWEEPER": "0",
        "DEBUG": "1",
    }
)

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from bench._common import print_table, verdict  # noqa: E402

SIZES = (1_000, 5_000)
REPEATS = 5
FIRST_PAGE_TARGET_MS = 300.0
EXPORT_GROWTH_TARGET = 1.5
settings.ALLOWED_HOSTS = ["testserver", *settings.ALLOWED_HOSTS]


def build_session(owner, size: int):  # type: ignore[no-untyped-def]
    from sessions.models import Message, Session, Turn

    session = Session.objects.create(owner=owner, model="anthropic:claude-sonnet-5")
    messages = []
    turns = []
    seq = 0
    while seq < size:
        turn = Turn(session=session, model=session.model, status=Turn.Status.COMPLETED)
        turns.append(turn)
        call = f"call_{seq}"
        for role, content, extra in (
            ("user", f"Question {seq}: please summarise section {seq} of the report.", {}),
            (
                "assistant",
                "Let me read it.",
                {"tool_calls": [{"id": call, "name": "read_file", "arguments": {"path": "r.md"}}]},
            ),
            ("tool", "Section text. " * 40, {"tool_call_id": call}),
            (
                "assistant",
                f"**Summary {seq}.** The section says *many* things.\n\n- one\n- two",
                {},
            ),
        ):
            seq += 1
            if seq > size:
                break
            messages.append(
                Message(session=session, turn=turn, seq=seq, role=role, content=content, **extra)
            )
    Turn.objects.bulk_create(turns)
    Message.objects.bulk_create(messages, batch_size=1_000)
    Session.objects.filter(pk=session.pk).update(next_seq=seq + 1)
    return session


def timed_get(client: Client, url: str) -> tuple[float, int, int]:
    """(best server ms, queries, status) over REPEATS requests."""
    best = float("inf")
    queries = 0
    status = 0
    for _ in range(REPEATS):
        with CaptureQueriesContext(connection) as ctx:
            started = time.perf_counter()
            response = client.get(url)
            if response.streaming:
                for _chunk in response.streaming_content:
                    pass
            elapsed = (time.perf_counter() - started) * 1000
        best = min(best, elapsed)
        queries = len(ctx.captured_queries)
        status = response.status_code
    return best, queries, status


def export_profile(client: Client, url: str) -> tuple[float, float]:
    """(ms to stream the whole export, peak MiB allocated while streaming)."""
    tracemalloc.start()
    started = time.perf_counter()
    response = client.get(url)
    size = 0
    for chunk in response.streaming_content:
        size += len(chunk)
    elapsed = (time.perf_counter() - started) * 1000
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert size > 0
    return elapsed, peak / (1024 * 1024)


def main() -> int:
    from django.contrib.auth import get_user_model

    call_command("migrate", verbosity=0)
    owner = get_user_model().objects.create_user("bench", password="bench-pass-123")
    client = Client()
    client.force_login(owner)

    page_rows = []
    export_rows = []
    firsts: dict[int, tuple[float, int]] = {}
    peaks: dict[str, dict[int, float]] = {"json": {}, "md": {}}
    for size in SIZES:
        session = build_session(owner, size)
        base = f"/sessions/{session.pk}/"
        first_ms, first_q, status = timed_get(client, base)
        assert status == 200, status
        firsts[size] = (first_ms, first_q)
        page_rows.append([size, "first paint", f"{first_ms:.1f}", first_q])
        cursor = size + 1
        for page in range(1, 4):
            cursor -= settings.MESSAGE_WINDOW if hasattr(settings, "MESSAGE_WINDOW") else 100
            ms, q, status = timed_get(client, f"{base}messages?before={cursor}")
            assert status == 200, status
            page_rows.append([size, f"earlier page {page}", f"{ms:.1f}", q])
        for kind in ("json", "md"):
            ms, peak = export_profile(client, f"{base}export.{kind}")
            peaks[kind][size] = peak
            export_rows.append([size, kind, f"{ms:.0f}", f"{peak:.2f}"])

    print(f"\nChat page, {REPEATS} requests each, best server time (embedded SQLite):\n")
    print_table(["messages", "request", "server ms", "queries"], page_rows)
    print("\nExports streamed whole:\n")
    print_table(["messages", "format", "ms", "peak MiB (tracemalloc)"], export_rows)

    small, large = SIZES
    first_ok = firsts[large][0] <= FIRST_PAGE_TARGET_MS
    constant = firsts[small][1] == firsts[large][1]
    growth = {kind: peaks[kind][large] / max(peaks[kind][small], 1e-9) for kind in peaks}
    export_ok = all(g <= EXPORT_GROWTH_TARGET for g in growth.values())
    print()
    print_table(
        ["target", "measured", "verdict"],
        [
            [
                f"first page <= {FIRST_PAGE_TARGET_MS:.0f} ms at {large}",
                f"{firsts[large][0]:.1f} ms",
                verdict(first_ok),
            ],
            [
                "constant queries 1k vs 5k",
                f"{firsts[small][1]} vs {firsts[large][1]}",
                verdict(constant),
            ],
            *[
                [
                    f"{kind} export peak 5k / 1k <= {EXPORT_GROWTH_TARGET}x",
                    f"{g:.2f}x",
                    verdict(g <= EXPORT_GROWTH_TARGET),
                ]
                for kind, g in growth.items()
            ],
        ],
    )
    return 0 if first_ok and constant and export_ok else 1


if __name__ == "__main__":
    sys.exit(main())
