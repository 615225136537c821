"""What a turn start costs the worker's database: counted statements of a one-step turn,
and the thread hops they take (a burst's starts share them: tests/test_turn_starts.py).
A burst of a thousand sends queues these on one database thread
(openworker/runtime/store/dbcall.py), so each one shows in the first token of the last
turn of the burst (bench/stream_path.py)."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext

from openworker.runtime.agent import engine
from openworker.runtime.agent.tools.registry import default_registry
from openworker.runtime.store import claims, gather, leases
from openworker.runtime.turns import commands, runner
from providers.edge.matrix import curated_matrix
from sessions.models import CompactionSettings, Session
from tests.fakes import Reply, text
from tests.support.chat import point_provider_at

pytestmark = pytest.mark.django_db(transaction=True)
IGNORED = {"BEGIN", "COMMIT", "SAVEPOINT", "RELEASE"}


def _queued_turn(owner: Any, fake: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    point_provider_at(owner, "anthropic", fake.base_url)
    # Titled: no title call; compaction settings saved once, as on any running site.
    session = Session.objects.create(owner=owner, model="anthropic:claude-test-1", title="t")
    CompactionSettings.load()
    # The curated models as a running process has them (memoised, reloaded on change).
    curated_matrix()
    fake.push(Reply(text("Hello.")))
    monkeypatch.setattr(runner, "_dispatch", lambda turn_ids: None)
    return str(commands.turn_send(session=session, user=owner, text="hello").pk)


def _counting_hops(monkeypatch: pytest.MonkeyPatch, into: list[str]) -> None:
    """Record the name of every database call the engine makes: its own, and the ones the
    turns starting or ending together share (the claim and start through `claims`, the
    commits through `gather`)."""
    for module, name in ((engine, "_db"), (gather, "db"), (claims, "db")):
        real_db = getattr(module, name)

        def counting_db(fn: Any, _real: Any = real_db, **kwargs: Any) -> Any:
            into.append(getattr(fn, "__name__", repr(fn)))
            return _real(fn, **kwargs)

        monkeypatch.setattr(module, name, counting_db)


def test_a_one_step_turn_is_ten_statements_in_two_database_hops(
    owner: Any, anthropic_fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    turn_id = _queued_turn(owner, anthropic_fake, monkeypatch)
    hops: list[str] = []
    _counting_hops(monkeypatch, hops)
    # The session's MCP tools are read by their own query (issue 25's registry): left
    # out here, so this counts the turn's own work.
    tools = default_registry()
    # Embedded: the engine's calls run on this thread, so this connection sees them all.
    with CaptureQueriesContext(connection) as queries:
        async_to_sync(engine.run_turn)(turn_id, tools=tools)

    sql = [q["sql"].split()[0].upper() for q in queries.captured_queries]
    statements = [s for s in sql if s not in IGNORED]
    assert statements == [
        "UPDATE",  # claim the lease
        "SELECT",  # the turn and its session
        "SELECT",  # the model policy, one query on the user's row: a curated model
        #            offered to their teams (not this one), their teams' custom-model
        #            policy, their own key for the provider
        "SELECT",  # the router: the user's provider profiles and the organisation's
        "SELECT",  # the history (the path root → the turn's tip: one recursive query)
        "SELECT",  # the compaction settings and the session's compaction state
        "UPDATE",  # commit: the session's next sequence number
        "SELECT",  # ... the step's message if it was saved before (a replay)
        "INSERT",  # ... the message
        "UPDATE",  # ... the turn's totals and final status
    ], [q["sql"][:90] for q in queries.captured_queries]
    # The claim, the policy, the router, the path and the compaction state are one call,
    # shared with the turns starting at the same moment; the request of a text history
    # is built on the loop (no hop); the commit is one call shared with the turns ending
    # at the same moment.
    assert hops == ["turns_claim_and_start", "turn_step_commits"], hops


def test_the_session_tools_are_read_in_the_claims_call_before_the_lease_is_held(
    owner: Any, anthropic_fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The claim starts the lease's clock: a burst's calls queue on the database thread,
    # and a start read in a call of its own could wait there past LEASE_SECONDS and be
    # interrupted by the sweeper while it streamed. Read in the claim's own call, nothing
    # queues between the claim and the hold that follows it.
    turn_id = _queued_turn(owner, anthropic_fake, monkeypatch)
    events: list[str] = []
    real_hold = leases.LeaseKeeper.hold

    def recording_hold(self: leases.LeaseKeeper, lease: leases.Lease) -> None:
        events.append("hold")
        real_hold(self, lease)

    _counting_hops(monkeypatch, events)
    monkeypatch.setattr(leases.LeaseKeeper, "hold", recording_hold)
    with CaptureQueriesContext(connection) as queries:
        async_to_sync(engine.run_turn)(turn_id)

    assert events == ["turns_claim_and_start", "hold", "turn_step_commits"], events
    # The tools' one query (the session's MCP servers: none) is in the claim's call.
    sql = [q["sql"] for q in queries.captured_queries]
    assert any("mcp" in q.lower() for q in sql), sql
