"""A wave of turns ending together commits its model calls together: one transaction.

Each model call ends in one transaction (`turn_state.turn_step_commit`): its assistant
message, the turn's totals, the session's context size and, for a turn's last call, its
final status; six statements with BEGIN and COMMIT. Turns admitted together stream
together and end together, and 200 such commits queued on the worker's one database
thread (61 % of its time in a profile of bench/stream_path.py, where each statement also
waits to take the GIL back from the streaming loop) while the next wave's starts waited
behind them. Here the commits asked while one runs (`gather.Gatherer`) go in one
transaction of seven statements however many: the sessions' numbers taken and the
messages inserted (`sessions.services.step_messages_insert`), the turns held and
updated.

The common step only: its parent known, one step per session and per turn in the batch,
no message already written under its key. A replayed step (a dedupe key found) or a
conflict rolls the batch back and every commit of it runs alone, as before, so each
answer is the one `turn_step_commit` gives.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import Cast
from django.utils import timezone

from openworker.runtime.store import dbretry, turn_state
from openworker.runtime.store.gather import Gatherer, PerLoop
from openworker.runtime.store.turn_state import StepSaved, StepTotals
from sessions import services
from sessions.models import Session, Turn

logger = logging.getLogger(__name__)

# Commits per transaction: the CASE lists and IN lists stay ordinary statements.
MAX_BATCH = 100


@dataclass(frozen=True)
class StepAsk:
    """`turn_step_commit`'s arguments."""

    turn_id: uuid.UUID | str
    worker: str
    session_id: uuid.UUID | str
    message: dict[str, Any]
    dedupe_key: str
    totals: StepTotals
    context_tokens: int | None
    finish: str | None = None
    parent_seq: Any = services.TIP

    def alone(self) -> StepSaved:
        """This commit in a transaction of its own (the fields are its arguments)."""
        return turn_state.turn_step_commit(**vars(self))


def turn_step_commits(asks: list[StepAsk]) -> list[StepSaved | Exception]:
    """`turn_step_commit` for each ask, in order, in one transaction when they can share
    one; an ask that fails alone gets its exception as its answer."""
    together = _batchable(asks)
    answers: dict[int, StepSaved | Exception] = {}
    if len(together) > 1:
        try:
            with transaction.atomic():
                saved = _commit_together([asks[i] for i in together])
        except (services.AlreadyWritten, IntegrityError, Session.DoesNotExist):
            saved = None  # a replay or a conflict: each alone says which
        except dbretry.TRANSIENT:
            raise  # the database is away: every asker retries (`dbretry.write_gathered`)
        except DatabaseError:
            # Not expected: a batch this module got wrong must not cost the turns their
            # replies, so each commits alone, and the log says why.
            logger.exception("a batch of %d step commits failed; each alone", len(together))
            saved = None
        if saved is not None:
            answers.update(zip(together, saved, strict=True))
    for i, ask in enumerate(asks):
        if i not in answers:
            try:
                answers[i] = ask.alone()
            except Exception as exc:
                answers[i] = exc
    return [answers[i] for i in range(len(asks))]


def _uuid(value: uuid.UUID | str) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def _batchable(asks: list[StepAsk]) -> list[int]:
    """The asks that may share a transaction: parent known, and the first of their session
    and of their turn (a second one waits for the first's number, so it goes alone)."""
    seen: set[str] = set()
    out = []
    for i, ask in enumerate(asks):
        keys = {f"s:{_uuid(ask.session_id)}", f"t:{_uuid(ask.turn_id)}"}
        if ask.parent_seq is services.TIP or keys & seen:
            continue
        seen |= keys
        out.append(i)
    return out


def _commit_together(asks: list[StepAsk]) -> list[StepSaved]:
    """Inside the caller's transaction: every ask's message, then its turn's totals and
    final status where the lease is still `worker`'s (the message is kept either way)."""
    now = timezone.now()
    messages = services.step_messages_insert(
        [
            services.StepMessage(
                session_id=ask.session_id,
                fields={"turn_id": ask.turn_id, "role": "assistant", **ask.message},
                dedupe_key=ask.dedupe_key,
                context_tokens=ask.context_tokens,
                parent_seq=ask.parent_seq,
            )
            for ask in asks
        ],
        when=now,
    )
    held = Q()
    for ask in asks:
        held |= Q(pk=ask.turn_id, lease_owner=ask.worker)
    # Locked in key order, as the heartbeats lock theirs (`turns_heartbeat`): two
    # transactions that each hold some of a worker's turns never wait on each other.
    ours = {
        _uuid(pk)
        for pk in Turn.objects.select_for_update()
        .filter(held, status=Turn.Status.RUNNING)
        .order_by("pk")
        .values_list("pk", flat=True)
    }
    mine = [ask for ask in asks if _uuid(ask.turn_id) in ours]
    if mine:
        _turns_update(mine, now)
    return [
        StepSaved(message=message, counted=True, ours=_uuid(ask.turn_id) in ours)
        for ask, message in zip(asks, messages, strict=True)
    ]


def _turns_update(asks: list[StepAsk], now: Any) -> None:
    """What `turn_step_commit` writes on a turn for a counted step, for the lot: the
    totals, the partial text cleared, and the final status of those that finish."""

    def per_turn(name: str, values: list[tuple[StepAsk, Any]], keep: bool = False) -> Case:
        field = Turn._meta.get_field(name)
        # A None is SQL NULL, as `update(usage=None)` writes it (a JSON-typed Value of
        # None would be JSON's null), and typed: a CASE of untyped NULLs is text to
        # PostgreSQL, which then refuses it for a numeric or jsonb column.
        null = Cast(Value(None), output_field=field)
        whens = [
            When(pk=ask.turn_id, then=Value(v, output_field=field) if v is not None else null)
            for ask, v in values
        ]
        return Case(*whens, default=F(name) if keep else None, output_field=field)

    fields: dict[str, Any] = {
        "usage": per_turn("usage", [(ask, ask.totals.usage or None) for ask in asks]),
        "steps": per_turn("steps", [(ask, ask.totals.steps) for ask in asks]),
        "cost": per_turn("cost", [(ask, ask.totals.cost) for ask in asks]),
        "partial_text": "",
        "partial_reasoning": "",
    }
    finishing = [ask for ask in asks if ask.finish is not None]
    if finishing:
        fields.update(
            status=per_turn("status", [(ask, ask.finish) for ask in finishing], keep=True),
            finished_at=per_turn(
                "finished_at",
                [(ask, now if ask.finish in Turn.TERMINAL else None) for ask in finishing],
                keep=True,
            ),
            **{
                name: per_turn(name, [(ask, "") for ask in finishing], keep=True)
                for name in ("error_kind", "error", "lease_owner")
            },
        )
    Turn.objects.filter(pk__in=[ask.turn_id for ask in asks]).update(**fields)


# The running event loop's gatherer of step commits: `step_committer().ask(...)`.
step_committer: PerLoop[StepAsk, StepSaved] = PerLoop(
    lambda: Gatherer(turn_step_commits, max_batch=MAX_BATCH)
)
