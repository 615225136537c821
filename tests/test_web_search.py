"""Session search on PostgreSQL: full-text over titles and message text, GIN-indexed."""

from __future__ import annotations

import pytest
from django.db import connection

from sessions import selectors, services

pytestmark = pytest.mark.distributed


@pytest.fixture
def postgres(require_distributed, db):
    assert connection.vendor == "postgresql"


def test_full_text_search_matches_words_in_titles_and_messages(postgres, owner, teammate):
    titled = services.session_create(owner=owner, title="Quarterly budget")
    talked = services.session_create(owner=owner, title="Untitled")
    services.message_append(
        session_id=talked.pk,
        role="user",
        content=[{"type": "text", "text": "The budget for the offsite in Lyon"}],
    )
    quiet = services.session_create(owner=owner, title="Other")
    services.message_append(session_id=quiet.pk, role="user", content="nothing here")
    theirs = services.session_create(owner=teammate, title="budget")
    found = set(selectors.session_list_page(user=owner, query="budget"))
    assert found == {titled, talked}
    assert theirs not in found
    assert set(selectors.session_list_page(user=owner, query='"offsite in lyon"')) == {talked}
    # Part keys are not text: every multipart message has "type" and "text" keys.
    assert set(selectors.session_list_page(user=owner, query="type")) == set()


def test_search_indexes_exist(postgres):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexname IN "
            "('session_title_fts', 'message_content_fts')"
        )
        rows = dict(cursor.fetchall())
    assert set(rows) == {"session_title_fts", "message_content_fts"}
    assert all("gin" in definition.lower() for definition in rows.values())
