"""A fake provider in its own process, for tests that run Celery workers and Daphne.

    with FakeProcess("anthropic", script=[Reply(text("hi"))]) as fake:
        env["OPENWORKER_TEST_ANTHROPIC_URL"] = fake.base_url
        ...
        assert fake.requests()[0]["body"]["model"] == "claude-fake"

Scripting and inspection go through the fake's `/_fake/` control endpoints, so they
work across process boundaries.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from .script import Reply, Script, Step

REPO_ROOT = Path(__file__).resolve().parents[2]
# Long enough for a cold interpreter to import the SDK-free fake and bind.
START_TIMEOUT_SECONDS = 15
STOP_TIMEOUT_SECONDS = 10


class FakeProcess:
    def __init__(
        self,
        provider: str,
        *,
        script: list[Reply] | None = None,
        default: Reply | None = None,
        args: list[str] | None = None,
    ) -> None:
        self.provider = provider
        self._script = Script(script or [], default)
        self._args = list(args or [])
        self._process: subprocess.Popen[str] | None = None
        self.base_url = ""

    def start(self) -> FakeProcess:
        replies = []
        while len(self._script):
            replies.append(self._script.next_reply("").to_json())
        data: dict[str, Any] = {"replies": replies}
        if isinstance(self._script.default, Reply):
            data["default"] = self._script.default.to_json()
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
            json.dump(data, handle)
        command = [sys.executable, "-m", "tests.fakes", "--provider", self.provider]
        command += ["--port", "0", "--script", handle.name, *self._args]
        self._process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
        assert self._process.stdout is not None
        self.base_url = self._process.stdout.readline().strip()
        Path(handle.name).unlink(missing_ok=True)
        if not self.base_url.startswith("http://"):
            self.stop()
            raise RuntimeError(f"fake {self.provider} did not start")
        return self

    @property
    def root_url(self) -> str:
        return self.base_url.removesuffix("/v1")

    def push(self, *replies: Reply | Step) -> None:
        payload = [(r if isinstance(r, Reply) else Reply(r)).to_json() for r in replies]
        httpx.post(self.root_url + "/_fake/script", json=payload).raise_for_status()

    def requests(self) -> list[dict[str, Any]]:
        return httpx.get(self.root_url + "/_fake/requests").json()

    def disconnects(self) -> list[dict[str, Any]]:
        return httpx.get(self.root_url + "/_fake/disconnects").json()

    def clear(self) -> None:
        httpx.post(self.root_url + "/_fake/clear").raise_for_status()

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None

    def __enter__(self) -> FakeProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
