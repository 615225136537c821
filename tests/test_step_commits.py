"""A wave of turns ending together commits its model calls in one transaction
(`runtime.store.step_commits`): each answer, and everything written, the same as each
commit made alone (`turn_state.turn_step_commit`), in a constant number of statements; a
replayed step, a lost lease, a gone session or two steps of one session are answered as
alone; and turns of one loop ending together share the call. On SQLite here and on
PostgreSQL in the distributed phase."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import DataError, connection
from django.test.utils import CaptureQueriesContext

from openworker.runtime.store import step_commits, turn_state
from sessions import services
from sessions.models import Message, Session, Turn
from tests.support import burst
from tests.support.burst import run_a_burst_counting

WORKER = "host:1:abcd"


def _running_turns(owner: Any, count: int) -> list[Turn]:
    """A claimed turn per new session, after its user message (seq 1)."""
    turns = []
    for index in range(count):
        session = services.session_create(owner=owner)
        turn = Turn.objects.create(session=session, model=session.model)
        services.message_append(
            session_id=session.pk,
            role="user",
            content=f"question {index}",
            turn_id=turn.pk,
            dedupe_key=f"{turn.pk}:user",
        )
        turn_state.turn_claim(turn_id=turn.pk, worker=WORKER)
        turns.append(turn)
    return turns


def _ask(turn: Turn, index: int, *, key: str = "a0", steps: int = 1) -> step_commits.StepAsk:
    """Steps that differ where a batch could mix them up: the last call of some turns,
    usage and cost or none, a context size or none."""
    usage = {"input": 10 + index, "output": index} if index % 3 else None
    return step_commits.StepAsk(
        turn_id=turn.pk,
        worker=WORKER,
        session_id=turn.session_id,
        message={"content": f"answer {index}", "usage": usage, "model": "m"},
        dedupe_key=f"{turn.pk}:{key}",
        totals=turn_state.StepTotals(
            usage=usage, steps=steps, cost=Decimal(index) / 4 if usage else None
        ),
        context_tokens=turn_state.context_tokens_of(usage),
        finish=Turn.Status.COMPLETED if index % 2 else None,
        parent_seq=1,
    )


def _written(turn: Turn) -> dict[str, Any]:
    """What a commit leaves: the turn's row, its session's row and its messages."""
    row = Turn.objects.get(pk=turn.pk)
    session = Session.objects.get(pk=turn.session_id)
    return {
        "turn": (
            row.status,
            row.usage,
            row.steps,
            row.cost,
            row.lease_owner,
            row.finished_at is not None,
            row.partial_text,
            # SQL NULL, not JSON's null, where there was no usage.
            Turn.objects.filter(pk=turn.pk, usage__isnull=True).exists(),
        ),
        "session": (session.next_seq, session.active_seq, session.last_context_tokens),
        "messages": list(
            Message.objects.filter(session_id=turn.session_id)
            .order_by("seq")
            .values_list("seq", "parent_seq", "role", "content", "usage", "turn_id")
        ),
    }


def _answer(saved: turn_state.StepSaved) -> tuple[Any, ...]:
    return (saved.message.seq, saved.message.parent_seq, saved.counted, saved.ours)


class StepCommitsContract:
    def test_commits_made_together_write_and_answer_as_each_made_alone(
        self, owner: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        alone, together = _running_turns(owner, 6), _running_turns(owner, 6)
        answers_alone = [_answer(_ask(t, i).alone()) for i, t in enumerate(alone)]
        got = step_commits.turn_step_commits([_ask(t, i) for i, t in enumerate(together)])
        assert "each alone" not in caplog.text  # the batch wrote them, not the fallback
        assert [_answer(saved) for saved in got] == answers_alone  # type: ignore[arg-type]
        for one, other in zip(alone, together, strict=True):
            mine, theirs = _written(one), _written(other)
            # The messages differ in their turn only.
            assert [m[:5] for m in mine["messages"]] == [m[:5] for m in theirs["messages"]]
            assert {m[5] for m in theirs["messages"]} == {other.pk}
            assert (mine["turn"], mine["session"]) == (theirs["turn"], theirs["session"])

    def test_a_batch_without_usage_or_cost_saves_them_as_nulls(
        self, owner: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        # Every value of a column NULL (a model without pricing): the batch's CASE must
        # still be typed for the column, and the batch, not the fallback, saves it.
        turns = _running_turns(owner, 3)
        asks = [_ask(t, 3 * i) for i, t in enumerate(turns)]  # usage None for each
        got = step_commits.turn_step_commits(asks)
        assert all(isinstance(saved, turn_state.StepSaved) for saved in got), got
        assert "each alone" not in caplog.text
        for turn in turns:
            row = Turn.objects.get(pk=turn.pk)
            assert (row.usage, row.cost, row.steps) == (None, None, 1)

    def test_a_batch_that_fails_unexpectedly_commits_each_alone(
        self, owner: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        turns = _running_turns(owner, 3)

        def broken(asks: Any, now: Any) -> None:
            raise DataError("a statement this module got wrong")

        monkeypatch.setattr(step_commits, "_turns_update", broken)
        got = step_commits.turn_step_commits([_ask(t, i) for i, t in enumerate(turns)])
        assert [saved.counted for saved in got] == [True] * 3  # type: ignore[union-attr]
        assert [Turn.objects.get(pk=t.pk).steps for t in turns] == [1, 1, 1]
        assert [Session.objects.get(pk=t.session_id).next_seq for t in turns] == [3, 3, 3]

    def test_a_batch_is_a_few_statements_however_many_it_carries(self, owner: Any) -> None:
        counts = []
        for size in (3, 12):
            asks = [_ask(t, i) for i, t in enumerate(_running_turns(owner, size))]
            with CaptureQueriesContext(connection) as queries:
                got = step_commits.turn_step_commits(asks)
            assert all(isinstance(saved, turn_state.StepSaved) for saved in got)
            counts.append(len(queries.captured_queries))
        assert counts[0] == counts[1] <= 8, counts

    def test_a_replayed_step_is_answered_as_alone_and_the_rest_are_saved(self, owner: Any) -> None:
        turns = _running_turns(owner, 4)
        first = _ask(turns[2], 2).alone()
        got = step_commits.turn_step_commits(
            [_ask(t, i, steps=2 if i == 2 else 1) for i, t in enumerate(turns)]
        )
        replayed = got[2]
        assert isinstance(replayed, turn_state.StepSaved)
        assert replayed.message.pk == first.message.pk and not replayed.counted
        assert Turn.objects.get(pk=turns[2].pk).steps == 1  # not counted twice
        assert Session.objects.get(pk=turns[2].session_id).next_seq == 3  # no gap
        for saved in (got[0], got[1], got[3]):
            assert isinstance(saved, turn_state.StepSaved) and saved.counted

    def test_a_lost_lease_keeps_its_message_says_so_and_leaves_the_turn(self, owner: Any) -> None:
        turns = _running_turns(owner, 3)
        Turn.objects.filter(pk=turns[1].pk).update(lease_owner="someone-else")
        got = step_commits.turn_step_commits([_ask(t, i) for i, t in enumerate(turns)])
        assert [saved.ours for saved in got] == [True, False, True]  # type: ignore[union-attr]
        lost = Turn.objects.get(pk=turns[1].pk)
        assert (lost.status, lost.steps, lost.lease_owner) == ("running", 0, "someone-else")
        assert Message.objects.filter(session_id=turns[1].session_id, role="assistant").exists()
        assert Turn.objects.get(pk=turns[0].pk).steps == 1

    def test_a_session_gone_fails_only_its_own_commit(self, owner: Any) -> None:
        turns = _running_turns(owner, 3)
        asks = [_ask(t, i) for i, t in enumerate(turns)]
        Session.objects.filter(pk=turns[1].session_id).delete()
        got = step_commits.turn_step_commits(asks)
        assert isinstance(got[1], Session.DoesNotExist)
        assert isinstance(got[0], turn_state.StepSaved) and isinstance(got[2], turn_state.StepSaved)
        assert Turn.objects.get(pk=turns[2].pk).steps == 1

    def test_two_steps_of_one_session_each_take_their_own_number(self, owner: Any) -> None:
        turn, other = _running_turns(owner, 2)
        second = Turn.objects.create(session=turn.session, model="m")
        turn_state.turn_claim(turn_id=second.pk, worker=WORKER)
        got = step_commits.turn_step_commits([_ask(turn, 1), _ask(second, 2), _ask(other, 3)])
        seqs = [saved.message.seq for saved in got]  # type: ignore[union-attr]
        assert seqs[:2] == [2, 3] and seqs[2] == 2
        assert Session.objects.get(pk=turn.session_id).next_seq == 4


@pytest.mark.django_db
class TestOnTheEmbeddedDatabase(StepCommitsContract):
    pass


@pytest.mark.distributed
class TestOnPostgres(StepCommitsContract):
    @pytest.fixture(autouse=True)
    def _postgres(self, require_distributed: None, db: None) -> None:
        assert connection.vendor == "postgresql"


@pytest.mark.django_db(transaction=True)
def test_turns_ending_together_share_their_commits_and_all_complete(
    anthropic_fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = run_a_burst_counting(
        anthropic_fake,
        monkeypatch,
        owner_of_gatherer=step_commits,
        name="step_committer",
        call=step_commits.turn_step_commits,
        max_batch=step_commits.MAX_BATCH,
    )
    assert sum(sizes) == burst.TURNS and len(sizes) < burst.TURNS, sizes
