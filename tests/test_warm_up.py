"""A serving process builds at start-up what its first turn would otherwise build on the
event loop (openworker/runtime/agent/llm.py `warm_for_serving`), checked in a fresh
interpreter: the test process imported everything long ago."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from providers import factory

PROBE = """
import json, sys
import django
django.setup()
from providers import factory, outbound
from openworker.runtime.agent import llm
wire = [module for module, _ in factory._CLIENT_CLASSES.values()]
before = [module in sys.modules for module in wire]
contexts_before = outbound.default_ssl_context.cache_info().currsize
llm.warm_for_serving()
print(json.dumps({
    "before": before,
    "after": [module in sys.modules for module in wire],
    "contexts_before": contexts_before,
    "contexts_after": outbound.default_ssl_context.cache_info().currsize,
}))
"""


def test_warming_up_imports_every_wire_module_and_builds_the_tls_context_once():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "openworker.settings"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    state = json.loads(out.stdout)
    assert not all(state["before"]), "a wire module was imported before the warm-up"
    assert state["contexts_before"] == 0
    assert all(state["after"])
    assert state["contexts_after"] == 1


def test_a_worker_warms_up_before_it_freezes_what_start_up_made(monkeypatch):
    from openworker.runtime.turns import tasks

    calls: list[str] = []
    monkeypatch.setattr(tasks, "warm_for_serving", lambda: calls.append("warm"))
    monkeypatch.setattr(tasks, "tune_for_serving", lambda: calls.append("freeze"))
    tasks._ready_to_serve()
    assert calls == ["warm", "freeze"]


def test_preloading_names_every_wire_api_the_factory_builds():
    factory.preload_wire_modules()
    for module_name, class_name in factory._CLIENT_CLASSES.values():
        assert hasattr(sys.modules[module_name], class_name)
