"""The transcript as a tree (issue 19, docs/PROTOCOL.md "Branches"): edit, regenerate,
switch and continue as turn commands, the active path the page and the engine read,
export/import of the whole tree, the admin's review, usage on every branch and
compaction checkpoints per path. On SQLite (embedded) and PostgreSQL (distributed)."""

from __future__ import annotations

import json
import threading
from decimal import Decimal

import pytest
from django.db import close_old_connections, connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from openworker.runtime.agent import compaction, compactor
from openworker.runtime.turns import commands
from sessions import export, importing, selectors, services
from sessions.models import AuditLog, CompactionCheckpoint, Message, Session, Turn
from tests.support.chat import point_provider_at

MODEL = "anthropic:claude-test-1"


def _finish(turn: Turn, *replies: str, cost: str | None = None) -> list[Message]:
    """Stand in for the engine: the turn's replies (each under the turn's tip), then done."""
    written = [
        services.message_append(
            session_id=turn.session_id,
            turn_id=turn.pk,
            role="assistant",
            content=text,
            model=turn.model,
            finish_reason="end_turn",
            dedupe_key=f"{turn.pk}:a{i}",
        )
        for i, text in enumerate(replies)
    ]
    Turn.objects.filter(pk=turn.pk).update(
        status=Turn.Status.COMPLETED, steps=len(replies), cost=Decimal(cost) if cost else None
    )
    return written


def _exchange(session: Session, user, text: str, reply: str, cost: str | None = None) -> Turn:  # type: ignore[no-untyped-def]
    turn = commands.turn_send(session=session, user=user, text=text)
    _finish(turn, reply, cost=cost)
    return turn


def _path(session: Session) -> list[tuple[str, object]]:
    return [(m.role, m.content) for m in selectors.session_path(session_id=session.pk)]


def _session(owner) -> Session:  # type: ignore[no-untyped-def]
    return services.session_create(owner=owner, model=MODEL)


class TreeContract:
    @pytest.fixture(autouse=True)
    def _own_key(self, owner):  # type: ignore[no-untyped-def]
        # The model policy lets a user run any model of a provider they hold a key for;
        # nothing here calls the provider (no turn is run).
        point_provider_at(owner, "anthropic", "http://127.0.0.1:9")

    def test_the_first_messages_form_a_line_under_the_active_leaf(self, owner):
        session = _session(owner)
        _exchange(session, owner, "one", "1")
        _exchange(session, owner, "two", "2")
        rows = selectors.session_messages(session_id=session.pk)
        assert [(m.seq, m.parent_seq) for m in rows] == [(1, None), (2, 1), (3, 2), (4, 3)]
        assert Session.objects.get(pk=session.pk).active_seq == 4

    def test_editing_adds_a_sibling_and_a_turn_and_rewrites_nothing(self, owner):
        session = _session(owner)
        _exchange(session, owner, "one", "1")
        _exchange(session, owner, "two", "2")
        before = list(Message.objects.filter(session=session).values())
        turn = commands.turn_edit(session=session, user=owner, message=3, text="two, better")
        edited = Message.objects.get(session=session, turn=turn)
        assert (edited.seq, edited.parent_seq, edited.content) == (5, 2, "two, better")
        assert list(Message.objects.filter(session=session, seq__lt=5).values()) == before
        session.refresh_from_db()
        assert session.active_seq == 5
        assert _path(session) == [("user", "one"), ("assistant", "1"), ("user", "two, better")]
        _finish(turn, "2b")
        assert _path(session)[-1] == ("assistant", "2b")
        rows, _ = selectors.messages_window(session=Session.objects.get(pk=session.pk))
        assert [m.siblings for m in rows] == [[1], [2], [3, 5], [6]]

    def test_an_edit_keeps_the_attachments_unless_told_otherwise(self, owner):
        session = _session(owner)
        part = {"type": "image_url", "image_url": {"url": "attachment:x"}}
        turn = commands.turn_start(session=session, text="look", attachments=[part])
        _finish(turn, "a cat")
        commands.turn_edit(session=session, user=owner, message=1, text="look again")
        edited = Message.objects.get(session=session, seq=3)
        assert edited.content == [{"type": "text", "text": "look again"}, part]
        assert edited.parent_seq is None  # a sibling of the first message: a second root

    def test_regenerating_answers_the_same_user_message_again_on_another_model(self, owner):
        session = _session(owner)
        _exchange(session, owner, "one", "1")
        turn = commands.turn_regenerate(
            session=session, user=owner, message=2, model="anthropic:claude-test-2"
        )
        assert (turn.base_seq, turn.model) == (1, "anthropic:claude-test-2")
        assert Session.objects.get(pk=session.pk).active_seq == 1
        # The other model answered this once: the session stays on the one it was on.
        assert Session.objects.get(pk=session.pk).model == session.model
        [reply] = _finish(turn, "1 again")
        assert (reply.parent_seq, reply.seq) == (1, 3)
        assert Session.objects.get(pk=session.pk).active_seq == 3
        assert [m.seq for m in selectors.turn_path(turn=turn)] == [1, 3]

    def test_switching_shows_the_newest_leaf_under_a_message(self, owner):
        session = _session(owner)
        _exchange(session, owner, "one", "1")
        _exchange(session, owner, "two", "2")
        _finish(commands.turn_edit(session=session, user=owner, message=1, text="uno"), "I")
        assert commands.branch_switch(session=session, message=1) == 4
        session.refresh_from_db()
        assert [c for _, c in _path(session)] == ["one", "1", "two", "2"]
        Session.objects.filter(pk=session.pk).update(last_context_tokens=9_000)
        assert commands.branch_switch(session=session, message=5) == 6
        session.refresh_from_db()
        assert session.last_context_tokens is None  # that size was the other path's
        assert [c for _, c in _path(session)] == ["uno", "I"]
        # A send extends the path the page shows.
        _exchange(session, owner, "dos", "II")
        session.refresh_from_db()
        assert [c for _, c in _path(session)] == ["uno", "I", "dos", "II"]

    def test_branch_commands_are_refused_while_a_turn_the_page_has_seen_runs(self, owner):
        session = _session(owner)
        _exchange(session, owner, "one", "1")
        commands.turn_send(session=session, user=owner, text="two")  # still queued
        session.refresh_from_db()
        for attempt in (
            lambda leaf: commands.turn_edit(
                session=session, user=owner, message=1, text="x", leaf=leaf
            ),
            lambda leaf: commands.turn_regenerate(
                session=session, user=owner, message=2, leaf=leaf
            ),
            lambda leaf: commands.branch_switch(session=session, message=1, leaf=leaf),
        ):
            for leaf in (None, session.active_seq):
                with pytest.raises(services.TurnRefused, match="Wait for the reply"):
                    attempt(leaf)
        assert Message.objects.filter(session=session).count() == 3

    def test_two_tabs_racing_to_branch_both_get_their_sibling(self, owner):
        session = _session(owner)
        _exchange(session, owner, "one", "1")
        seen = Session.objects.get(pk=session.pk).active_seq  # what both tabs show
        first = commands.turn_edit(session=session, user=owner, message=1, text="A", leaf=seen)
        second = commands.turn_edit(session=session, user=owner, message=1, text="B", leaf=seen)
        assert first.pk != second.pk
        roots = Message.objects.filter(session=session, parent_seq__isnull=True)
        assert sorted(roots.values_list("content", flat=True)) == ["A", "B", "one"]
        _finish(first, "a")
        _finish(second, "b")
        assert [m.content for m in selectors.turn_path(turn=first)] == ["A", "a"]
        assert [m.content for m in selectors.turn_path(turn=second)] == ["B", "b"]

    def test_a_burst_of_turns_reads_each_turns_own_path_in_one_walk(self, owner):
        # What a burst of turn starts reads together (`selectors.turn_paths`): for every
        # kind of tip, the same path as each turn's own walk.
        session = _session(owner)
        _exchange(session, owner, "one", "1")
        answered = _exchange(session, owner, "two", "2")
        edit = commands.turn_edit(session=session, user=owner, message=3, text="deux")
        _finish(edit, "II", "II bis")  # a tip that is the turn's own newest reply
        regenerate = commands.turn_regenerate(session=session, user=owner, message=2)
        other = _session(owner)
        queued = commands.turn_send(session=other, user=owner, text="alone")
        turns = [answered, edit, regenerate, queued, answered]
        with CaptureQueriesContext(connection) as queries:
            together = selectors.turn_paths(turns=turns)
        assert len(queries.captured_queries) == 1
        apart = [selectors.turn_path(turn=turn) for turn in turns]
        assert [[(m.seq, m.content) for m in path] for path in together] == [
            [(m.seq, m.content) for m in path] for path in apart
        ]
        assert [m.content for m in together[2]] == ["one"]  # from the regenerate's base
        assert [m.content for m in together[3]] == ["alone"]
        assert selectors.turn_paths(turns=[]) == []

    def test_continue_takes_only_a_cut_reply_and_picks_prefill_by_api(self, owner):
        session = _session(owner)
        turn = _exchange(session, owner, "one", "1")
        with pytest.raises(services.TurnRefused, match="stopped or cut"):
            commands.turn_continue(turn=turn, user=owner)
        Message.objects.filter(turn=turn, role="assistant").update(finish_reason="max_tokens")
        follow = commands.turn_continue(turn=turn, user=owner)
        assert (follow.base_seq, follow.continuation) == (2, "prefill")
        assert commands.continuation_kind("openai:gpt-test") == "instruction"
        assert commands.continuation_kind("bedrock:anthropic.claude") == "prefill"

    def test_the_page_reads_a_branched_session_in_as_many_queries_as_a_line(self, owner):
        line = _session(owner)
        tree = _session(owner)
        for session in (line, tree):
            for i in range(3):
                _exchange(session, owner, f"q{i}", f"a{i}")
        for i in range(3):
            _finish(commands.turn_regenerate(session=tree, user=owner, message=2 + 2 * i), "r")
            commands.branch_switch(session=tree, message=2 * i + 1)
        client = Client()
        client.force_login(owner)
        counts = []
        for session in (line, tree):
            client.get(reverse("chat", args=[session.pk]))  # warm caches (matrix, ...)
            with CaptureQueriesContext(connection) as queries:
                assert client.get(reverse("chat", args=[session.pk])).status_code == 200
            counts.append(len(queries))
        assert counts[0] == counts[1]

    def test_the_messages_endpoint_gives_any_branch_by_its_leaf(self, owner):
        session = _session(owner)
        _exchange(session, owner, "one", "1")
        _finish(commands.turn_regenerate(session=session, user=owner, message=2), "uno")
        client = Client()
        client.force_login(owner)
        url = reverse("session_messages", args=[session.pk])
        data = client.get(url, {"leaf": 2}).json()
        assert [(m["seq"], m["parent"], m["siblings"]) for m in data["messages"]] == [
            (1, None, [1]),
            (2, 1, [2, 3]),
        ]
        data = client.get(url, {"leaf": 3}).json()
        assert [m["seq"] for m in data["messages"]] == [1, 3]

    def test_json_export_and_import_round_trip_the_whole_tree(self, owner):
        session = _session(owner)
        _exchange(session, owner, "one", "1")
        _finish(commands.turn_edit(session=session, user=owner, message=1, text="uno"), "I")
        commands.branch_switch(session=session, message=1)
        session.refresh_from_db()
        document = json.loads("".join(export.session_json_chunks(session)))
        assert document["version"] == 2 and document["session"]["active_leaf"] == 2
        parsed = importing.parse_import(json.dumps(document).encode())
        copy = services.session_import(
            owner=owner,
            title="copy",
            model=MODEL,
            messages=parsed.messages,
            parents=parsed.parents,
            active_leaf=parsed.active_leaf,
        )
        shape = [
            (m.seq, m.parent_seq, m.content) for m in selectors.session_messages(session_id=copy.pk)
        ]
        assert shape == [(1, None, "one"), (2, 1, "1"), (3, None, "uno"), (4, 3, "I")]
        assert copy.active_seq == 2

    def test_an_import_whose_parent_is_not_an_earlier_message_is_refused(self, owner):
        document = {
            "format": "openworker.session",
            "version": 2,
            "messages": [
                {"seq": 1, "parent": 2, "role": "user", "content": "a"},
                {"seq": 2, "parent": None, "role": "assistant", "content": "b"},
            ],
        }
        with pytest.raises(importing.ImportRejected, match="parent names no earlier"):
            importing.parse_import(json.dumps(document).encode())

    def test_markdown_export_shows_the_active_path_and_counts_other_branches(self, owner):
        session = _session(owner)
        _exchange(session, owner, "one", "1")
        _finish(commands.turn_regenerate(session=session, user=owner, message=2), "uno")
        _finish(commands.turn_regenerate(session=session, user=owner, message=2), "eins")
        session.refresh_from_db()
        text = "".join(export.session_markdown_chunks(session))
        assert "eins" in text and "uno" not in text and "\n1\n" not in text
        assert "2 other branches exist" in text

    def test_the_admins_review_lists_every_branch(self, owner, admin_client):
        session = _session(owner)
        _exchange(session, owner, "one", "1")
        _finish(commands.turn_regenerate(session=session, user=owner, message=2), "uno")
        url = reverse("admin:chat_sessions_session_review", args=[session.pk])
        page = admin_client.post(url, {"reason": "Support ticket 12"}).content.decode()
        assert "The transcript has 2 branches" in page
        assert page.count("<td>other</td>") == 1 and page.count("<td>active</td>") == 2
        assert AuditLog.objects.filter(target_session_id=session.pk).count() == 1

    def test_usage_and_cost_count_every_reply_on_every_branch(self, owner):
        session = _session(owner)
        _exchange(session, owner, "one", "1", cost="0.10")
        _finish(
            commands.turn_regenerate(session=session, user=owner, message=2), "uno", cost="0.20"
        )
        commands.branch_switch(session=session, message=2)
        assert selectors.session_cost(session=session) == Decimal("0.30")
        assert commands.user_month_spend(user_id=owner.pk) == Decimal("0.30")

    def test_a_checkpoint_applies_only_to_paths_through_its_boundary(self, owner):
        session = _session(owner)
        for i in range(3):
            _exchange(session, owner, f"q{i}", f"a{i}")
        line = selectors.session_path(session_id=session.pk)
        state = compaction.CompactionState(boundary_index=2, summary="early talk")
        CompactionCheckpoint.objects.create(
            session=session,
            boundary_seq=line[2].seq,
            boundary_index=2,
            summary="early talk",
            state=state.to_dict(),
        )
        # As the compactor saves it: the state on the checkpoint and on the session.
        Session.objects.filter(pk=session.pk).update(compaction_state=state.to_dict())
        assert compactor.load_state(session.pk, line)[0] == state
        # A branch from before the boundary does not see it ...
        early = commands.turn_edit(session=session, user=owner, message=3, text="q1'")
        _finish(early, "a1'")
        assert compactor.load_state(session.pk, selectors.turn_path(turn=early))[0] is None
        # ... one after it does (the boundary is in their shared prefix).
        late = commands.turn_edit(session=session, user=owner, message=5, text="q2'")
        _finish(late, "a2'")
        assert compactor.load_state(session.pk, selectors.turn_path(turn=late))[0] == state

    def test_the_page_shows_only_the_checkpoints_of_its_path(self, owner):
        session = _session(owner)
        _exchange(session, owner, "one", "1")
        _exchange(session, owner, "two", "2")
        _finish(commands.turn_edit(session=session, user=owner, message=3, text="deux"), "II")
        for seq, summary in ((4, "summary of the first branch"), (6, "summary of the second")):
            CompactionCheckpoint.objects.create(
                session=session, boundary_seq=seq, boundary_index=3, summary=summary
            )
        client = Client()
        client.force_login(owner)
        page = client.get(reverse("chat", args=[session.pk])).content.decode()
        assert "summary of the second" in page and "summary of the first branch" not in page

    def test_a_reload_after_a_switch_opens_on_the_branch_switched_to(self, owner):
        session = _session(owner)
        _exchange(session, owner, "one", "first answer")
        _finish(commands.turn_regenerate(session=session, user=owner, message=2), "second answer")
        client = Client()
        client.force_login(owner)
        page = client.get(reverse("chat", args=[session.pk])).content.decode()
        assert "second answer" in page and "first answer" not in page
        commands.branch_switch(session=session, message=2)
        page = client.get(reverse("chat", args=[session.pk])).content.decode()
        assert "first answer" in page and "second answer" not in page


@pytest.mark.django_db
class TestOnTheEmbeddedDatabase(TreeContract):
    pass


@pytest.mark.distributed
class TestOnPostgres(TreeContract):
    @pytest.fixture(autouse=True)
    def _postgres(self, require_distributed, db):  # type: ignore[no-untyped-def]
        assert connection.vendor == "postgresql"


@pytest.mark.distributed
@pytest.mark.django_db(transaction=True)
def test_two_tabs_editing_at_the_same_instant_both_get_their_sibling(require_distributed, owner):  # type: ignore[no-untyped-def]
    """Real concurrency (two connections, PostgreSQL row locks): nothing lost, no error."""
    point_provider_at(owner, "anthropic", "http://127.0.0.1:9")
    session = _session(owner)
    _exchange(session, owner, "one", "1")
    seen = Session.objects.get(pk=session.pk).active_seq
    start = threading.Barrier(2)
    outcomes: list[object] = []

    def edit(text: str) -> None:
        try:
            start.wait()
            outcomes.append(
                commands.turn_edit(session=session, user=owner, message=1, text=text, leaf=seen)
            )
        except Exception as exc:  # reported by the assertion below
            outcomes.append(exc)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=edit, args=(t,)) for t in ("A", "B")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert all(isinstance(o, Turn) for o in outcomes) and len(outcomes) == 2, outcomes
    roots = Message.objects.filter(session=session, parent_seq__isnull=True)
    assert sorted(roots.values_list("content", flat=True)) == ["A", "B", "one"]
    assert sorted(Message.objects.filter(session=session).values_list("seq", flat=True)) == [
        1,
        2,
        3,
        4,
    ]
