"""PostgreSQL connections stay bounded under load (distributed phase, real processes).

A real Daphne and Celery worker (each tagged with its own `application_name`) serve, for
about half a minute: hundreds of HTTP requests from many threads (session list, chat
pages, exports, new sessions), hundreds of websockets opened and closed, and twenty
sessions of ten users sending turns over their sockets. Meanwhile `pg_stat_activity` is
sampled for the test database: each process must stay within `DB_POOL_MAX_SIZE`
(psycopg's pool; before it, Daphne's per-request threads each kept a connection open
until a full garbage collection and the server ran out). Every request must answer
without a 5xx and every turn must complete.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from websockets.sync.client import connect

from sessions.models import Session, Turn
from tests.support import procs
from tests.support.chat import point_provider_at, read_sync_until_status, session_cookie

# About a minute of load, longer on a busy two-core machine: past the default 120 s.
pytestmark = [
    pytest.mark.distributed,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(360),
]

MODEL = "anthropic:claude-test-1"
USERS = 10
SESSIONS_PER_USER = 2
TURNS_PER_SESSION = 3
HTTP_THREADS = 12
HTTP_REQUESTS = 600
CHURN_SOCKETS = 200
SAMPLE_SECONDS = 0.2
DAPHNE_APP = "ow-test-daphne"
WORKER_APP = "ow-test-worker"


class ConnectionSampler:
    """Counts the test database's server-side connections per application_name, from a
    connection of its own to another database (so it never counts itself)."""

    def __init__(self, dbname: str, dsn: str) -> None:
        self.dbname = dbname
        self.dsn = dsn
        self.peak: Counter[str] = Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT application_name, count(*) FROM pg_stat_activity"
                    " WHERE datname = %s GROUP BY application_name",
                    (self.dbname,),
                ).fetchall()
                for name, count in rows:
                    self.peak[name] = max(self.peak[name], count)
                self.samples += 1
                self._stop.wait(SAMPLE_SECONDS)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def test_connections_per_process_stay_within_the_pool_bound_under_load(
    distributed_env: dict[str, str], anthropic_fake: Any
) -> None:
    users = [
        get_user_model().objects.create_user(f"load{i}", password="load-pass-123")
        for i in range(USERS)
    ]
    for user in users:
        point_provider_at(user, "anthropic", anthropic_fake.base_url)
    sessions = [
        Session.objects.create(owner=user, model=MODEL)
        for user in users
        for _ in range(SESSIONS_PER_USER)
    ]
    cookies = {user.pk: session_cookie(user) for user in users}
    params = connection.get_connection_params()
    dbname = connection.settings_dict["NAME"]
    dsn = procs.database_url_for({**connection.settings_dict, "NAME": "postgres"})
    statuses: Counter[int] = Counter()
    errors: list[str] = []
    failures: list[str] = []  # each 5xx: its path and the start of its body (which check)

    with (
        procs.daphne({**distributed_env, "PGAPPNAME": DAPHNE_APP}) as base,
        procs.celery_worker({**distributed_env, "PGAPPNAME": WORKER_APP}, concurrency=8),
        ConnectionSampler(dbname, dsn) as sampler,
    ):

        def http_request(i: int) -> None:
            session = sessions[i % len(sessions)]
            cookie = cookies[session.owner_id]
            paths = [
                "/",
                f"/sessions/{session.pk}/",
                f"/sessions/{session.pk}/export.json",
                f"/sessions/{session.pk}/export.md",
                "/healthz",
            ]
            path = paths[i % len(paths)]
            try:
                response = httpx.get(f"{base}{path}", headers={"Cookie": cookie}, timeout=30)
                statuses[response.status_code] += 1
                if response.status_code >= 500:
                    failures.append(f"{path} {response.status_code}: {response.text[:300]}")
            except httpx.HTTPError as exc:
                errors.append(f"{path}: {exc!r}")

        def churn_socket(i: int) -> None:
            session = sessions[i % len(sessions)]
            url = base.replace("http://", "ws://") + f"/ws/sessions/{session.pk}/"
            headers = {"Cookie": cookies[session.owner_id], "Origin": base}
            try:
                with connect(url, additional_headers=headers, open_timeout=20) as ws:
                    assert json.loads(ws.recv(timeout=20))["type"] == "hello"
                    time.sleep(0.2)
            except Exception as exc:
                errors.append(f"socket: {exc!r}")

        def converse(session: Session) -> None:
            url = base.replace("http://", "ws://") + f"/ws/sessions/{session.pk}/"
            headers = {"Cookie": cookies[session.owner_id], "Origin": base}
            with connect(url, additional_headers=headers, open_timeout=20) as ws:
                assert json.loads(ws.recv(timeout=20))["type"] == "hello"
                for n in range(TURNS_PER_SESSION):
                    ws.send(json.dumps({"type": "send", "text": f"load {n}"}))
                    events = read_sync_until_status(ws, timeout=60)
                    assert events[-1]["status"] == "completed", events[-1]

        started = time.monotonic()
        with ThreadPoolExecutor(HTTP_THREADS + len(sessions)) as pool:
            talks = [pool.submit(converse, s) for s in sessions]
            http = [pool.submit(http_request, i) for i in range(HTTP_REQUESTS)]
            churn = [pool.submit(churn_socket, i) for i in range(CHURN_SOCKETS)]
            for future in talks + http + churn:
                future.result()
        elapsed = time.monotonic() - started
        # Idle a moment: nothing is released later by a garbage collection, so the counts
        # must already be within the bound (the sampler keeps watching).
        time.sleep(2)

    assert not errors, errors[:5]
    assert sum(statuses.values()) == HTTP_REQUESTS
    assert not failures, (statuses, failures[:5])
    turns = Turn.objects.filter(session__in=sessions)
    assert turns.count() == len(sessions) * TURNS_PER_SESSION
    assert set(turns.values_list("status", flat=True)) == {"completed"}
    assert sampler.samples > 20
    bound = settings.DB_POOL_MAX_SIZE
    print(
        f"{HTTP_REQUESTS} requests, {CHURN_SOCKETS + len(sessions)} sockets,"
        f" {turns.count()} turns in {elapsed:.1f}s; peak connections {dict(sampler.peak)}"
        f" (bound {bound} per process; {params.get('dbname')})"
    )
    assert 0 < sampler.peak[DAPHNE_APP] <= bound, sampler.peak
    assert 0 < sampler.peak[WORKER_APP] <= bound, sampler.peak
