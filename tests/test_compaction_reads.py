"""A model call reads the compaction settings and the session's compaction state in one
query (`compactor.load_settings_and_state`), with the same answers as reading them apart,
on SQLite and on PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from openworker.runtime.agent import compactor
from sessions.models import CompactionSettings, Session

SETTINGS = ("enabled", "threshold_pct", "cap_tokens", "keep_recent_fraction", "summary_model")


def _as_read_apart(owner: Any) -> None:
    session = Session.objects.create(
        owner=owner,
        model="anthropic:claude-test-1",
        compaction_state={"boundary_index": 2, "summary": "earlier", "kept": []},
        last_context_tokens=12_345,
    )
    # No settings row yet: made with its defaults, as `CompactionSettings.load` does.
    CompactionSettings.objects.all().delete()
    cfg, state, reported = compactor.load_settings_and_state(session.pk, None)  # type: ignore[arg-type]
    assert CompactionSettings.objects.filter(pk=1).exists()
    defaults = CompactionSettings()
    assert [getattr(cfg, f) for f in SETTINGS] == [getattr(defaults, f) for f in SETTINGS]
    assert (state, reported) == compactor.load_state(session.pk, None)
    assert state is not None and state.summary == "earlier" and reported == 12_345

    CompactionSettings.objects.filter(pk=1).update(
        enabled=False,
        threshold_pct=0.5,
        cap_tokens=8_000,
        keep_recent_fraction=0.1,
        summary_model="openai:gpt-summary",
    )
    with CaptureQueriesContext(connection) as queries:
        cfg, state, reported = compactor.load_settings_and_state(session.pk, None)  # type: ignore[arg-type]
    assert len(queries.captured_queries) == 1
    saved = CompactionSettings.objects.get(pk=1)
    assert [getattr(cfg, f) for f in SETTINGS] == [getattr(saved, f) for f in SETTINGS]
    assert cfg.enabled is False
    assert (state, reported) == compactor.load_state(session.pk, None)


@pytest.mark.django_db
def test_the_settings_and_state_read_together_equal_the_ones_read_apart(owner: Any) -> None:
    _as_read_apart(owner)


@pytest.mark.distributed
@pytest.mark.django_db(transaction=True)
def test_the_settings_and_state_read_together_on_postgresql(owner: Any) -> None:
    assert connection.vendor == "postgresql"
    _as_read_apart(owner)


@pytest.mark.django_db
def test_a_session_that_is_gone_is_an_error_not_empty_settings(owner: Any) -> None:
    session = Session.objects.create(owner=owner, model="anthropic:claude-test-1")
    session_id = session.pk
    session.delete()
    with pytest.raises(Session.DoesNotExist):
        compactor.load_settings_and_state(session_id, [])
