"""PostgreSQL fast-stopped during a turn's final save (distributed phase, real processes).

The test's own PostgreSQL (initdb + pg_ctl on a free port; never the machine's server)
holds the app's database; a real Celery worker runs the turn against the fake Anthropic
upstream, whose reply streams, pauses, then ends. During the pause the server is
fast-stopped (`pg_ctl stop -m fast`), so the end of the stream and the model call's
commit (`turn_step_commit`, the final save) meet a database that is down; it is started
again a few seconds later. The turn must end `completed` with the whole reply committed
once. A save on a connection the stop broke is retried (`openworker/runtime/store/dbretry.py`); one
that takes a connection from the pool waits there for the server to come back.

`DRILL_ROUNDS` (default 1) repeats it; `bench/crash_drill.py` runs ten.
Its own module, so that no other worker process consumes the turns queue.
"""

from __future__ import annotations

import math
import os
import subprocess
import threading
import time
from typing import Any

import psycopg
import pytest

from tests.fakes import Reply, drip, pause, text
from tests.security.figures import record
from tests.security.own_postgres import OwnPostgres
from tests.support import procs

ROUNDS = int(os.environ.get("DRILL_ROUNDS", "1"))
# Rounds take ~10-25 s each on a loaded two-core machine (worker start-ups, the sweeper).
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180 + 60 * ROUNDS)]
WORDS = [f"p{i} " for i in range(20)]
LAST = "done."
# The reply streams its words for about STREAM_SECONDS, then pauses PAUSE_SECONDS, then
# ends; the server is stopped STOP_AFTER_SECONDS after the request reached the upstream
# (inside the pause) and kept down DOWN_SECONDS, so the end of the stream and the final
# save meet a stopped server, while the lease (6 s without a beat) still holds.
DRIP_SECONDS = 0.05
STREAM_SECONDS = len(WORDS) * DRIP_SECONDS
STOP_AFTER_SECONDS = STREAM_SECONDS + 0.3
PAUSE_SECONDS = 2.5
DOWN_SECONDS = 2.5
TURN_TIMEOUT_SECONDS = 60.0

SETUP = """
from django.contrib.auth import get_user_model
from providers.edge.models import ProviderProfile
from sessions.models import Session
user = get_user_model().objects.create_user("drill", password="drill-pass-123")
profile = ProviderProfile.objects.create(owner=user, provider="anthropic", base_url={base!r})
profile.set_api_key("test-key")
profile.save()
print(Session.objects.create(owner=user, model="anthropic:claude-test-1").pk)
"""

SEND = """
from django.contrib.auth import get_user_model
from openworker.runtime.turns import commands
from sessions.models import Session
session = Session.objects.get(pk={session!r})
user = get_user_model().objects.get(username="drill")
print(commands.turn_send(session=session, user=user, text={text!r}).pk)
"""


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [str(procs.BIN / "python"), "manage.py", *args],
        cwd=procs.REPO,
        env=procs.process_env(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def turn_row(url: str, turn_id: str) -> tuple[str, str] | None:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            row = conn.execute(
                "SELECT status, partial_text FROM chat_sessions_turn WHERE id = %s", (turn_id,)
            ).fetchone()
    except psycopg.OperationalError:
        return None  # stopped or starting
    return (row[0], row[1]) if row else None


def test_postgres_fast_stopped_during_the_final_save_still_commits_the_reply_as_completed(
    distributed_env: dict[str, str], anthropic_fake: Any
) -> None:
    requested = threading.Event()
    requested_at = [0.0]

    def reply(_text: str) -> Reply:
        requested_at[0] = time.monotonic()
        requested.set()
        return Reply(
            drip(DRIP_SECONDS), *[text(w) for w in WORDS], pause(PAUSE_SECONDS), text(LAST)
        )

    anthropic_fake.script.default = reply
    pg = OwnPostgres()
    retried_saves = 0
    ended_while_down = 0
    completed_in: list[float] = []
    try:
        pg.start()
        pg.create_database("ow_drill")
        url = pg.url("ow_drill")
        env = {**distributed_env, "DATABASE_URL": url}
        manage(env, "migrate", "--noinput")
        session_id = manage(env, "shell", "-c", SETUP.format(base=anthropic_fake.base_url))
        with procs.celery_worker(env) as worker:
            for round_ in range(ROUNDS):
                requested.clear()
                turn_id = manage(
                    env, "shell", "-c", SEND.format(session=session_id, text=f"pg {round_}")
                )
                deadline = time.monotonic() + TURN_TIMEOUT_SECONDS
                assert requested.wait(TURN_TIMEOUT_SECONDS), "the turn never reached the upstream"
                # Into the pause: every word streamed, the end not yet.
                time.sleep(max(0.0, requested_at[0] + STOP_AFTER_SECONDS - time.monotonic()))
                stopped = time.monotonic()
                assert stopped < requested_at[0] + STREAM_SECONDS + PAUSE_SECONDS, "too late"
                pg.stop_fast()
                time.sleep(DOWN_SECONDS)
                pg.start()
                back = time.monotonic()
                # The upstream's reply ended (and the save began) while the server was down.
                assert requested_at[0] + STREAM_SECONDS + PAUSE_SECONDS < back - 0.5
                ended_while_down += 1
                while True:
                    row = turn_row(url, turn_id)
                    if row and row[0] not in ("queued", "running"):
                        break
                    assert time.monotonic() < deadline, ("never ended", row)
                    time.sleep(0.1)
                completed_in.append(time.monotonic() - stopped)
                assert row[0] == "completed", (row, worker.output()[-3000:])
                with psycopg.connect(url) as conn:
                    # jsonb: psycopg gives the decoded value (a string here).
                    contents = [
                        c
                        for (c,) in conn.execute(
                            "SELECT content FROM chat_sessions_message"
                            " WHERE turn_id = %s AND role = 'assistant'",
                            (turn_id,),
                        ).fetchall()
                    ]
                assert contents == ["".join(WORDS) + LAST], contents
            log = worker.output()
            # A save on a connection the stop broke is retried by `dbretry`; one that asks
            # the pool for a connection waits in the pool (up to DB_POOL_TIMEOUT) instead.
            retried_saves = log.count("database write turn_step_commit failed")
            assert "crashed" not in log, log[-3000:]
    finally:
        pg.destroy()

    record("postgres.fast_stops", ROUNDS, "PostgreSQL fast-stopped during a turn's final save")
    record(
        "postgres.saves_while_down",
        ended_while_down,
        "final saves begun while the server was down, all committed as completed",
    )
    record(
        "postgres.retried_final_saves",
        retried_saves,
        "of which met a connection the stop broke and were retried (the rest waited in the pool)",
    )
    record(
        "postgres.max_seconds_stop_to_completed",
        math.ceil(max(completed_in)),
        "seconds at most from the stop to the turn committed as completed (0 failed)",
    )
