"""The chat page of a branched session (issue 19): the active path only, each message's
place among its siblings for the switcher, `?leaf=` for another path, `?after=` along the
active one, and a prefill continuation marked for the page to join to its reply."""

from __future__ import annotations

import json
import re

import pytest
from django.db import transaction
from django.urls import reverse

from sessions import services
from sessions.models import Session

pytestmark = pytest.mark.django_db


def insert(session: Session, *, parent: int | None, **fields: object) -> int:
    """A message under `parent`, made the active leaf (as edit / regenerate do)."""
    with transaction.atomic():
        message, _ = services.message_insert(
            session_id=session.pk, fields=fields, dedupe_key=None, parent_seq=parent, activate=True
        )
    return message.seq


@pytest.fixture
def branched(owner: object) -> Session:
    """Plan A? → Answer A (seqs 1, 2), then an edit: Plan B? → Answer B (3, 4), active."""
    session = services.session_create(owner=owner, model="anthropic:claude-sonnet-4-5")
    services.message_append(session_id=session.pk, role="user", content="Plan A?")
    services.message_append(session_id=session.pk, role="assistant", content="Answer A.")
    plan_b = insert(session, parent=None, role="user", content="Plan B?")
    insert(
        session, parent=plan_b, role="assistant", content="Answer B.", finish_reason="max_tokens"
    )
    session.refresh_from_db()
    return session


def page_data(html: str) -> dict:
    found = re.search(r'<script id="page-data" type="application/json">(.*?)</script>', html, re.S)
    assert found
    return json.loads(found.group(1))


def test_the_chat_page_shows_the_active_path_with_its_switcher(client, owner, branched):
    client.force_login(owner)
    html = client.get(reverse("chat", args=[branched.pk])).content.decode()
    assert "Plan B?" in html and "Answer B." in html
    assert "Plan A?" not in html and "Answer A." not in html
    assert re.search(r"data-branch-count>\s*2 / 2\s*<", html)
    assert 'aria-label="Previous version"' in html and 'data-seq="1"' in html
    assert 'data-finish="max_tokens"' in html
    assert page_data(html)["activeLeaf"] == 4


def test_leaf_returns_the_other_path_as_a_page_would_open_on_it(client, owner, branched):
    client.force_login(owner)
    url = reverse("session_messages", args=[branched.pk])
    body = client.get(url, {"leaf": 2}).json()
    html = "".join(m["html"] for m in body["messages"])
    assert "Plan A?" in html and "Answer A." in html
    assert "Plan B?" not in html
    assert re.search(r"data-branch-count>\s*1 / 2\s*<", html)
    assert body["first_seq"] == 1 and body["more"] is False


def test_after_walks_the_active_path_only(client, owner, branched):
    client.force_login(owner)
    url = reverse("session_messages", args=[branched.pk])
    assert [m["seq"] for m in client.get(url, {"after": 0}).json()["messages"]] == [3, 4]
    assert [m["seq"] for m in client.get(url, {"after": 0, "leaf": 2}).json()["messages"]] == [1, 2]
    # Each message says its parent, for the page's check that it extends the path shown.
    first = client.get(url, {"after": 3}).json()["messages"][0]["html"]
    assert 'data-parent="3"' in first


def test_only_a_prefill_continuation_is_marked_to_join_its_reply(client, owner, branched):
    prefill = insert(branched, parent=4, role="assistant", content=" more", continuation="prefill")
    told = insert(
        branched, parent=prefill, role="assistant", content="Rest.", continuation="instruction"
    )
    client.force_login(owner)
    url = reverse("session_messages", args=[branched.pk])
    rows = {m["seq"]: m["html"] for m in client.get(url, {"after": 4}).json()["messages"]}
    assert 'data-continues="4"' in rows[prefill]
    assert "data-continues" not in rows[told]


def test_another_users_leaf_is_not_found(client, teammate, branched):
    client.force_login(teammate)
    url = reverse("session_messages", args=[branched.pk])
    assert client.get(url, {"leaf": 2}).status_code == 404
