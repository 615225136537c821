"""The transcript as a tree (issue 19) in headless Chromium against the distributed stack:
edit a message (inline editor, Save, Cancel), regenerate a reply (the same model and
another one from the dialog), switch versions with "< 2 / 3 >" live in two tabs of one
session, Continue after Stop and after a max_tokens finish, Up-arrow in an empty composer,
a branch command refused in words while a reply streams, and a reload mid-reply on a
branch that is not the newest. On a desktop (1280x800) and a phone (390x844), light and
dark. Screenshots of every step land in artifacts/e2e/<test>/.

The upstream is the Anthropic fake (it accepts an assistant prefill: a continuation
extends the same reply, docs/PROTOCOL.md *Continue*).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from providers.edge.models import MatrixModel
from sessions.models import Message, Session
from tests.e2e.pages import (
    API_KEY,
    AXE,
    DESKTOP,
    LIVE_TIMEOUT_MS,
    MODEL,
    PHONE,
    RUN_AXE,
    assistant_with,
    send,
    wait_connected,
)
from tests.fakes import Reply, drip, pause, text
from tests.fakes.script import STOP_MAX_TOKENS
from tests.support.chat import point_provider_at, session_cookie

pytestmark = [pytest.mark.distributed, pytest.mark.django_db(transaction=True)]

OTHER_MODEL = "anthropic:claude-e2e-other"
BUSY = "Wait for the reply to finish"


@pytest.fixture
def open_chat(
    browser: Any,
    stack: str,
    shot: Any,
    alice: Any,
    curated_model: Any,
    fake: Any,
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., Any]]:
    """`open_chat(session, viewport=, scheme=, context=)`: Alice's chat page with its socket
    open. Pass `context=` (a page's `.context`) for a second tab of the same browser."""
    point_provider_at(alice, "anthropic", fake.base_url, api_key=API_KEY)
    contexts: list[Any] = []

    def make(
        session: Session, *, viewport: dict = DESKTOP, scheme: str = "light", context: Any = None
    ) -> Any:
        if context is None:
            context = browser.new_context(viewport=viewport, color_scheme=scheme)
            cookie = session_cookie(alice).split("=", 1)[1]
            context.add_cookies([{"name": "sessionid", "value": cookie, "url": stack}])
            contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        shot.pages.append(page)
        page.goto(f"{stack}/sessions/{session.pk}/")
        wait_connected(page)
        return page

    yield make
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        shot.capture_failure()
    for context in contexts:
        context.close()


@pytest.fixture
def session(alice: Any, curated_model: Any) -> Session:
    return Session.objects.create(owner=alice, model=MODEL, title="Branches")


@pytest.fixture
def other_model(db: object) -> MatrixModel:
    """A second curated model on the same provider (the fake answers any model id)."""
    return MatrixModel.objects.create(
        model_id=OTHER_MODEL,
        label="Claude E2E Other",
        provider="anthropic",
        tools=True,
        vision=True,
        pdf=True,
        context_window=200_000,
        max_output_tokens=8_192,
    )


# --- what a journey looks at -----------------------------------------------------------------


def user_message(page: Any, words: str) -> Any:
    locator = page.locator("[data-items] article.msg-user[data-seq]", has_text=words)
    locator.first.wait_for(timeout=LIVE_TIMEOUT_MS)
    return locator.first


def shown_path(page: Any) -> str:
    """The visible transcript's text, whitespace folded (merged rows are hidden)."""
    return " ".join(page.inner_text("[data-items]").split())


def wait_path(page: Any, *present: str, absent: tuple[str, ...] = ()) -> None:
    """The path on the page shows every `present` words and none of `absent`."""
    page.wait_for_function(
        """([present, absent]) => {
            const text = document.querySelector('[data-items]').innerText;
            return present.every((w) => text.includes(w)) && !absent.some((w) => text.includes(w));
        }""",
        arg=[list(present), list(absent)],
        timeout=LIVE_TIMEOUT_MS,
    )


def count_of(message: Any) -> str:
    return message.locator("[data-branch-count]").inner_text().strip()


def idle(page: Any) -> None:
    """No turn runs (Stop hidden) and nothing streams."""
    page.locator("[data-action=stop]").wait_for(state="hidden", timeout=LIVE_TIMEOUT_MS)
    page.wait_for_function("() => !document.querySelector('[data-live] .streaming')")


def exchange(page: Any, fake: Any, question: str, answer: str) -> None:
    fake.push(Reply(text(answer)))
    send(page, question)
    assistant_with(page, answer)
    idle(page)


def is_dark(page: Any) -> bool:
    value = page.evaluate("getComputedStyle(document.body).backgroundColor")
    return sum(int(n) for n in value[value.index("(") + 1 : value.index(")")].split(",")[:3]) < 240


# --- journeys --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("viewport", "scheme"),
    [
        pytest.param(DESKTOP, "light", id="desktop-light"),
        pytest.param(PHONE, "dark", id="phone-dark"),
    ],
)
def test_editing_a_message_adds_a_version_and_the_arrows_switch_between_them(
    open_chat, shot, fake, session, viewport, scheme
):
    page = open_chat(session, viewport=viewport, scheme=scheme)
    assert is_dark(page) == (scheme == "dark")
    exchange(page, fake, "Name a fruit.", "Apple.")
    shot(page, "one exchange")

    # Cancel leaves the message as it was.
    first = user_message(page, "Name a fruit.")
    first.get_by_role("button", name="Edit message").click()
    editor = first.get_by_role("textbox", name="Edited message")
    assert editor.input_value() == "Name a fruit."
    assert editor.evaluate("(node) => node === document.activeElement")
    shot(page, "inline editor open")
    first.get_by_role("button", name="Cancel").click()
    assert first.locator(".msg-editor").count() == 0
    assert first.get_by_role("button", name="Edit message").evaluate(
        "(node) => node === document.activeElement"
    )

    # Save sends the new text: a new version and its own reply.
    first.get_by_role("button", name="Edit message").click()
    editor = first.get_by_role("textbox", name="Edited message")
    editor.fill("Name a vegetable.")
    fake.push(Reply(text("Carrot.")))
    first.get_by_role("button", name="Save and send").click()
    assistant_with(page, "Carrot.")
    wait_path(page, "Name a vegetable.", "Carrot.", absent=("Name a fruit.", "Apple."))
    idle(page)
    edited = user_message(page, "Name a vegetable.")
    assert count_of(edited) == "2 / 2"
    # The editor was redrawn away: focus went to the composer, not to the page's body.
    assert page.evaluate("document.activeElement.id") == "composer-text"
    assert edited.get_by_role("button", name="Next version").is_disabled()
    shot(page, "the edit is version 2 of 2")
    # The model saw the edited text, not both versions.
    sent = str(fake.requests[-1].body["messages"])
    assert "Name a vegetable." in sent and "Name a fruit." not in sent

    # The arrow (from the keyboard) goes back to the first version and its reply.
    edited.get_by_role("button", name="Previous version").focus()
    page.keyboard.press("Enter")
    wait_path(page, "Name a fruit.", "Apple.", absent=("Name a vegetable.", "Carrot."))
    back = user_message(page, "Name a fruit.")
    assert count_of(back) == "1 / 2"
    # Focus stays on the switcher, so the arrows can be pressed again.
    assert page.evaluate("document.activeElement.dataset.action") == "switch"
    shot(page, "back on version 1, focus on the switcher")

    # Nothing was rewritten or deleted: both questions and both answers are stored.
    texts = sorted(str(m.content) for m in Message.objects.filter(session=session))
    assert texts == sorted(["Name a fruit.", "Apple.", "Name a vegetable.", "Carrot."])
    page.reload()
    wait_connected(page)
    wait_path(page, "Name a fruit.", "Apple.", absent=("Carrot.",))
    assert count_of(user_message(page, "Name a fruit.")) == "1 / 2"
    shot(page, "after a reload the chosen version stays")


@pytest.mark.parametrize(
    ("viewport", "scheme"),
    [
        pytest.param(DESKTOP, "dark", id="desktop-dark"),
        pytest.param(PHONE, "light", id="phone-light"),
    ],
)
def test_regenerate_keeps_every_reply_and_can_use_another_model(
    open_chat, shot, fake, session, other_model, viewport, scheme
):
    page = open_chat(session, viewport=viewport, scheme=scheme)
    exchange(page, fake, "Write a haiku.", "First haiku.")

    fake.push(Reply(text("Second haiku.")))
    assistant_with(page, "First haiku.").get_by_role(
        "button", name="Regenerate reply", exact=True
    ).click()
    reply = assistant_with(page, "Second haiku.").first
    wait_path(page, "Second haiku.", absent=("First haiku.",))
    idle(page)
    assert count_of(reply) == "2 / 2"
    assert fake.requests[-1].body["model"] == MODEL.split(":", 1)[1]
    shot(page, "regenerated: reply 2 of 2")

    # Another model, from the dialog's picker. Esc closes the dialog and asks nothing.
    asked = len(fake.requests)
    opener = reply.get_by_role("button", name="Regenerate with…")
    opener.click()
    dialog = page.get_by_role("dialog", name="Regenerate with another model")
    dialog.wait_for()
    page.keyboard.press("Escape")
    dialog.wait_for(state="hidden")
    assert opener.evaluate("(node) => node === document.activeElement")
    assert len(fake.requests) == asked
    fake.push(Reply(text("Third haiku, other model.")))
    opener.click()
    dialog.wait_for()
    dialog.get_by_label("Model", exact=True).select_option(OTHER_MODEL)
    shot(page, "another model picked")
    dialog.get_by_role("button", name="Regenerate", exact=True).click()
    third = assistant_with(page, "Third haiku, other model.").first
    idle(page)
    assert fake.requests[-1].body["model"] == OTHER_MODEL.split(":", 1)[1]
    assert count_of(third) == "3 / 3"
    assert "claude-e2e-other" in third.locator(".msg-who").inner_text()
    # Each request carried one question and no earlier reply: siblings never mix.
    sent = str(fake.requests[-1].body["messages"])
    assert "First haiku." not in sent and "Second haiku." not in sent
    shot(page, "reply 3 of 3 from the other model")
    # That model answered once: the session, and the header's picker, stay on theirs.
    session.refresh_from_db()
    assert session.model == MODEL

    third.get_by_role("button", name="Previous version").click()
    wait_path(page, "Second haiku.", absent=("Third haiku",))
    assistant_with(page, "Second haiku.").get_by_role("button", name="Previous version").click()
    wait_path(page, "First haiku.", absent=("Second haiku.",))
    assert count_of(assistant_with(page, "First haiku.").first) == "1 / 3"
    assert Message.objects.filter(session=session, role="assistant").count() == 3
    shot(page, "back to the first reply")


def test_switching_a_version_in_one_tab_switches_every_open_tab(open_chat, shot, fake, session):
    first_tab = open_chat(session)
    exchange(first_tab, fake, "Pick a colour.", "Blue.")
    second_tab = open_chat(session, context=first_tab.context)
    assistant_with(second_tab, "Blue.")

    # An edit in the first tab: the second shows the new version without a reload.
    first = user_message(first_tab, "Pick a colour.")
    first.get_by_role("button", name="Edit message").click()
    first.get_by_role("textbox", name="Edited message").fill("Pick a number.")
    fake.push(Reply(text("Seven.")))
    first.get_by_role("button", name="Save and send").click()
    for tab in (first_tab, second_tab):
        wait_path(tab, "Pick a number.", "Seven.", absent=("Pick a colour.", "Blue."))
        idle(tab)
    assert count_of(user_message(second_tab, "Pick a number.")) == "2 / 2"
    shot(second_tab, "second tab followed the edit")

    # The second tab switches back: the first follows.
    user_message(second_tab, "Pick a number.").get_by_role(
        "button", name="Previous version"
    ).click()
    for tab in (second_tab, first_tab):
        wait_path(tab, "Pick a colour.", "Blue.", absent=("Pick a number.", "Seven."))
    assert count_of(user_message(first_tab, "Pick a colour.")) == "1 / 2"
    shot(first_tab, "first tab followed the switch")
    shot(second_tab, "second tab after its switch")


def test_a_redraw_from_another_tab_keeps_an_open_editor_and_its_draft(
    open_chat, shot, fake, session
):
    first_tab = open_chat(session)
    exchange(first_tab, fake, "Question one.", "Answer one.")
    exchange(first_tab, fake, "Question two.", "Answer two.")
    second_tab = open_chat(session, context=first_tab.context)
    assistant_with(second_tab, "Answer two.")
    question = user_message(second_tab, "Question one.")
    question.get_by_role("button", name="Edit message").click()
    question.get_by_role("textbox", name="Edited message").fill("Question one, half rewritten")

    # The first tab regenerates the last reply: the second tab redraws its path, on which
    # the message being edited still lies.
    fake.push(Reply(text("Answer two, again.")))
    assistant_with(first_tab, "Answer two.").get_by_role(
        "button", name="Regenerate reply", exact=True
    ).click()
    assistant_with(second_tab, "Answer two, again.")
    idle(second_tab)
    editor = user_message(second_tab, "Question two.").page.get_by_role(
        "textbox", name="Edited message"
    )
    assert editor.count() == 1
    assert editor.input_value() == "Question one, half rewritten"
    assert count_of(assistant_with(second_tab, "Answer two, again.").first) == "2 / 2"
    shot(second_tab, "the draft survived the other tab's regenerate")


def test_continue_after_stop_and_after_the_output_limit_writes_on_in_the_same_reply(
    open_chat, shot, fake, session
):
    page = open_chat(session)
    fake.push(Reply(text("The story begins "), pause(30), text("never sent")))
    send(page, "Tell me a story.")
    page.wait_for_function(
        "() => (document.querySelector('[data-live] .streamed-text')?.textContent || '')"
        ".includes('The story begins')",
        timeout=LIVE_TIMEOUT_MS,
    )
    bar = page.locator("[data-continue-bar]")
    assert bar.is_hidden()
    page.click("[data-action=stop]")
    assert fake.wait_for_disconnect(10)
    bar.wait_for(state="visible", timeout=LIVE_TIMEOUT_MS)
    assert "stopped" in bar.inner_text()
    shot(page, "stopped: Continue offered")

    # Continue: the fake answers the prefilled reply, and the page shows one reply.
    fake.push(Reply(text(" in a quiet town."), stop=STOP_MAX_TOKENS))
    bar.get_by_role("button", name="Continue").click()
    wait_path(page, "The story begins in a quiet town.")
    idle(page)
    body = fake.requests[-1].body
    assert body["messages"][-1]["role"] == "assistant", "the cut reply goes out as a prefill"
    assert "The story begins" in str(body["messages"][-1]["content"])
    visible = page.locator("[data-items] article.msg-assistant[data-seq]:visible")
    assert visible.count() == 1
    assert "Stopped." not in shown_path(page), "the reply went on: it is no longer stopped"
    shot(page, "continued in the same reply")

    # That continuation hit max_tokens: Continue is offered again, with the reason.
    bar.wait_for(state="visible", timeout=LIVE_TIMEOUT_MS)
    assert "output limit" in bar.inner_text()
    fake.push(Reply(text(" The end.")))
    bar.get_by_role("button", name="Continue").focus()
    page.keyboard.press("Enter")
    wait_path(page, "in a quiet town. The end.")
    idle(page)
    assert bar.is_hidden()
    page.reload()
    wait_connected(page)
    wait_path(page, "The story begins in a quiet town. The end.")
    assert page.locator("[data-items] article.msg-assistant[data-seq]:visible").count() == 1
    assert "Stopped." not in shown_path(page)
    shot(page, "after a reload: one reply")


def test_up_arrow_in_an_empty_composer_edits_the_last_message(open_chat, shot, fake, session):
    page = open_chat(session)
    exchange(page, fake, "First question.", "First answer.")
    exchange(page, fake, "Second question.", "Second answer.")
    box = page.locator("[data-composer-text]")

    # With text in the box the arrow moves the caret, as in any text box.
    box.fill("draft")
    box.press("ArrowUp")
    assert page.locator(".msg-editor").count() == 0
    box.fill("")
    box.press("ArrowUp")
    last = user_message(page, "Second question.")
    editor = last.get_by_role("textbox", name="Edited message")
    editor.wait_for()
    assert editor.evaluate("(node) => node === document.activeElement")
    assert user_message(page, "First question.").locator(".msg-editor").count() == 0
    shot(page, "up-arrow opened the last message")

    # Esc cancels; Enter saves.
    editor.press("Escape")
    assert last.locator(".msg-editor").count() == 0
    box.press("ArrowUp")
    editor = last.get_by_role("textbox", name="Edited message")
    editor.fill("Second question, rephrased.")
    fake.push(Reply(text("A rephrased answer.")))
    editor.press("Enter")
    wait_path(
        page, "Second question, rephrased.", "A rephrased answer.", absent=("Second answer.",)
    )
    assert "First answer." in shown_path(page)
    shot(page, "edited by keyboard")


def test_a_branch_command_while_a_reply_streams_is_refused_in_words(open_chat, shot, fake, session):
    page = open_chat(session)
    exchange(page, fake, "Short one.", "Short answer.")
    fake.push(Reply(drip(0.2), *[text(f"w{i} ") for i in range(100)]))
    send(page, "A long one.")
    page.wait_for_function(
        "() => (document.querySelector('[data-live] .streamed-text')?.textContent || '')"
        ".includes('w2 ')",
        timeout=LIVE_TIMEOUT_MS,
    )

    first = user_message(page, "Short one.")
    first.get_by_role("button", name="Edit message").click()
    first.get_by_role("textbox", name="Edited message").fill("Short one, edited.")
    first.get_by_role("button", name="Save and send").click()
    refusal = first.get_by_role("alert")
    refusal.wait_for(timeout=LIVE_TIMEOUT_MS)
    assert BUSY in refusal.inner_text()
    # What was typed is kept, and the reply keeps streaming.
    assert first.get_by_role("textbox", name="Edited message").input_value() == "Short one, edited."
    assert page.locator("[data-action=stop]").is_visible()
    shot(page, "edit refused while the reply streams")

    assistant_with(page, "Short answer.").get_by_role(
        "button", name="Regenerate reply", exact=True
    ).click()
    refusal = assistant_with(page, "Short answer.").get_by_role("alert")
    refusal.wait_for(timeout=LIVE_TIMEOUT_MS)
    assert BUSY in refusal.inner_text()
    assert Message.objects.filter(session=session, role="user").count() == 2
    shot(page, "regenerate refused too")
    page.click("[data-action=stop]")
    idle(page)


def test_a_reload_mid_reply_on_an_older_version_resumes_that_reply(open_chat, shot, fake, session):
    page = open_chat(session)
    exchange(page, fake, "Plan A?", "Answer A.")
    first = user_message(page, "Plan A?")
    first.get_by_role("button", name="Edit message").click()
    first.get_by_role("textbox", name="Edited message").fill("Plan B?")
    fake.push(Reply(text("Answer B.")))
    first.get_by_role("button", name="Save and send").click()
    wait_path(page, "Plan B?", "Answer B.", absent=("Plan A?",))
    idle(page)
    user_message(page, "Plan B?").get_by_role("button", name="Previous version").click()
    wait_path(page, "Plan A?", "Answer A.", absent=("Plan B?",))

    # A follow-up on the older version, reloaded while it streams.
    words = [f"step{i} " for i in range(40)]
    fake.push(Reply(drip(0.05), *[text(w) for w in words]))
    send(page, "Go on with A.")
    page.wait_for_function(
        "() => (document.querySelector('[data-live] .streamed-text')?.textContent || '')"
        ".includes('step3 ')",
        timeout=LIVE_TIMEOUT_MS,
    )
    shot(page, "streaming on version 1")
    page.reload()
    wait_connected(page)
    assistant_with(page, "step39")
    idle(page)
    path = shown_path(page)
    assert "".join(words).strip() in path
    assert path.count("step39") == 1
    assert "Plan A?" in path and "Answer A." in path and "Plan B?" not in path
    assert count_of(user_message(page, "Plan A?")) == "1 / 2"
    # The follow-up went out on path A: no trace of version B upstream.
    sent = str(fake.requests[-1].body["messages"])
    assert "Plan A?" in sent and "Plan B?" not in sent
    shot(page, "reply resumed on version 1 after the reload")


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_no_serious_violations_in_the_branch_controls(
    open_chat, shot, fake, session, scheme
):
    page = open_chat(session, scheme=scheme)
    exchange(page, fake, "Say hi.", "Hi.")
    first = user_message(page, "Say hi.")
    first.get_by_role("button", name="Edit message").click()
    first.get_by_role("textbox", name="Edited message").fill("Say hello.")
    fake.push(Reply(text("Hello "), pause(30), text("never sent")))
    first.get_by_role("button", name="Save and send").click()
    page.wait_for_function(
        "() => (document.querySelector('[data-live] .streamed-text')?.textContent || '')"
        ".includes('Hello')",
        timeout=LIVE_TIMEOUT_MS,
    )
    page.click("[data-action=stop]")
    page.locator("[data-continue-bar]").wait_for(state="visible", timeout=LIVE_TIMEOUT_MS)
    page.add_script_tag(url=AXE)
    found = {"switcher and Continue": page.evaluate(RUN_AXE)}
    user_message(page, "Say hello.").get_by_role("button", name="Edit message").click()
    found["inline editor"] = page.evaluate(RUN_AXE)
    shot(page, f"editor open {scheme}")
    user_message(page, "Say hello.").get_by_role("button", name="Cancel").click()
    assistant_with(page, "Hello").get_by_role("button", name="Regenerate with…").click()
    page.get_by_role("dialog").wait_for()
    found["regenerate dialog"] = page.evaluate(RUN_AXE)
    shot(page, f"dialog open {scheme}")
    assert found == {name: [] for name in found}, found
