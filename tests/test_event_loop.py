"""The serving processes' event loop: uvloop's by default (the worker's turn loop and
Daphne's), asyncio's when `OPENWORKER_UVLOOP=0`; what a turn does on it still works."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvloop
from django.core.exceptions import ImproperlyConfigured

from openworker import event_loop
from openworker.runtime.agent.tools import mcp_client
from openworker.runtime.turns.worker_loop import WorkerLoop
from tests.support import embedded

STDIO_SCRIPT = Path(__file__).parent / "mcp" / "stdio_server.py"
UVLOOP_EXTENSION = "/uvloop/loop."


async def _running_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


async def _stop_soon() -> None:
    asyncio.get_running_loop().call_soon(asyncio.get_running_loop().stop)


@pytest.fixture
def turn_loop() -> Iterator[WorkerLoop]:
    """A worker's turn loop of its own, stopped after the test."""
    loop = WorkerLoop()
    yield loop
    if loop.started:
        loop.run(_stop_soon())


def test_the_turn_loop_is_uvloops(monkeypatch, turn_loop):
    monkeypatch.delenv("OPENWORKER_UVLOOP", raising=False)
    assert isinstance(turn_loop.run(_running_loop()), uvloop.Loop)


def test_the_turn_loop_is_asyncios_when_uvloop_is_switched_off(monkeypatch, turn_loop):
    monkeypatch.setenv("OPENWORKER_UVLOOP", "0")
    loop = turn_loop.run(_running_loop())
    assert not isinstance(loop, uvloop.Loop)
    assert isinstance(loop, asyncio.BaseEventLoop)


def test_a_bad_switch_stops_the_process_naming_the_variable(monkeypatch):
    monkeypatch.setenv("OPENWORKER_UVLOOP", "sometimes")
    with pytest.raises(ImproperlyConfigured, match="OPENWORKER_UVLOOP"):
        event_loop.new_event_loop()


def test_an_mcp_stdio_server_starts_and_answers_from_the_turn_loop(turn_loop):
    # The turn loop runs in a thread of its own: the server's process is spawned and
    # reaped from there (libuv's child handling, not asyncio's watcher).
    spec = mcp_client.ServerSpec(
        name="local", transport="stdio", command=sys.executable, args=(str(STDIO_SCRIPT),)
    )
    tools = turn_loop.run(mcp_client.discover(spec))
    assert "echo" in {tool["name"] for tool in tools}


# The web server run as `python -m` runs it, stopped by `--help` before it serves; on the
# way out it says what kind of loop Twisted's reactor runs on, and which reactor it is.
TWISTED_LOOP_KIND = """
import atexit, runpy, sys
def said():
    reactor = sys.modules["twisted.internet.reactor"]
    print(type(reactor).__name__, type(reactor._asyncioEventloop).__module__)
atexit.register(said)
sys.argv = ["web_server", "--help"]
runpy.run_module("openworker.web_server", run_name="__main__", alter_sys=True)
"""


def _twisted_loop_kind(**env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", TWISTED_LOOP_KIND],
        env={k: v for k, v in os.environ.items() if k != "OPENWORKER_UVLOOP"} | env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout.strip().splitlines()[-1]


def test_the_web_server_runs_the_flushing_reactor_on_uvloop_unless_switched_off():
    assert _twisted_loop_kind() == "FlushingReactor uvloop"
    assert _twisted_loop_kind(OPENWORKER_UVLOOP="0") == "FlushingReactor asyncio.unix_events"


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc")
def test_daphne_serves_on_uvloop_unless_switched_off(tmp_path):
    env = embedded.embedded_env(tmp_path)
    env.pop("OPENWORKER_UVLOOP", None)
    embedded.manage(env, "migrate", "--noinput")
    with embedded.daphne(env) as (_, proc):
        assert UVLOOP_EXTENSION in _maps(proc.popen.pid)
    with embedded.daphne({**env, "OPENWORKER_UVLOOP": "0"}) as (_, proc):
        assert UVLOOP_EXTENSION not in _maps(proc.popen.pid)
