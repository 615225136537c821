"""The branch controls in embedded mode (`make run`: SQLite, the in-memory channel layer,
turns on Daphne's own loop), so the tree works in both run modes: an edit adds a version,
the arrows switch back, Regenerate adds a reply, Continue after Stop writes on in the same
reply, and a reload keeps the chosen version. test_branch_journey.py covers the rest on
the distributed stack; this one reuses test_embedded_smoke.py's `make run` harness.

Not marked `distributed`: it needs no PostgreSQL or Redis.
"""

from __future__ import annotations

from tests.e2e.pages import (
    API_KEY,
    LIVE_TIMEOUT_MS,
    assistant_with,
    save_anthropic_settings,
    send,
    sign_in,
    wait_connected,
)
from tests.e2e.test_embedded_smoke import ADMIN_PASSWORD, MODEL, copy_checkout, make_run
from tests.fakes import AnthropicMessagesFake, Reply, pause, text


def wait_path(page, *present: str, absent: tuple[str, ...] = ()) -> None:
    page.wait_for_function(
        """([present, absent]) => {
            const text = document.querySelector('[data-items]').innerText;
            return present.every((w) => text.includes(w)) && !absent.some((w) => text.includes(w));
        }""",
        arg=[list(present), list(absent)],
        timeout=LIVE_TIMEOUT_MS,
    )


def idle(page) -> None:
    page.locator("[data-action=stop]").wait_for(state="hidden", timeout=LIVE_TIMEOUT_MS)
    page.wait_for_function("() => !document.querySelector('[data-live] .streaming')")


def press(locator) -> None:
    """Activate a control from the keyboard: the path this test asserts works."""
    locator.focus()
    locator.page.keyboard.press("Enter")


def user_message(page, words: str):
    locator = page.locator("[data-items] article.msg-user[data-seq]", has_text=words).first
    locator.wait_for(timeout=LIVE_TIMEOUT_MS)
    return locator


def test_edit_switch_regenerate_and_continue_in_embedded_mode(tmp_path, new_page, shot):
    checkout = copy_checkout(tmp_path / "checkout")
    with (
        AnthropicMessagesFake(api_key=API_KEY) as fake,
        make_run(checkout, tmp_path / "run.log") as base,
    ):
        page = new_page()
        sign_in(page, base, "admin", ADMIN_PASSWORD)
        save_anthropic_settings(page, base, api_key=API_KEY, upstream=fake.base_url)
        page.goto(f"{base}/")
        page.select_option("#new-model", "__custom__")
        page.fill("#new-custom", MODEL)
        page.click("button:has-text('Start a session')")
        wait_connected(page)

        fake.push(Reply(text("Apple.")))
        send(page, "Name a fruit.")
        assistant_with(page, "Apple.")
        idle(page)

        first = user_message(page, "Name a fruit.")
        press(first.get_by_role("button", name="Edit message"))
        first.get_by_role("textbox", name="Edited message").fill("Name a vegetable.")
        fake.push(Reply(text("Carrot.")))
        press(first.get_by_role("button", name="Save and send"))
        wait_path(page, "Name a vegetable.", "Carrot.", absent=("Apple.",))
        idle(page)
        shot(page, "edited")

        fake.push(Reply(text("Leek.")))
        press(
            assistant_with(page, "Carrot.").get_by_role(
                "button", name="Regenerate reply", exact=True
            )
        )
        wait_path(page, "Leek.", absent=("Carrot.",))
        idle(page)
        assert "2 / 2" in assistant_with(page, "Leek.").first.inner_text()
        shot(page, "regenerated")

        press(
            user_message(page, "Name a vegetable.").get_by_role("button", name="Previous version")
        )
        wait_path(page, "Name a fruit.", "Apple.", absent=("Name a vegetable.",))

        fake.push(Reply(text("Fruit is "), pause(30), text("never sent")))
        send(page, "Why?")
        page.wait_for_function(
            "() => (document.querySelector('[data-live] .streamed-text')?.textContent || '')"
            ".includes('Fruit is')",
            timeout=LIVE_TIMEOUT_MS,
        )
        page.click("[data-action=stop]")
        bar = page.locator("[data-continue-bar]")
        bar.wait_for(state="visible", timeout=LIVE_TIMEOUT_MS)
        fake.push(Reply(text(" sweet.")))
        press(bar.get_by_role("button", name="Continue"))
        wait_path(page, "Fruit is sweet.")
        idle(page)
        shot(page, "continued")

        page.reload()
        wait_connected(page)
        wait_path(page, "Name a fruit.", "Apple.", "Fruit is sweet.", absent=("Carrot.", "Leek."))
        assert "1 / 2" in user_message(page, "Name a fruit.").inner_text()
        assert "Stopped." not in page.inner_text("[data-items]")
        shot(page, "after a reload")
