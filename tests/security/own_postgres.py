"""A PostgreSQL server of the test's own (initdb + pg_ctl on a free port in a temp dir),
for drills that stop and start it; never the machine's shared server.

initdb refuses to run as root: as root the cluster is made and run as the `postgres`
user (`runuser`). A machine without the binaries skips, but CI (CI=true) fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

from tests.support import procs

PG_BIN = Path(os.environ.get("OPENWORKER_PG_BIN", "/usr/lib/postgresql/15/bin"))
START_TIMEOUT_SECONDS = 30


def require_binaries() -> None:
    if (PG_BIN / "initdb").exists() and (PG_BIN / "pg_ctl").exists():
        return
    why = f"PostgreSQL server binaries not found in {PG_BIN} (set OPENWORKER_PG_BIN)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(why)
    pytest.skip(why)


class OwnPostgres:
    def __init__(self) -> None:
        require_binaries()
        self.port = procs.free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ow-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            if shutil.which("runuser") is None:
                pytest.fail("running as root needs runuser to start PostgreSQL as postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.dir, user="postgres")
        self._run(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust")
        # Enough connections for a Daphne, a worker and the test; fsync off: a drill,
        # not a durability test (fast-stop still writes a clean shutdown).
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.dir}'\nfsync = off\nmax_connections = 50\n"
            )

    def _run(self, *args: str) -> None:
        subprocess.run(
            [*self.as_user, *args], check=True, capture_output=True, timeout=START_TIMEOUT_SECONDS
        )

    def url(self, dbname: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "start")
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            try:
                psycopg.connect(self.url(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def stop_fast(self) -> None:
        """The issue's fault: `pg_ctl stop -m fast` (SIGINT to the postmaster's PID):
        sessions are cut off and the server shuts down cleanly."""
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def create_database(self, name: str) -> None:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(ProcessLookupError, ValueError, OSError):
                os.kill(self.pid(), 9)
            time.sleep(0.2)
        shutil.rmtree(self.dir, ignore_errors=True)
