"""The chat workspace in headless Chromium against the distributed stack, on a desktop
(1280x800) and a phone (390x844), light and dark: Markdown formatted while it streams and
equal to the reload, the sidebar (groups, pin, search with snippets, rename, archive,
delete, the drawer), copy buttons, keyboard (Enter, Shift+Enter, Esc, Ctrl+K,
Ctrl+Shift+O), the theme, a first run without a key, errors in plain words, the live
title, the files panel, the favicon and the context meter. Screenshots of every step land
in artifacts/e2e/<test>/.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.utils import timezone

from sessions import services
from sessions.models import Session, Turn, UserPreferences
from sessions.selectors import workspace_root
from tests.e2e.pages import (
    API_KEY,
    AXE,
    DESKTOP,
    LIVE_TIMEOUT_MS,
    LOOKS,
    MODEL,
    PHONE,
    RUN_AXE,
    assistant_with,
    send,
    wait_connected,
)
from tests.fakes import Reply, drip, http_error, quota_exceeded, rate_limited, text, usage
from tests.support.chat import point_provider_at, session_cookie

pytestmark = [pytest.mark.distributed, pytest.mark.django_db(transaction=True)]


MARKDOWN = """## Results

The run **passed** with `0` errors; see [the log](https://example.com/log).

1. compile
2. test

| step | seconds |
| ---- | ------: |
| build | 12 |
| test | 30 |

> Quoted note.

```python
def total(xs: list[int]) -> int:
    return sum(xs)
```

Math: $a^2 + b^2 = c^2$.

Final words here.
"""


def tokens(markdown: str) -> list[str]:
    return re.findall(r"\s*\S+|\s+", markdown)


@pytest.fixture
def open_page(
    browser: Any, stack: str, shot: Any, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Any]]:
    contexts: list[Any] = []

    def make(user: Any, path: str, *, viewport: dict = DESKTOP, scheme: str = "light") -> Any:
        context = browser.new_context(viewport=viewport, color_scheme=scheme)
        context.grant_permissions(["clipboard-read", "clipboard-write"], origin=stack)
        cookie = session_cookie(user).split("=", 1)[1]
        context.add_cookies([{"name": "sessionid", "value": cookie, "url": stack}])
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        shot.pages.append(page)
        page.goto(f"{stack}{path}")
        return page

    yield make
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        shot.capture_failure()
    for context in contexts:
        context.close()


def background(page: Any) -> tuple[int, int, int]:
    value = page.evaluate("getComputedStyle(document.body).backgroundColor")
    return tuple(int(n) for n in re.findall(r"\d+", value)[:3])  # type: ignore[return-value]


def is_dark(page: Any) -> bool:
    return sum(background(page)) < 3 * 80


def wait_settled(page: Any, selector: str) -> None:
    """No CSS transition or animation runs on `selector` or inside it (a drawer has slid
    all the way in, so its screenshot is not taken mid-slide)."""
    page.wait_for_function(
        "(sel) => { const el = document.querySelector(sel);"
        " return el && el.getAnimations({ subtree: true }).length === 0; }",
        arg=selector,
    )


def open_sidebar_if_phone(page: Any, viewport: dict) -> None:
    if viewport is PHONE:
        page.click("[data-action=toggle-sidebar]")
        page.locator("#sidebar").wait_for(state="visible")
        wait_settled(page, "#sidebar")


@pytest.mark.parametrize(("viewport", "scheme"), LOOKS)
def test_markdown_streams_formatted_and_equals_the_reload(
    open_page, shot, alice, curated_model, fake, viewport, scheme
):
    point_provider_at(alice, "anthropic", fake.base_url, api_key=API_KEY)
    session = Session.objects.create(owner=alice, model=MODEL)
    page = open_page(alice, f"/sessions/{session.pk}/", viewport=viewport, scheme=scheme)
    wait_connected(page)
    assert is_dark(page) == (scheme == "dark"), background(page)
    page.evaluate(
        """() => { const live = document.querySelector('[data-live]');
        new MutationObserver(() => {
          const el = live.querySelector('.streamed-text'); if (el) window.__liveEl = el;
        }).observe(live, { childList: true, subtree: true }); }"""
    )
    fake.push(Reply(drip(0.03), *[text(t) for t in tokens(MARKDOWN)], usage(input=9, output=99)))
    send(page, "Summarise the run")
    live = page.locator("[data-live] .streamed-text")
    live.locator("table").wait_for(timeout=LIVE_TIMEOUT_MS)
    # Mid-stream: formatted already, and the reply is still running.
    assert page.locator("[data-action=stop]").is_visible()
    assert live.locator("h2").count() == 1 and live.locator("ol > li").count() == 2
    assert "Final words" not in live.inner_text()
    shot(page, "mid-stream formatted")
    committed = assistant_with(page, "Final words")
    body = committed.locator(".msg-body")
    assert body.locator("pre code.hljs .hljs-keyword").count() >= 1
    assert body.locator(".code-lang").inner_text() == "python"
    assert body.locator("math").count() == 1
    streamed_html = page.evaluate("window.__liveEl.innerHTML")
    committed_html = body.inner_html()
    assert streamed_html == committed_html
    # The live title (from the first words: OPENWORKER_AUTO_TITLE=0) without a reload.
    page.wait_for_function(
        "() => document.querySelector('[data-chat-title]').textContent.includes('Summarise')",
        timeout=LIVE_TIMEOUT_MS,
    )
    assert "Summarise" in page.title()
    row = page.locator(f"[data-session-id='{session.pk}'] [data-session-title]")
    assert "Summarise" in row.text_content()
    shot(page, "committed")

    # Copy: the code block and the message's Markdown source.
    body.locator(".code-head button.copy").click()
    assert page.evaluate("navigator.clipboard.readText()").startswith("def total(")
    committed.locator("[data-action=copy-message]").click()
    assert page.evaluate("navigator.clipboard.readText()") == MARKDOWN.strip() or (
        page.evaluate("navigator.clipboard.readText()").startswith("## Results")
    )

    page.reload()
    wait_connected(page)
    reloaded = assistant_with(page, "Final words").locator(".msg-body").inner_html()
    assert reloaded == committed_html
    shot(page, "after reload")


@pytest.mark.parametrize(("viewport", "scheme"), LOOKS)
def test_sidebar_groups_pin_search_rename_archive_delete(
    open_page, shot, alice, curated_model, viewport, scheme
):
    now = timezone.now()
    ages = {"Fresh notes": 0, "Yesterday's plan": 1, "Last week draft": 4, "Ancient history": 40}
    made = {}
    for title in ages:
        made[title] = Session.objects.create(owner=alice, model=MODEL, title=title)
    services.message_append(
        session_id=made["Ancient history"].pk,
        role="user",
        content="We talked about the quarterly zebra migration numbers at length.",
    )
    for title, days in ages.items():  # after the message, which counts as activity
        Session.objects.filter(pk=made[title].pk).update(updated_at=now - timedelta(days=days))
    page = open_page(
        alice, f"/sessions/{made['Fresh notes'].pk}/", viewport=viewport, scheme=scheme
    )
    wait_connected(page)
    open_sidebar_if_phone(page, viewport)
    groups = page.locator(".session-group .group-name").all_inner_texts()
    assert [g.lower() for g in groups] == ["today", "yesterday", "previous 7 days", "older"]
    shot(page, "sidebar groups")

    # Pin the oldest: it heads the list.
    row = page.locator(f"[data-session-id='{made['Ancient history'].pk}']")
    row.locator("[data-action=pin-session]").click()
    page.wait_for_function("() => document.querySelector('.group-name').textContent === 'Pinned'")
    assert Session.objects.get(pk=made["Ancient history"].pk).pinned

    # Search with a snippet of the matching text.
    page.fill("[data-search-input]", "zebra")
    hit = page.locator("[data-search-results] .search-hit")
    hit.first.wait_for()
    assert "zebra migration" in hit.first.locator(".snippet").inner_text()
    assert hit.count() == 1
    shot(page, "search snippet")
    page.fill("[data-search-input]", "")
    page.locator("[data-session-groups]").wait_for(state="visible")

    # Rename in place.
    row = page.locator(f"[data-session-id='{made['Last week draft'].pk}']")
    row.locator("[data-action=rename-session]").click()
    row.locator(".rename-form input").fill("Renamed draft")
    row.locator(".rename-form input").press("Enter")
    page.wait_for_function(
        "(id) => document.querySelector(`[data-session-id='${id}'] [data-session-title]`)"
        ".textContent === 'Renamed draft'",
        arg=str(made["Last week draft"].pk),
    )
    assert Session.objects.get(pk=made["Last week draft"].pk).title == "Renamed draft"

    # Archive and delete in place.
    yesterday = made["Yesterday's plan"].pk
    row = page.locator(f"[data-session-id='{yesterday}']")
    row.locator("[data-action=archive-session]").click()
    row.wait_for(state="detached")
    assert Session.objects.get(pk=made["Yesterday's plan"].pk).archived
    page.once("dialog", lambda dialog: dialog.accept())
    row = page.locator(f"[data-session-id='{made['Last week draft'].pk}']")
    row.locator("[data-action=delete-session]").click()
    row.wait_for(state="detached")
    assert not Session.objects.filter(pk=made["Last week draft"].pk).exists()
    shot(page, "after pin rename archive delete")

    if viewport is PHONE:
        page.keyboard.press("Escape")
        page.locator("#sidebar").wait_for(state="hidden")
        wait_settled(page, "#sidebar")
        # The first screen is the conversation, not chrome: the header is one short row.
        head = page.locator(".chat-head").bounding_box()
        assert head["height"] < 80, head
        shot(page, "phone drawer closed")


@pytest.mark.parametrize(("viewport", "scheme"), LOOKS)
def test_keyboard_enter_shift_enter_esc_and_shortcuts(
    open_page, shot, alice, curated_model, fake, viewport, scheme
):
    point_provider_at(alice, "anthropic", fake.base_url, api_key=API_KEY)
    session = Session.objects.create(owner=alice, model=MODEL, title="Keys")
    page = open_page(alice, f"/sessions/{session.pk}/", viewport=viewport, scheme=scheme)
    wait_connected(page)
    box = page.locator("[data-composer-text]")
    box.fill("line one")
    box.press("Shift+Enter")
    box.type("line two")
    assert box.input_value() == "line one\nline two"
    assert not Turn.objects.filter(session=session).exists()
    fake.push(Reply(drip(0.2), *[text(f"w{i} ") for i in range(100)]))
    box.press("Enter")
    page.locator("[data-live] .streamed-text").wait_for(timeout=LIVE_TIMEOUT_MS)
    assert box.input_value() == ""
    mine = page.locator("[data-items] article.msg-user", has_text="line one")
    mine.wait_for()
    assert mine.locator(".msg-body").inner_text() == "line one\nline two", "Shift+Enter kept"
    shot(page, "streaming")
    page.keyboard.press("Escape")
    page.locator("[data-turn-footer] >> text=Stopped.").wait_for(timeout=LIVE_TIMEOUT_MS)
    assert Turn.objects.get(session=session).status == "cancelled"
    shot(page, "stopped with Esc")

    page.keyboard.press("Control+k")
    assert page.evaluate("document.activeElement.id") == "sidebar-q"
    before = Session.objects.filter(owner=alice).count()
    page.keyboard.press("Control+Shift+O")
    page.wait_for_url(lambda url: str(session.pk) not in url)
    assert Session.objects.filter(owner=alice).count() == before + 1
    shot(page, "new session from the keyboard")

    # Every control is reachable with Tab and shows a focus ring.
    wait_connected(page)
    page.locator("body").focus()
    rings = []
    for _ in range(12):
        page.keyboard.press("Tab")
        rings.append(
            page.evaluate(
                "() => { const s = getComputedStyle(document.activeElement);"
                " return [document.activeElement.tagName, s.outlineStyle, s.outlineWidth]; }"
            )
        )
    focusable = [
        r for r in rings if r[0] in ("A", "BUTTON", "INPUT", "SELECT", "TEXTAREA", "SUMMARY")
    ]
    assert focusable, rings
    assert all(r[1] != "none" for r in focusable if r[0] != "TEXTAREA"), rings


def test_the_theme_follows_the_system_and_a_choice_is_remembered(open_page, shot, alice):
    session = Session.objects.create(owner=alice, model=MODEL, title="Themes")
    page = open_page(alice, f"/sessions/{session.pk}/", scheme="dark")
    assert is_dark(page)
    shot(page, "system dark")
    page.select_option("#theme-side", "light")
    page.wait_for_function("() => document.documentElement.dataset.theme === 'light'")
    assert not is_dark(page)
    page.wait_for_timeout(300)
    assert UserPreferences.objects.get(user=alice).theme == "light"
    page.reload()
    assert not is_dark(page), "the choice outlives a reload, over a dark system"
    shot(page, "light chosen over a dark system")
    page.goto(page.url.split("/sessions/")[0] + "/settings/")
    assert not is_dark(page)


@pytest.mark.parametrize(("viewport", "scheme"), LOOKS)
def test_a_first_run_without_a_key_says_so_before_typing_and_picks_a_usable_model(
    open_page, shot, alice, curated_model, fake, stack, viewport, scheme
):
    page = open_page(alice, "/", viewport=viewport, scheme=scheme)
    page.click("button:has-text('Start a session')")
    page.wait_for_url(re.compile(r"/sessions/[0-9a-f-]+/$"))
    note = page.locator("[data-no-key]")
    assert note.is_visible()
    assert note.locator("a", has_text="Settings").get_attribute("href") == "/settings/"
    assert page.locator("[data-no-key]").count() == 1
    shot(page, "no key: the composer says so")
    # With a key for the curated model's provider, a new session starts on that model.
    point_provider_at(alice, "anthropic", fake.base_url, api_key=API_KEY)
    page.goto(f"{stack}/")
    assert page.input_value("#new-model") == MODEL
    page.click("button:has-text('Start a session')")
    page.wait_for_url(re.compile(r"/sessions/[0-9a-f-]+/$"))
    assert page.locator("[data-no-key]").count() == 0
    assert Session.objects.filter(owner=alice).order_by("-created_at").first().model == MODEL
    shot(page, "key present: no note")


@pytest.mark.parametrize(("viewport", "scheme"), LOOKS)
def test_errors_are_plain_words_and_clear_when_a_retry_starts(
    open_page, shot, alice, curated_model, fake, viewport, scheme
):
    point_provider_at(alice, "anthropic", fake.base_url, api_key=API_KEY)
    session = Session.objects.create(owner=alice, model=MODEL, title="Errors")
    page = open_page(alice, f"/sessions/{session.pk}/", viewport=viewport, scheme=scheme)
    wait_connected(page)
    fake.push(Reply(quota_exceeded()))
    send(page, "hello")
    error = page.locator("[data-turn-footer] .error")
    error.wait_for(timeout=LIVE_TIMEOUT_MS)
    assert "out of credit or quota" in error.inner_text()
    assert "Errno" not in page.inner_text("main") and "HTTP" not in error.inner_text()
    shot(page, "quota in plain words")
    # A retry: the old error goes at once, while the new attempt runs.
    fake.push(Reply(drip(0.1), *[text(f"ok{i} ") for i in range(20)]))
    page.click("[data-action=retry]")
    page.locator("[data-turn-footer] .error").wait_for(state="detached", timeout=2_000)
    assistant_with(page, "ok19")
    shot(page, "retried")
    # An upstream 500 is not "could not be reached".
    for _ in range(6):
        fake.push(
            Reply(
                http_error(
                    500, {"type": "error", "error": {"type": "api_error", "message": "boom"}}
                )
            )
        )
    send(page, "again")
    error.first.wait_for(timeout=60_000)
    words = page.locator("[data-turn-footer] .error").inner_text()
    assert "error on its side" in words and "could not be reached" not in words, words
    shot(page, "upstream error in plain words")


# Short enough for the transport to honour (it waits, retries twice, then gives up and
# reports it): the page then counts these seconds down before Retry is allowed.
RETRY_AFTER_SECONDS = 3
COUNTDOWN_LOG = """() => { window.__countdown = [];
  new MutationObserver(() => {
    const el = document.querySelector('[data-retry-countdown]');
    const last = window.__countdown[window.__countdown.length - 1];
    if (el && el.textContent !== last) window.__countdown.push(el.textContent);
  }).observe(document.querySelector('[data-items]'),
    { childList: true, subtree: true, characterData: true }); }"""


@pytest.mark.parametrize(("viewport", "scheme"), LOOKS)
def test_a_rate_limit_says_so_counts_down_to_the_next_attempt_and_clears_on_retry(
    open_page, shot, alice, curated_model, fake, viewport, scheme
):
    point_provider_at(alice, "anthropic", fake.base_url, api_key=API_KEY)
    session = Session.objects.create(owner=alice, model=MODEL, title="Rate limited")
    page = open_page(alice, f"/sessions/{session.pk}/", viewport=viewport, scheme=scheme)
    wait_connected(page)
    page.evaluate(COUNTDOWN_LOG)
    for _ in range(3):  # the first attempt and the transport's two retries
        fake.push(Reply(rate_limited(retry_after=RETRY_AFTER_SECONDS)))
    send(page, "hello")
    footer = page.locator("[data-turn-footer]", has=page.locator(".error"))
    footer.wait_for(timeout=60_000)
    words = footer.locator(".error").inner_text()
    assert "limiting how often you can send" in words, words
    assert "429" not in words and "HTTP" not in words and "Errno" not in words, words
    retry = footer.locator("[data-action=retry]")
    assert retry.is_disabled(), "Retry waits for the countdown"
    shot(page, "rate limited, counting down")
    page.wait_for_function(
        "() => document.querySelector('[data-retry-countdown]')?.textContent"
        " === 'You can retry now.'",
        timeout=LIVE_TIMEOUT_MS,
    )
    seen = page.evaluate("window.__countdown")
    counted = [int(n) for n in re.findall(r"retry in (\d+) s", " ".join(seen))]
    assert counted == list(range(RETRY_AFTER_SECONDS, 0, -1)), seen
    assert seen[-1] == "You can retry now."
    assert retry.is_enabled()
    shot(page, "countdown over, Retry allowed")
    fake.push(Reply(drip(0.1), *[text(f"fine{i} ") for i in range(20)]))
    retry.click()
    # The error goes as soon as the new attempt starts, not when its reply ends.
    page.locator("[data-turn-footer] .error").wait_for(state="detached", timeout=LIVE_TIMEOUT_MS)
    committed = page.locator("[data-items] article.msg-assistant[data-seq]", has_text="fine19")
    assert committed.count() == 0, "the error stayed until the reply had ended"
    assistant_with(page, "fine19")
    assert page.locator("[data-retry-countdown]").count() == 0
    shot(page, "retried after the countdown")


@pytest.mark.parametrize(("viewport", "scheme"), LOOKS)
def test_files_panel_favicon_and_meter(open_page, shot, alice, stack, viewport, scheme):
    session = Session.objects.create(owner=alice, model="anthropic:no-such-model", title="Files")
    root = workspace_root(session.pk)
    (root / "out").mkdir(parents=True, exist_ok=True)
    (root / "out" / "report.md").write_text("# Report\n")
    page = open_page(alice, f"/sessions/{session.pk}/", viewport=viewport, scheme=scheme)
    wait_connected(page)
    assert not page.locator("[data-context-meter]").is_visible(), "unknown window: no meter"
    page.click("button[data-action=toggle-files][aria-controls]")
    link = page.locator("[data-file-list] a", has_text="out/report.md")
    link.wait_for()
    shot(page, "files panel")
    with page.expect_download() as download:
        link.click()
    assert download.value.suggested_filename == "report.md"
    assert httpx.get(f"{stack}/favicon.ico").status_code == 200
    send_button = page.locator("[data-send]")
    page.evaluate("document.querySelector('[data-send]').disabled = true")
    assert send_button.evaluate("(b) => getComputedStyle(b).cursor") == "not-allowed"


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_no_serious_violations(
    open_page, shot, alice, curated_model, fake, stack, browser, scheme
):
    point_provider_at(alice, "anthropic", fake.base_url, api_key=API_KEY)
    session = Session.objects.create(owner=alice, model=MODEL, title="Axe")
    found = {}
    for name, path in (
        ("home", "/"),
        ("settings", "/settings/"),
        ("chat", f"/sessions/{session.pk}/"),
    ):
        page = open_page(alice, path, scheme=scheme)
        page.add_script_tag(url=AXE)
        found[name] = page.evaluate(RUN_AXE)
    fake.push(Reply(drip(0.1), *[text(t) for t in tokens(MARKDOWN)] * 3))
    wait_connected(page)
    send(page, "stream for axe")
    page.locator("[data-live] .streamed-text table").wait_for(timeout=LIVE_TIMEOUT_MS)
    found["chat streaming"] = page.evaluate(RUN_AXE)
    shot(page, f"axe streaming {scheme}")
    context = browser.new_context(color_scheme=scheme)
    signin = context.new_page()
    signin.goto(f"{stack}/accounts/login/")
    signin.add_script_tag(url=AXE)
    found["sign-in"] = signin.evaluate(RUN_AXE)
    context.close()
    assert found == {name: [] for name in found}, found
