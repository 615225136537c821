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

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import BooleanField, F
from django.utils import timezone

from openworker.prepared_query import AnyOf, PreparedQuery
from openworker.runtime.store import dbretry, turn_state
from openworker.runtime.store.gather import Gatherer, PerLoop
from openworker.runtime.store.turn_state import StepSaved, StepTotals
from openworker.values_sql import values_rows
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
    # Locked in key order, as the heartbeats lock theirs (`turns_heartbeat`): two
    # transactions that each hold some of a worker's turns never wait on each other. A
    # turn whose lease another worker took is locked too (rare) but not updated: one
    # `pk IN` compiles in microseconds where an OR of a hundred (pk, lease) pairs took
    # milliseconds of the GIL from the streaming loop.
    worker_of = {_uuid(ask.turn_id): ask.worker for ask in asks}
    ours = {
        _uuid(pk)
        for pk, owner in _LOCKED.rows(turn_ids=list(worker_of))
        if owner == worker_of[_uuid(pk)]
    }
    mine = [ask for ask in asks if _uuid(ask.turn_id) in ours]
    if mine:
        _turns_update(mine, now)
    return [
        StepSaved(message=message, counted=True, ours=_uuid(ask.turn_id) in ours)
        for ask, message in zip(asks, messages, strict=True)
    ]


# The wave's running turns, locked in key order: compiled once for a wave of any size.
_LOCKED = PreparedQuery(
    lambda turn_ids: (
        Turn.objects.select_for_update()
        .filter(AnyOf(F("pk"), turn_ids), status=Turn.Status.RUNNING)
        .order_by("pk")
        .values_list("pk", "lease_owner")
    ),
    turn_ids=list[uuid.UUID],
)


def _turns_update(asks: list[StepAsk], now: Any) -> None:
    """What `turn_step_commit` writes on a turn for a counted step, for the lot: the
    totals, the partial text cleared, and the final status of those that finish.

    One `UPDATE ... FROM (VALUES ...)`, written out: the ORM's CASE with a WHEN per turn
    and column took 20-25 % of the worker's time at a wave's end (py-spy, K = 200),
    resolving and copying expressions while holding the GIL, and the streams waited."""
    q = connection.ops.quote_name
    # Each row: the turn's key, its totals, whether it finishes, its final status and
    # time.
    fields = [Turn._meta.get_field(name) for name in ("id", "usage", "steps", "cost")]
    fields += [BooleanField(), *(Turn._meta.get_field(n) for n in ("status", "finished_at"))]
    pk, usage, steps, cost, finishing, status, finished_at = (
        f"v.column{n}" for n in range(1, len(fields) + 1)
    )
    values, params = values_rows(fields, (_turn_row(ask, now) for ask in asks))

    def on_finish(name: str, value: str) -> str:
        return f"{q(name)} = CASE WHEN {finishing} THEN {value} ELSE t.{q(name)} END"

    assignments = [
        f"{q('usage')} = {usage}",
        f"{q('steps')} = {steps}",
        f"{q('cost')} = {cost}",
        f"{q('partial_text')} = ''",
        f"{q('partial_reasoning')} = ''",
        on_finish("status", status),
        on_finish("finished_at", finished_at),
        *(on_finish(name, "''") for name in ("error_kind", "error", "lease_owner")),
    ]
    sql = (
        f"UPDATE {q(Turn._meta.db_table)} AS t SET {', '.join(assignments)} "  # noqa: S608
        f"FROM (VALUES {values}) AS v WHERE t.{q('id')} = {pk}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _turn_row(ask: StepAsk, now: Any) -> tuple[Any, ...]:
    finished = now if ask.finish in Turn.TERMINAL else None
    totals = ask.totals
    return (ask.turn_id, totals.usage or None, totals.steps, totals.cost, ask.finish is not None,
            ask.finish or "", finished)  # fmt: skip


# The running event loop's gatherer of step commits: `step_committer().ask(...)`.
step_committer: PerLoop[StepAsk, StepSaved] = PerLoop(
    lambda: Gatherer(turn_step_commits, max_batch=MAX_BATCH)
)
