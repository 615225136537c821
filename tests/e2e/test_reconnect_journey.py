"""After a server restart the chat page is live again within about 2 s of the server
being back (capped backoff in static/js/socket.js), and a turn that ended while the page
was away shows its final state without a reload.

A Daphne of this test's own serves the page on a fixed port, so the page's socket can
come back to the same address; the Celery worker (module fixture) runs the turn through
the restart.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from sessions.models import Session
from tests.e2e.pages import API_KEY, LIVE_TIMEOUT_MS, MODEL, send, wait_connected, wait_streamed
from tests.fakes import Reply, drip, text, usage
from tests.support import procs
from tests.support.chat import point_provider_at, session_cookie

pytestmark = [pytest.mark.distributed, pytest.mark.django_db(transaction=True)]

# The target: live again this soon after the server answers (the cap is 1.5 s + jitter).
LIVE_AGAIN_SECONDS = 2.0
START_SECONDS = 60.0


def start_daphne(env: dict[str, str], port: int) -> procs.Proc:
    proc = procs.Proc(
        "daphne",
        [
            str(procs.BIN / "daphne"),
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "openworker.asgi:application",
        ],
        procs.process_env(env),
    )
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            proc.fail("exited during start-up")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.fail("did not become healthy")
    raise AssertionError("unreachable")


def test_the_page_is_live_soon_after_a_restart_and_shows_a_turn_that_ended_meanwhile(
    distributed_env: dict[str, str],
    celery_worker: Any,
    browser: Any,
    shot: Any,
    alice: Any,
    curated_model: Any,
    fake: Any,
) -> None:
    point_provider_at(alice, "anthropic", fake.base_url, api_key=API_KEY)
    session = Session.objects.create(owner=alice, model=MODEL, title="Restart")
    port = procs.free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_daphne(distributed_env, port)
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        cookie = session_cookie(alice).split("=", 1)[1]
        context.add_cookies([{"name": "sessionid", "value": cookie, "url": base}])
        page = context.new_page()
        shot.pages.append(page)
        page.goto(f"{base}/sessions/{session.pk}/")
        wait_connected(page)
        words = [f"tok{i} " for i in range(40)]
        fake.push(Reply(drip(0.1), *[text(w) for w in words], usage(input=5, output=40)))
        send(page, "Keep going while the server restarts")
        wait_streamed(page, "tok2")
        server.stop()
        page.wait_for_selector("[data-connection][data-state=reconnecting]", state="attached")
        shot(page, "server down")
        time.sleep(5)  # the reply ends meanwhile (40 tokens at 0.1 s)
        server = start_daphne(distributed_env, port)
        back = time.monotonic()
        wait_connected(page)
        live_after = time.monotonic() - back
        assert live_after < LIVE_AGAIN_SECONDS, f"live {live_after:.2f} s after the server"
        # The turn ended while the page was away: its reply is there, without a reload.
        committed = page.locator("[data-items] article.msg-assistant[data-seq]", has_text="tok39")
        committed.wait_for(timeout=LIVE_TIMEOUT_MS)
        assert page.locator("[data-live] .streaming").count() == 0
        assert page.locator("[data-action=stop]").is_hidden()
        assert page.inner_text("[data-connection]") == ""
        shot(page, f"live again after {live_after:.2f} s, reply shown")
    finally:
        context.close()
        server.stop()
