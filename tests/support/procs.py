"""Real processes for integration tests: Daphne and a Celery worker, bound to loopback.

Each starts with the test process's environment plus the test database's URL, waits
until it is ready, and is killed (its whole process group) on exit. Output goes to a
log file that is printed when a start-up fails, so a broken worker explains itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# The web process as `make run` starts it: Daphne with query strings kept out of its log.
WEB_SERVER = [sys.executable, "-m", "openworker.web_server"]
START_TIMEOUT_SECONDS = 40.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url_for(settings_dict: dict) -> str:
    """The URL of the database the test process is using (pytest-django's test_ copy)."""
    user = settings_dict.get("USER") or "postgres"
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{password}@" if password else f"{user}@"
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgres://{auth}{host}:{port}/{settings_dict['NAME']}"


class Proc:
    def __init__(self, name: str, args: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False)  # noqa: SIM115
        self.popen = subprocess.Popen(
            args,
            cwd=REPO,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        if self.popen.poll() is None:
            self.kill(signal.SIGKILL)
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)

    def fail(self, why: str) -> None:
        output = self.output()
        self.stop()
        raise RuntimeError(f"{self.name} {why}. Its output:\n{output[-4000:]}")


def process_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@contextlib.contextmanager
def daphne(env: dict[str, str]) -> Iterator[str]:
    """Serve the ASGI app; yields its base URL once /healthz answers."""
    port = free_port()
    proc = Proc(
        "daphne",
        [*WEB_SERVER, "-b", "127.0.0.1", "-p", str(port), "openworker.asgi:application"],
        process_env(env),
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        if proc.popen.poll() is not None:
            proc.fail("exited during start-up")
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.fail("did not become healthy")
        time.sleep(0.2)
    try:
        yield base
    finally:
        proc.stop()


@contextlib.contextmanager
def celery_worker(env: dict[str, str], *, concurrency: int = 4) -> Iterator[Proc]:
    """A real worker process with the configured pool; yields once it answers a ping."""
    hostname = f"test-{os.getpid()}-{free_port()}@localhost"
    proc = Proc(
        "celery",
        [
            str(BIN / "celery"), "-A", "openworker", "worker",
            "--pool", "threads", "--concurrency", str(concurrency),
            "--queues", "turns,default", "--hostname", hostname,
            "--without-gossip", "--without-mingle", "--loglevel", "INFO",
        ],
        process_env(env),
    )  # fmt: skip
    from openworker.celery import app

    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        if proc.popen.poll() is not None:
            proc.fail("exited during start-up")
        if app.control.ping(destination=[hostname], timeout=0.5):
            break
        if time.monotonic() > deadline:
            proc.fail("did not answer a ping")
    try:
        yield proc
    finally:
        proc.stop()
