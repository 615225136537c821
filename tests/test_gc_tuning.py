"""The serving processes' collector settings (openworker/gc_tuning.py), checked in a
fresh interpreter: the test process itself keeps CPython's defaults."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import gc, json, threading
from openworker import gc_tuning
before = gc.get_threshold()
gc_tuning.tune_for_serving()
gc_tuning.tune_for_serving()
print(json.dumps({
    "before": before,
    "after": gc.get_threshold(),
    "frozen": gc.get_freeze_count(),
    "collectors": sum(t.name == "gc-full" for t in threading.enumerate()),
}))
"""


def probe(enabled: str) -> dict:
    env = {**os.environ, "OPENWORKER_GC_TUNING": enabled, "DJANGO_SETTINGS_MODULE": ""}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_serving_freezes_start_up_and_moves_full_collections_to_one_timer():
    state = probe("1")
    assert state["frozen"] > 0
    gen0, gen1, gen2 = state["after"]
    assert (gen0, gen1) == tuple(state["before"][:2])  # young collections as shipped
    assert gen2 >= 1_000_000  # no automatic full collection
    assert state["collectors"] == 1  # called twice, one timer


def test_turned_off_it_leaves_the_collector_as_cpython_ships_it():
    state = probe("0")
    assert state["frozen"] == 0
    assert state["after"] == state["before"]
    assert state["collectors"] == 0
