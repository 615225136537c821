"""Migration 0006 turns every existing session into a one-line tree: each message's
parent is the one before it by seq, the active leaf is the last message."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)
BEFORE = [("chat_sessions", "0005_pinned_theme")]
AFTER = [("chat_sessions", "0006_tree")]


def test_the_backfill_makes_each_session_a_line_ending_at_its_last_message(owner):
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    apps = executor.loader.project_state(BEFORE).apps
    Session = apps.get_model("chat_sessions", "Session")
    Message = apps.get_model("chat_sessions", "Message")
    full = Session.objects.create(owner_id=owner.pk, model="m", next_seq=4)
    empty = Session.objects.create(owner_id=owner.pk, model="m")
    for seq, role in ((1, "user"), (2, "assistant"), (3, "user")):
        Message.objects.create(session=full, seq=seq, role=role, content=f"m{seq}")

    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)
    apps = executor.loader.project_state(AFTER).apps
    Session = apps.get_model("chat_sessions", "Session")
    Message = apps.get_model("chat_sessions", "Message")
    rows = Message.objects.filter(session_id=full.pk).order_by("seq")
    assert [(m.seq, m.parent_seq) for m in rows] == [(1, None), (2, 1), (3, 2)]
    assert Session.objects.get(pk=full.pk).active_seq == 3
    assert Session.objects.get(pk=empty.pk).active_seq is None
    MigrationExecutor(connection).migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.distributed
def test_the_backfill_on_postgres(require_distributed, owner):  # type: ignore[no-untyped-def]
    assert connection.vendor == "postgresql"
    test_the_backfill_makes_each_session_a_line_ending_at_its_last_message(owner)
