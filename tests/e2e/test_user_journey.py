"""User A's journey in headless Chromium against the distributed stack: a key in settings
(only its last four characters shown back), a session with a curated model, a streamed
reply that survives a reload, Stop, an approved `fetch_url` call, an image sent towards
a model that cannot see it, and the session exported as Markdown and JSON.

The upstream is the Anthropic fake on 127.0.0.1, reached by the Celery worker process.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sessions.models import Message, Session
from tests.e2e.pages import (
    ALICE_PASSWORD,
    API_KEY,
    LIVE_TIMEOUT_MS,
    MODEL,
    assistant_with,
    send,
    sign_in,
    tiny_png,
    transcript_text,
    wait_connected,
    wait_streamed,
)
from tests.fakes import Reply, drip, pause, text, tool_call, usage
from tests.support.chat import point_provider_at

pytestmark = [pytest.mark.distributed, pytest.mark.django_db(transaction=True)]


def test_a_key_a_curated_model_and_a_reply_that_streams_across_a_reload(
    stack, new_page, shot, alice, curated_model, fake
):
    page = new_page()
    sign_in(page, stack, "alice", ALICE_PASSWORD)
    shot(page, "signed in")

    # Settings: add the Anthropic key and point the profile at the fake.
    page.click("text=Settings")
    page.get_by_role("link", name="Add your Anthropic settings").click()
    page.fill("#id_api_key", API_KEY)
    page.fill("#id_base_url", fake.base_url)
    shot(page, "key typed")
    page.click("button:has-text('Save')")
    row = page.locator("tr", has=page.locator("th", has_text="Anthropic"))
    assert "Your key (…WXYZ)" in row.inner_text()
    assert API_KEY not in page.content()
    shot(page, "settings show the last four")
    page.get_by_role("link", name="Edit your Anthropic settings").click()
    assert "…WXYZ" in page.inner_text("main")
    assert page.input_value("#id_api_key") == ""
    assert API_KEY not in page.content()
    shot(page, "edit page never shows the key")

    # A new session with the curated model, from the picker.
    page.click("text=Sessions")
    page.select_option("#new-model", MODEL)
    assert "Can do:" in page.inner_text("[data-picker-caps]")
    shot(page, "curated model picked")
    page.click("button:has-text('Start a session')")
    page.wait_for_url(re.compile(r"/sessions/[0-9a-f-]+/$"))
    session = Session.objects.get(owner=alice)
    assert session.model == MODEL
    wait_connected(page)

    # A slow reply: partial text shows before the end, and a reload mid-reply loses nothing.
    words = [f"word{i} " for i in range(60)]
    fake.push(Reply(drip(0.05), *[text(w) for w in words], usage(input=30, output=60)))
    send(page, "Count to sixty, slowly.")
    streaming = page.locator("[data-live] .streaming .streamed-text")
    wait_streamed(page, "word3 ")
    partial = streaming.inner_text()
    assert "word59" not in partial
    assert page.locator("[data-action=stop]").is_visible()
    shot(page, "partial reply streaming")

    page.reload()
    shot(page, "reloaded mid-reply")
    assistant_with(page, "word59")
    page.wait_for_function("() => !document.querySelector('[data-live] .streaming')")
    final = transcript_text(page)
    assert final.count("word59") == 1
    assert final.count("word0 ") == 1
    assert "".join(words).strip() in " ".join(final.split())
    assert Message.objects.get(session=session, role="assistant").content == "".join(words)
    shot(page, "reply complete after the reload")

    page.reload()
    assert transcript_text(page).count("word59") == 1
    shot(page, "transcript from the database")


def test_stop_keeps_the_partial_reply_and_closes_the_upstream_request(alice_chat, shot, fake):
    page = alice_chat
    fake.push(Reply(text("Half an answer "), pause(30), text("never sent")))
    send(page, "Take your time.")
    wait_streamed(page, "Half an answer")
    shot(page, "reply under way")
    page.click("[data-action=stop]")
    assert fake.wait_for_disconnect(10), "the upstream request was not closed"
    page.locator("[data-items] .turn-footer.status-cancelled").wait_for(timeout=LIVE_TIMEOUT_MS)
    kept = assistant_with(page, "Half an answer")
    assert "never sent" not in transcript_text(page)
    assert kept.count() == 1
    assert page.locator("[data-action=stop]").is_hidden()
    shot(page, "stopped, partial kept")
    page.reload()
    assert "Half an answer" in transcript_text(page)
    assert "Stopped." in transcript_text(page)
    shot(page, "partial kept after reload")


def test_an_approved_fetch_url_call_shows_its_card_and_the_answer(
    alice_chat, shot, fake, local_site
):
    page = alice_chat
    local_site.pages["/notes.html"] = (
        "<html><head><title>Notes</title></head>"
        "<body><h1>Release notes</h1><p>The launch code word is MARMALADE.</p></body></html>"
    )
    url = f"{local_site.url}/notes.html"
    fake.push(
        Reply(text("Let me read that page. "), tool_call("fetch_url", {"url": url})),
        Reply(text("The page says the code word is MARMALADE.")),
    )
    send(page, f"What does {url} say?")
    card = page.locator("[data-approvals] .approval-card", has_text="fetch_url")
    card.wait_for(timeout=LIVE_TIMEOUT_MS)
    assert url in card.inner_text()
    assert local_site.hits == [], "the tool ran before it was approved"
    shot(page, "approval asked")

    card.get_by_role("button", name="Approve").click()
    assistant_with(page, "code word is MARMALADE")
    tool_card = page.locator("[data-items] .tool-card", has_text="fetch_url")
    assert tool_card.count() == 1
    result = page.locator("[data-items] article.msg-tool", has_text="fetch_url")
    result.wait_for()
    result.locator("summary").click()
    assert "MARMALADE" in result.inner_text()
    assert local_site.hits == ["/notes.html"]
    # The model saw the page: the tool result went back upstream.
    assert "MARMALADE" in json.dumps(fake.requests[-1].body)
    shot(page, "tool card, result and answer")


def test_an_image_for_a_model_that_cannot_see_shows_a_warning(alice_chat, alice, shot):
    page = alice_chat
    # A model outside the curated matrix: its capabilities are unknown (no vision). The
    # model policy runs it on Alice's own key only: she has Ollama settings.
    point_provider_at(alice, "ollama", "http://127.0.0.1:11434")
    page.select_option("#chat-model", "__custom__")
    page.fill("#chat-custom", "ollama:llama-e2e")
    assert page.locator("[data-picker-custom] .warning").is_visible()
    page.click("button:has-text('Switch model')")
    page.wait_for_function(
        "() => document.querySelector('[data-model-note]').textContent.includes('ollama:llama-e2e')"
    )
    custom_option = page.locator('#chat-model option[value="__custom__"]')
    assert custom_option.inner_text() == "Custom: ollama:llama-e2e"  # as after a reload
    shot(page, "custom model chosen")
    page.set_input_files(
        "[data-file-input]",
        files=[{"name": "dot.png", "mimeType": "image/png", "buffer": tiny_png()}],
    )
    warning = page.locator("[data-attachment-warning]")
    warning.wait_for(state="visible")
    assert "can't see images" in warning.inner_text()
    assert page.locator("[data-pending-attachments] li", has_text="dot.png").count() == 1
    shot(page, "image warning")

    # The curated model can see images: switching back clears the warning.
    page.select_option("#chat-model", MODEL)
    page.click("button:has-text('Switch model')")
    warning.wait_for(state="hidden")
    assert custom_option.inner_text() == "Custom model…"
    shot(page, "warning gone for a vision model")


def test_export_as_markdown_and_json_downloads_the_messages_and_no_key(
    alice_chat, shot, fake, tmp_path: Path
):
    page = alice_chat
    fake.push(Reply(text("Exports are **tidy**."), usage(input=12, output=5)))
    send(page, "Tell me about exports.")
    assistant_with(page, "Exports are")
    shot(page, "a short conversation")

    page.click(".session-menu summary")  # the exports live in the header's "More" menu
    with page.expect_download() as markdown_download:
        page.click("text=Export Markdown")
    markdown_path = tmp_path / markdown_download.value.suggested_filename
    markdown_download.value.save_as(markdown_path)
    with page.expect_download() as json_download:
        page.click("text=Export JSON")
    json_path = tmp_path / json_download.value.suggested_filename
    json_download.value.save_as(json_path)
    shot(page, "exports downloaded")

    assert markdown_path.suffix == ".md"
    markdown = markdown_path.read_text()
    assert "Tell me about exports." in markdown
    assert "Exports are **tidy**." in markdown

    assert json_path.suffix == ".json"
    exported = json.loads(json_path.read_text())
    dumped = json.dumps(exported)
    assert "Tell me about exports." in dumped
    assert "Exports are **tidy**." in dumped

    for content in (markdown, json_path.read_text()):
        assert API_KEY not in content
        assert "WXYZ" not in content
