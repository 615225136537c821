"""Benchmark: a 5,000-message session in the web app.

Run from the repository root: `.venv/bin/python bench/long_session.py`. It builds a
throw-away embedded-mode database (SQLite in a temp folder), fills a session with
user/assistant/tool messages in turns, then measures through Django's test client:

- the chat page's first paint: server time (best of REPEATS) and SQL query count;
- each further page ("load earlier", `?before=<seq>`): time and query count;
- the JSON and Markdown exports: time to stream the whole body, and peak Python memory
  (tracemalloc) while streaming, for 1,000 and 5,000 messages, to show it does not grow
  with the session.

The transcript as a tree (issue 19): a 5,000-message session with 200 branches (a
4,000-message main line, and 200 regenerated replies of five messages each hanging off
its user messages) is opened the same way, and the active path is computed (the query the
page and every model call make: a recursive CTE over parent links) for leaves at several
depths, in that tree and in a 20,000-message one.

Targets: first page <= 300 ms with the same query count at 1,000 and 5,000 messages, and
for the branched 5,000-message session the same query count as the unbranched one;
the active path's time grows with its depth, not with the tree (at depth 4,000, the
20,000-message tree within 1.5x of the 5,000-message one); export peak memory at 5,000
within 1.5x of the 1,000-message figure. Exits non-zero on a MISS. Bounded: about a
minute.
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
BRANCHES = 200
BRANCH_MESSAGES = 5
DEPTHS = (500, 1_000, 2_000, 4_000)
PATH_TREE_GROWTH_TARGET = 1.5
settings.ALLOWED_HOSTS = ["testserver", *settings.ALLOWED_HOSTS]


def build_session(owner, size: int, branches: int = 0):  # type: ignore[no-untyped-def]
    """A main line of `size - branches * BRANCH_MESSAGES` messages in turns, and
    `branches` regenerated replies (five messages each) under its user messages, spread
    along it. The active leaf is the main line's last message."""
    from sessions.models import Message, Session, Turn

    main = size - branches * BRANCH_MESSAGES
    session = Session.objects.create(owner=owner, model="anthropic:claude-sonnet-5")
    messages = []
    turns = []
    seq = 0
    while seq < main:
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
            if seq > main:
                break
            messages.append(
                Message(
                    session=session,
                    turn=turn,
                    seq=seq,
                    parent_seq=seq - 1 or None,
                    role=role,
                    content=content,
                    **extra,
                )
            )
    users = [m.seq for m in messages if m.role == "user"]
    step = max(1, len(users) // max(branches, 1))
    for index in range(branches):
        turn = Turn(session=session, model=session.model, status=Turn.Status.COMPLETED)
        turns.append(turn)
        parent = users[(index * step) % len(users)]
        for position in range(BRANCH_MESSAGES):
            seq += 1
            role = ("assistant", "user")[position % 2]
            messages.append(
                Message(
                    session=session,
                    turn=turn,
                    seq=seq,
                    parent_seq=parent,
                    role=role,
                    content=f"Branch {index}, message {position}.",
                )
            )
            parent = seq
    Turn.objects.bulk_create(turns)
    Message.objects.bulk_create(messages, batch_size=1_000)
    Session.objects.filter(pk=session.pk).update(next_seq=seq + 1, active_seq=main)
    session.refresh_from_db()
    return session


def path_ms(session, leaf: int) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """(best ms over REPEATS, path length) for the path root -> `leaf`."""
    from sessions import selectors

    best = float("inf")
    length = 0
    for _ in range(REPEATS):
        started = time.perf_counter()
        length = len(selectors.session_path(session_id=session.pk, leaf_seq=leaf))
        best = min(best, (time.perf_counter() - started) * 1000)
    return best, length


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

    # The tree: the branched session's page against the unbranched one of the same size.
    large = SIZES[-1]
    tree = build_session(owner, large, branches=BRANCHES)
    base = f"/sessions/{tree.pk}/"
    tree_ms, tree_q, status = timed_get(client, base)
    assert status == 200, status
    page_rows.append([f"{large} ({BRANCHES} branches)", "first paint", f"{tree_ms:.1f}", tree_q])
    from sessions import selectors

    window, _ = selectors.messages_window(session=tree)
    ms, earlier_q, status = timed_get(client, f"{base}messages?before={window[0].seq}")
    assert status == 200, status
    page_rows.append([f"{large} ({BRANCHES} branches)", "earlier page 1", f"{ms:.1f}", earlier_q])
    big = build_session(owner, 4 * large, branches=BRANCHES)
    path_rows = []
    at_depth: dict[int, float] = {}
    for depth in DEPTHS:
        small_ms, length = path_ms(tree, depth)
        big_ms, big_length = path_ms(big, depth)
        assert length == big_length == depth, (length, big_length, depth)
        at_depth[depth] = small_ms / max(big_ms, 1e-9)
        path_rows.append([depth, f"{small_ms:.1f}", f"{big_ms:.1f}"])

    print(f"\nChat page, {REPEATS} requests each, best server time (embedded SQLite):\n")
    print_table(["messages", "request", "server ms", "queries"], page_rows)
    print("\nExports streamed whole:\n")
    print_table(["messages", "format", "ms", "peak MiB (tracemalloc)"], export_rows)

    print(f"\nActive path root -> leaf at a depth, best of {REPEATS} (embedded SQLite):\n")
    print_table(["depth", f"ms, {large}-message tree", f"ms, {4 * large}-message tree"], path_rows)
    deepest = DEPTHS[-1]
    tree_growth = 1 / at_depth[deepest]
    path_ok = tree_growth <= PATH_TREE_GROWTH_TARGET
    same_q = tree_q == firsts[large][1]
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
            [
                f"branched {large} page queries = unbranched",
                f"{tree_q} vs {firsts[large][1]}",
                verdict(same_q),
            ],
            [
                f"path at depth {deepest}: {4 * large} / {large} tree <= "
                f"{PATH_TREE_GROWTH_TARGET}x",
                f"{tree_growth:.2f}x",
                verdict(path_ok),
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
    return 0 if first_ok and constant and export_ok and same_q and path_ok else 1


if __name__ == "__main__":
    sys.exit(main())
