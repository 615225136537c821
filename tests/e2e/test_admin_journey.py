"""An admin's journey through the Django admin in Chromium, with user A (and B) in other
browser contexts: a model added to the matrix shows in A's picker; low compaction
settings make a long scripted session show its checkpoint; reading A's session takes a
reason and lands in the audit log; deactivating B closes B's open page's socket."""

from __future__ import annotations

import pytest

from sessions import services
from sessions.models import AuditLog, CompactionCheckpoint, CompactionSettings, Session
from tests.e2e.pages import (
    ALICE_PASSWORD,
    BOB_PASSWORD,
    LIVE_TIMEOUT_MS,
    MODEL,
    ROOT_PASSWORD,
    assistant_with,
    send,
    sign_in,
    sign_in_admin,
    transcript_text,
    wait_connected,
)
from tests.fakes import Reply, text, usage

pytestmark = [pytest.mark.distributed, pytest.mark.django_db(transaction=True)]

ADDED_MODEL = "anthropic:claude-added-by-admin"
# The lowest cap the settings accept; the scripted usage below crosses it.
LOW_CAP_TOKENS = 4_000
REVIEW_REASON = "Support ticket 4711: the user reported a wrong answer."


def test_a_model_the_admin_adds_appears_in_the_users_picker(
    stack, new_page, shot, alice, root, curated_model
):
    user = new_page()
    sign_in(user, stack, "alice", ALICE_PASSWORD)
    options = user.locator("#new-model option").all_inner_texts()
    assert not any("Claude Added" in option for option in options)
    shot(user, "picker before")

    admin = new_page()
    sign_in_admin(admin, stack, "root", ROOT_PASSWORD)
    admin.goto(f"{stack}/admin/providers/matrixmodel/add/")
    admin.fill("#id_model_id", ADDED_MODEL)
    admin.fill("#id_label", "Claude Added")
    admin.select_option("#id_provider", "anthropic")
    admin.select_option("#id_tools", "true")
    admin.select_option("#id_vision", "true")
    admin.fill("#id_context_window", "100000")
    shot(admin, "admin fills the matrix row")
    admin.click("input[name=_save]")
    admin.locator(".messagelist .success").wait_for()
    assert ADDED_MODEL in admin.inner_text("#result_list")
    shot(admin, "matrix row saved")

    user.reload()
    option = user.locator(f"#new-model option[value='{ADDED_MODEL}']")
    assert option.count() == 1
    assert "Claude Added" in option.inner_text()
    assert "vision" in option.inner_text()
    user.select_option("#new-model", ADDED_MODEL)
    shot(user, "picker shows the new model")
    user.click("button:has-text('Start a session')")
    user.wait_for_url("**/sessions/*/")
    assert Session.objects.get(owner=alice).model == ADDED_MODEL


def test_low_compaction_settings_show_a_checkpoint_in_a_long_session(
    stack, new_page, shot, alice_chat, root, fake
):
    admin = new_page()
    sign_in_admin(admin, stack, "root", ROOT_PASSWORD)
    admin.goto(f"{stack}/admin/chat_sessions/compactionsettings/")
    admin.fill("#id_cap_tokens", str(LOW_CAP_TOKENS))
    shot(admin, "admin lowers the compaction cap")
    admin.click("input[name=_save]")
    admin.locator(".messagelist .success").wait_for()
    assert CompactionSettings.load().cap_tokens == LOW_CAP_TOKENS

    page = alice_chat
    long_answer = "This is a long and detailed answer. " * 70  # about 2.5k characters
    fake.push(
        Reply(text("First: " + long_answer), usage(input=700, output=650)),
        Reply(text("Second: " + long_answer), usage(input=4_600, output=650)),
        # The third turn starts over the cap: the summarizer's call comes first.
        Reply(text("Summary: the user asked two questions and got long answers.")),
        Reply(text("Third answer, after the checkpoint."), usage(input=900, output=8)),
    )
    send(page, "First question?")
    assistant_with(page, "First:")
    send(page, "Second question?")
    assistant_with(page, "Second:")
    assert not page.locator(".checkpoint").count()
    shot(page, "a long session")

    send(page, "Third question?")
    checkpoint = page.locator("[data-items] aside.checkpoint")
    checkpoint.wait_for(timeout=LIVE_TIMEOUT_MS)
    assistant_with(page, "Third answer")
    checkpoint.locator("summary").click()
    assert "the user asked two questions" in checkpoint.inner_text()
    shot(page, "checkpoint shown live")

    row = CompactionCheckpoint.objects.get(session=page.session)
    page.reload()
    checkpoint = page.locator("[data-items] aside.checkpoint")
    assert checkpoint.count() == 1
    assert f"{row.tokens_before} → {row.tokens_after} tokens" in checkpoint.inner_text()
    # It sits where the summarised part ends: before the second question.
    assert int(checkpoint.get_attribute("data-boundary")) == row.boundary_seq
    text_now = transcript_text(page)
    assert text_now.index("Earlier messages were summarised") < text_now.index("Second question?")
    shot(page, "checkpoint after reload")


def test_reviewing_a_session_takes_a_reason_and_is_in_the_audit_log(
    stack, new_page, shot, alice, root
):
    session = services.session_import(
        owner=alice,
        title="Quarterly numbers",
        model=MODEL,
        messages=[
            {"role": "user", "content": "What were the quarterly numbers?"},
            {"role": "assistant", "content": "Revenue grew by 12 percent."},
        ],
    )
    admin = new_page()
    sign_in_admin(admin, stack, "root", ROOT_PASSWORD)
    admin.goto(f"{stack}/admin/chat_sessions/session/")
    row = admin.locator("#result_list tr", has_text="Quarterly numbers")
    assert "alice" in row.inner_text()
    assert "Revenue grew" not in admin.content()
    row.get_by_role("link", name="Review…").click()
    assert "Revenue grew" not in admin.content()
    shot(admin, "review asks for a reason")

    admin.fill("#id_reason", "ok")  # too short to be a reason
    admin.click("input[value='Open read-only']")
    assert "Revenue grew" not in admin.content()
    assert not AuditLog.objects.filter(action=AuditLog.Action.REVIEW).exists()
    shot(admin, "a one-word reason is refused")

    admin.fill("#id_reason", REVIEW_REASON)
    admin.click("input[value='Open read-only']")
    admin.get_by_text("Revenue grew by 12 percent.").wait_for()
    shot(admin, "transcript read-only")

    admin.goto(f"{stack}/admin/chat_sessions/auditlog/")
    entry = admin.locator("#result_list tr", has_text=REVIEW_REASON)
    assert entry.count() == 1
    assert "root" in entry.inner_text()
    assert "alice" in entry.inner_text()
    logged = AuditLog.objects.get(action=AuditLog.Action.REVIEW)
    assert logged.target_session_id == session.pk
    shot(admin, "audit log shows the review")


def test_deactivating_a_user_closes_their_open_pages_socket(stack, new_page, shot, bob, root):
    session = Session.objects.create(owner=bob, model=MODEL, title="Bob at work")
    user = new_page()
    sign_in(user, stack, "bob", BOB_PASSWORD)
    user.goto(f"{stack}/sessions/{session.pk}/")
    wait_connected(user)
    shot(user, "bob's page connected")

    admin = new_page()
    sign_in_admin(admin, stack, "root", ROOT_PASSWORD)
    admin.goto(f"{stack}/admin/auth/user/{bob.pk}/change/")
    admin.get_by_role("link", name="Deactivate").click()
    admin.fill("#id_reason", "Left the company.")
    shot(admin, "admin deactivates bob")
    admin.click("input[value=Deactivate]")
    admin.locator(".messagelist .success").wait_for()
    shot(admin, "bob deactivated")

    user.locator("[data-connection][data-state=signed-out]").wait_for(
        state="attached", timeout=LIVE_TIMEOUT_MS
    )
    assert "You were signed out" in user.inner_text("[data-connection]")
    shot(user, "bob's page lost its socket")
    user.reload()
    assert "/accounts/login/" in user.url
    shot(user, "bob is signed out")
