"""After a server restart the chat page is live again within about 2 s of the server
being back (capped backoff in static/js/socket.js), and a turn that ended while the page
was away shows its final state without a reload: a finished reply, or a failure with its
reason and a Retry. On a desktop (1280x800) and a phone (390x844), light and dark.

A Daphne of this test's own serves the page on a fixed port, so the page's socket can
come back to the same address; the Celery worker (module fixture) runs the turn through
the restart.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from sessions.models import Session, Turn
from tests.e2e.pages import (
    API_KEY,
    LIVE_TIMEOUT_MS,
    LOOKS,
    MODEL,
    send,
    wait_connected,
    wait_streamed,
)
from tests.fakes import Reply, drip, error_event, text, usage
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
            *procs.WEB_SERVER,
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


def wait_turn_status(session: Session, status: str) -> None:
    """The session's one turn reached `status` (the Celery worker runs it on its own)."""
    deadline = time.monotonic() + LIVE_TIMEOUT_MS / 1000
    while time.monotonic() < deadline and Turn.objects.get(session=session).status != status:
        time.sleep(0.2)
    assert Turn.objects.get(session=session).status == status


def open_chat(context: Any, shot: Any, base: str, user: Any, session: Session) -> Any:
    cookie = session_cookie(user).split("=", 1)[1]
    context.add_cookies([{"name": "sessionid", "value": cookie, "url": base}])
    page = context.new_page()
    page.set_default_timeout(15_000)
    shot.pages.append(page)
    page.goto(f"{base}/sessions/{session.pk}/")
    wait_connected(page)
    return page


@pytest.mark.parametrize(("viewport", "scheme"), LOOKS)
def test_the_page_is_live_soon_after_a_restart_and_shows_a_turn_that_ended_meanwhile(
    distributed_env: dict[str, str],
    celery_worker: Any,
    browser: Any,
    shot: Any,
    alice: Any,
    curated_model: Any,
    fake: Any,
    viewport: dict,
    scheme: str,
) -> None:
    point_provider_at(alice, "anthropic", fake.base_url, api_key=API_KEY)
    session = Session.objects.create(owner=alice, model=MODEL, title="Restart")
    port = procs.free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_daphne(distributed_env, port)
    context = browser.new_context(viewport=viewport, color_scheme=scheme)
    try:
        page = open_chat(context, shot, base, alice, session)
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
        # Only the reply, as a reload shows it: no stale copy of what arrived before the drop.
        assert page.locator("[data-items] .msg.incomplete").count() == 0
        assert page.locator("[data-action=stop]").is_hidden()
        assert page.inner_text("[data-connection]") == ""
        shot(page, f"live again after {live_after:.2f} s, reply shown")
    finally:
        context.close()
        server.stop()


@pytest.mark.parametrize(("viewport", "scheme"), LOOKS)
def test_a_turn_that_failed_while_the_socket_was_down_shows_its_reason_and_retry_on_return(
    distributed_env: dict[str, str],
    celery_worker: Any,
    browser: Any,
    shot: Any,
    alice: Any,
    curated_model: Any,
    fake: Any,
    viewport: dict,
    scheme: str,
) -> None:
    point_provider_at(alice, "anthropic", fake.base_url, api_key=API_KEY)
    session = Session.objects.create(owner=alice, model=MODEL, title="Failed away")
    port = procs.free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_daphne(distributed_env, port)
    context = browser.new_context(viewport=viewport, color_scheme=scheme)
    try:
        page = open_chat(context, shot, base, alice, session)
        page.evaluate("window.__notReloaded = true")  # a reload would drop it
        # The upstream breaks off with an in-stream error after 3 s: the server is down then.
        words = [f"part{i} " for i in range(30)]
        fake.push(Reply(drip(0.1), *[text(w) for w in words], error_event("overloaded")))
        send(page, "Fail while nobody watches")
        wait_streamed(page, "part2")
        server.stop()
        page.wait_for_selector("[data-connection][data-state=reconnecting]", state="attached")
        shot(page, "server down mid-reply")
        # The worker fails the turn meanwhile (the Celery worker does not need Daphne).
        wait_turn_status(session, "failed")
        assert page.locator("[data-turn-footer] .error").count() == 0, "nothing told the page"
        server = start_daphne(distributed_env, port)
        wait_connected(page)
        # Back: the failure, in plain words, with a Retry, and no reload happened.
        footer = page.locator("[data-turn-footer].status-failed")
        footer.wait_for(timeout=LIVE_TIMEOUT_MS)
        assert "overloaded" in footer.locator(".error").inner_text()
        # What had arrived is the server's whole partial (as after a reload), not only the
        # words the page saw before its socket dropped.
        assert page.locator("[data-items] .msg.incomplete").count() == 0
        assert "part29" in footer.locator("details.partial").text_content()
        retry = footer.locator("[data-action=retry]")
        assert retry.is_visible() and retry.is_enabled()
        assert page.locator("[data-action=stop]").is_hidden()
        assert page.evaluate("window.__notReloaded") is True
        shot(page, "failed with its reason and Retry")
        fake.push(Reply(text("Second time lucky."), usage(input=5, output=4)))
        retry.click()
        page.locator(
            "[data-items] article.msg-assistant[data-seq]", has_text="Second time lucky"
        ).wait_for(timeout=LIVE_TIMEOUT_MS)
        assert page.locator("[data-turn-footer] .error").count() == 0
        shot(page, "retried after coming back")
    finally:
        context.close()
        server.stop()


@pytest.mark.parametrize(("viewport", "scheme"), LOOKS)
def test_a_turn_that_failed_while_the_page_was_left_shows_its_reason_and_retry_on_return(
    stack: str,
    browser: Any,
    shot: Any,
    alice: Any,
    curated_model: Any,
    fake: Any,
    viewport: dict,
    scheme: str,
) -> None:
    point_provider_at(alice, "anthropic", fake.base_url, api_key=API_KEY)
    session = Session.objects.create(owner=alice, model=MODEL, title="Left the page")
    context = browser.new_context(viewport=viewport, color_scheme=scheme)
    try:
        page = open_chat(context, shot, stack, alice, session)
        words = [f"part{i} " for i in range(30)]
        fake.push(Reply(drip(0.1), *[text(w) for w in words], error_event("overloaded")))
        send(page, "Fail while I read my settings")
        wait_streamed(page, "part2")
        page.goto(f"{stack}/settings/")  # the page (and its socket) is gone
        wait_turn_status(session, "failed")
        page.go_back()  # Back, as a person would: no reload button pressed
        wait_connected(page)
        footer = page.locator("[data-turn-footer].status-failed")
        footer.wait_for(timeout=LIVE_TIMEOUT_MS)
        assert "overloaded" in footer.locator(".error").inner_text()
        assert "part29" in footer.locator("details.partial").text_content()
        retry = footer.locator("[data-action=retry]")
        assert retry.is_visible() and retry.is_enabled()
        assert page.locator("[data-action=stop]").is_hidden()
        assert page.locator("[data-live] .streamed-text").count() == 0
        shot(page, "back on the page: failed with its reason and Retry")
    finally:
        context.close()
