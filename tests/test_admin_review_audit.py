"""Transcript review: an admin reads a session only after giving a reason, and every
reading lands in an audit log that admins can read but not change."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from sessions.audit import audit_record
from sessions.models import AuditLog, Message, Session

pytestmark = pytest.mark.django_db
SECRET_TEXT = "the quarterly numbers are 4242"
REASON = "Customer complaint #17 about a wrong answer"


@pytest.fixture
def session(owner):
    session = Session.objects.create(owner=owner, title="Numbers", model="openai:gpt-test")
    Message.objects.create(session=session, seq=1, role="user", content=SECRET_TEXT)
    Message.objects.create(
        session=session,
        seq=2,
        role="assistant",
        content="<script>alert(1)</script> noted",
        tool_calls=[{"id": "c1", "name": "read_file", "arguments": {"path": "a.txt"}}],
    )
    return session


def review_url(session: Session) -> str:
    return f"/admin/chat_sessions/session/{session.pk}/review/"


def test_the_session_pages_do_not_show_the_transcript(admin_client, session):
    for url in (
        "/admin/chat_sessions/session/",
        f"/admin/chat_sessions/session/{session.pk}/change/",
        review_url(session),
    ):
        page = admin_client.get(url)
        assert page.status_code == 200
        assert SECRET_TEXT.encode() not in page.content
    assert not AuditLog.objects.exists()


def test_a_missing_or_too_short_reason_shows_nothing_and_logs_nothing(admin_client, session):
    for reason in ("", "because"):
        page = admin_client.post(review_url(session), {"reason": reason})
        assert page.status_code == 200
        assert SECRET_TEXT.encode() not in page.content
    assert not AuditLog.objects.exists()


def test_a_reason_opens_the_transcript_read_only_and_writes_the_audit_row(
    admin_client, admin_user, session, owner
):
    page = admin_client.post(review_url(session), {"reason": REASON})
    assert page.status_code == 200
    assert SECRET_TEXT.encode() in page.content
    assert b"<script>alert(1)</script>" not in page.content  # model output is escaped
    assert b"read_file" in page.content
    assert b"<form" not in page.content.split(b'id="content"')[-1]  # nothing to submit
    row = AuditLog.objects.get()
    assert (row.actor, row.action, row.reason) == (admin_user, "review", REASON)
    assert row.target_user == owner and row.target_session_id == session.pk
    admin_client.post(review_url(session), {"reason": REASON})
    assert AuditLog.objects.count() == 2  # each reading is logged


def test_staff_without_view_permission_cannot_review(session):
    staff = get_user_model().objects.create_user("staff", password="x-pass-123", is_staff=True)
    client = Client()
    client.force_login(staff)
    assert client.post(review_url(session), {"reason": REASON}).status_code == 403
    staff.user_permissions.add(
        Permission.objects.get(codename="view_session", content_type__app_label="chat_sessions")
    )
    assert client.post(review_url(session), {"reason": REASON}).status_code == 200


def test_the_audit_log_is_readable_but_not_addable_editable_or_deletable(
    admin_client, admin_user, owner
):
    row = audit_record(actor=admin_user, action="review", reason=REASON, target_user=owner)
    assert admin_client.get("/admin/chat_sessions/auditlog/").status_code == 200
    change = admin_client.get(f"/admin/chat_sessions/auditlog/{row.pk}/change/")
    assert change.status_code == 200
    assert b'name="reason"' not in change.content  # shown, not editable
    assert admin_client.get("/admin/chat_sessions/auditlog/add/").status_code == 403
    posted = admin_client.post(
        f"/admin/chat_sessions/auditlog/{row.pk}/change/", {"reason": "rewritten"}
    )
    assert posted.status_code == 403
    assert admin_client.post(f"/admin/chat_sessions/auditlog/{row.pk}/delete/").status_code == 403
    admin_client.post(
        "/admin/chat_sessions/auditlog/",
        {"action": "delete_selected", "_selected_action": [row.pk], "post": "yes"},
    )
    row.refresh_from_db()
    assert row.reason == REASON


def test_audit_rows_survive_the_deletion_of_the_people_in_them(admin_user, owner):
    row = audit_record(actor=admin_user, action="review", reason=REASON, target_user=owner)
    owner.delete()
    row.refresh_from_db()
    assert row.target_user is None and row.target_username == "alice"


def test_an_unknown_audit_action_is_refused(admin_user):
    with pytest.raises(ValueError):
        audit_record(actor=admin_user, action="peek")
