"""The admission queue as a person sees it, in embedded mode (`make run`: SQLite, the
in-memory channel layer, turns on Daphne's own loop): with one turn per process
(OPENWORKER_TURNS_PER_PROCESS=1), a second session's turn waits while the first one
streams, its page says so ("Waiting for a worker… position 1 in the queue", in the
composer's status line, a polite live region), and once the first turn is done the line
goes away and the second reply streams in full.

One user, two tabs: MAX_CONCURRENT_TURNS_PER_USER (3 by default) lets both turns in, so
the wait is the process's, not the user's. Reuses test_embedded_smoke.py's `make run`
harness. Not marked `distributed`: it needs no PostgreSQL or Redis.
"""

from __future__ import annotations

from playwright.sync_api import expect

from tests.e2e.pages import (
    API_KEY,
    LIVE_TIMEOUT_MS,
    assistant_with,
    save_anthropic_settings,
    send,
    sign_in,
    wait_connected,
    wait_streamed,
)
from tests.e2e.test_embedded_smoke import ADMIN_PASSWORD, MODEL, copy_checkout, make_run
from tests.fakes import AnthropicMessagesFake, Reply, drip, text

# The first reply takes ~6 s (40 words, 0.15 s apart): long enough for the second tab's
# turn to arrive and be announced while it streams, short enough for a quick test.
FIRST = [f"one{i} " for i in range(40)]
SECOND = [f"two{i} " for i in range(20)]
WAITING = "Waiting for a worker… position 1 in the queue"


def start_session(page, base: str) -> None:
    page.goto(f"{base}/")
    page.select_option("#new-model", "__custom__")
    page.fill("#new-custom", MODEL)
    page.click("button:has-text('Start a session')")
    wait_connected(page)


def settled(page, last_word: str) -> None:
    """The reply ending in `last_word` is committed once and nothing streams any more."""
    assistant_with(page, last_word)
    page.wait_for_function(
        "() => !document.querySelector('[data-live] .streaming')", timeout=LIVE_TIMEOUT_MS
    )
    page.locator("[data-action=stop]").wait_for(state="hidden", timeout=LIVE_TIMEOUT_MS)
    assert page.inner_text("#transcript").count(last_word) == 1


def test_a_turn_waiting_for_a_worker_shows_its_place_and_then_streams(
    tmp_path, new_page, shot, monkeypatch
):
    # make_run's environment is this process's (minus the distributed settings).
    monkeypatch.setenv("OPENWORKER_TURNS_PER_PROCESS", "1")
    checkout = copy_checkout(tmp_path / "checkout")
    with (
        AnthropicMessagesFake(api_key=API_KEY) as fake,
        make_run(checkout, tmp_path / "run.log") as base,
    ):
        first = new_page()
        sign_in(first, base, "admin", ADMIN_PASSWORD)
        save_anthropic_settings(first, base, api_key=API_KEY, upstream=fake.base_url)
        start_session(first, base)

        # A second tab of the same signed-in browser, on a session of its own.
        second = first.context.new_page()
        second.set_default_timeout(15_000)
        shot.pages.append(second)
        start_session(second, base)
        assert second.url != first.url

        # Replies go out in request order; the second turn asks only once it runs.
        fake.push(Reply(drip(0.15), *[text(w) for w in FIRST]))
        fake.push(Reply(drip(0.1), *[text(w) for w in SECOND]))

        send(first, "First tab: take your time.")
        wait_streamed(first, "one0 ")  # the process's one place is taken
        send(second, "Second tab: my turn next.")

        line = second.locator("[data-connection]")
        expect(line).to_have_text(WAITING, timeout=LIVE_TIMEOUT_MS)
        # Reachable by a screen reader: a status element (an implicit polite live region)
        # in the accessibility tree, the waiting line as its text.
        expect(second.get_by_role("status").filter(has_text=WAITING)).to_have_count(1)
        expect(line).to_have_attribute("aria-live", "polite")
        expect(line).to_match_aria_snapshot(f'- status: "{WAITING}"')
        # Shown as information, not in the error colour (waiting is not a failure).
        expect(line).to_have_attribute("data-kind", "waiting")
        danger = line.evaluate(
            """e => { const probe = document.createElement("span");
                probe.style.color = "var(--danger)"; e.parentElement.append(probe);
                const color = getComputedStyle(probe).color; probe.remove(); return color; }"""
        )
        assert line.evaluate("e => getComputedStyle(e).color") != danger
        # It waits while the first turn streams, and nothing of its reply has come.
        assert FIRST[-1] not in first.inner_text("#transcript")
        assert not second.locator("[data-live] .streamed-text").count()
        assert len(fake.requests) == 1
        shot(second, "second tab waiting")

        # The first turn ends; the second is admitted: the line goes, its reply streams.
        wait_streamed(second, "two0 ")
        expect(line).to_have_text("")
        expect(line).not_to_have_attribute("data-kind", "waiting")
        expect(second.get_by_text("Waiting for a worker")).to_have_count(0)
        shot(second, "second tab streaming")
        settled(first, FIRST[-1].strip())
        settled(second, SECOND[-1].strip())
        assert "".join(SECOND).strip() in second.inner_text("#transcript")
        expect(line).to_have_text("")
        # The header's custom-model box opens only while its picker has focus, so it does
        # not lie over the transcript; the picker itself says which model.
        custom_box = second.locator(".model-bar [data-picker-custom]")
        expect(custom_box).to_be_hidden()
        picker = second.locator(".model-bar [data-picker-select]")
        expect(picker.locator("option:checked")).to_have_text(f"Custom: {MODEL}")
        shot(second, "second reply complete")
        picker.focus()
        expect(custom_box).to_be_visible()
        assert len(fake.requests) == 2
