"""The serving processes' GIL switch interval (openworker/thread_switching.py), read in a
fresh interpreter: Daphne's application module and the worker's ready handler set it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import embedded

CPYTHONS_INTERVAL = 0.005

TUNED = """
import sys
from openworker import thread_switching
thread_switching.tune_for_serving()
print(sys.getswitchinterval())
"""

# What each serving process runs at start-up: Daphne imports the ASGI application, a
# worker's `worker_ready` handler warms it and tunes it.
WEB_PROCESS = """
import sys
import openworker.asgi
print(sys.getswitchinterval())
"""

WORKER_PROCESS = """
import sys, django
django.setup()
from openworker.runtime.turns import tasks
before = sys.getswitchinterval()
tasks._ready_to_serve()
print(before, sys.getswitchinterval())
"""


def run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def plain_env(**setting: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OPENWORKER_SWITCH_INTERVAL_SECONDS"}
    return env | {"DJANGO_SETTINGS_MODULE": ""} | setting


def test_a_serving_process_hands_the_gil_over_every_millisecond():
    done = run(TUNED, plain_env())
    assert float(done.stdout) == pytest.approx(0.001)


def test_the_interval_is_configurable_and_zero_keeps_cpythons():
    done = run(TUNED, plain_env(OPENWORKER_SWITCH_INTERVAL_SECONDS="0.0025"))
    assert float(done.stdout) == pytest.approx(0.0025)
    done = run(TUNED, plain_env(OPENWORKER_SWITCH_INTERVAL_SECONDS="0"))
    assert float(done.stdout) == pytest.approx(CPYTHONS_INTERVAL)


def test_a_malformed_interval_stops_the_process_naming_the_setting():
    done = run(TUNED, plain_env(OPENWORKER_SWITCH_INTERVAL_SECONDS="fast"))
    assert done.returncode != 0
    assert "OPENWORKER_SWITCH_INTERVAL_SECONDS must be a number" in done.stderr


def test_the_web_process_and_the_worker_start_with_the_short_interval(tmp_path: Path):
    env = embedded.embedded_env(tmp_path)
    env.pop("OPENWORKER_SWITCH_INTERVAL_SECONDS", None)
    embedded.manage(env, "migrate", "--noinput")
    web = run(WEB_PROCESS, env)
    assert web.returncode == 0, web.stderr
    assert float(web.stdout.split()[-1]) == pytest.approx(0.001)
    worker = run(WORKER_PROCESS, env)
    assert worker.returncode == 0, worker.stderr
    before, after = map(float, worker.stdout.split()[-2:])
    assert before == pytest.approx(CPYTHONS_INTERVAL)
    assert after == pytest.approx(0.001)
