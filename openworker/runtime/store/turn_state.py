"""A turn's state machine in the database: claim, heartbeat, one transaction per model
call, finish, and the sweep of dead leases.

Only the runtime calls these (the engine, its lease keeper and the watchdog); the web
edge changes a turn through `runtime.turns.commands`. The transcript writes they build
on are the product's (`sessions.services.message_insert`). Synchronous ORM code; async
callers go through `runtime.store.dbcall`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from openworker.prepared_query import AnyOf, PreparedQuery
from openworker.values_sql import values_rows
from sessions.models import Message, Turn
from sessions.services import TIP, message_insert

# A running turn whose heartbeat is older than this is considered dead. The engine beats
# every second; six missed beats is a dead worker, not a slow database.
LEASE_SECONDS = 6.0
# A queued turn not claimed this long after it was handed to the runner is handed over
# again (its task may be gone): several lease sweeps, far above a free worker's pickup
# time (milliseconds), so a duplicate is rare and only ever a no-op.
REDISPATCH_AFTER_SECONDS = 10.0


@dataclass(frozen=True)
class HeartbeatReply:
    owned: bool
    cancel_requested: bool


def turn_claim(*, turn_id: uuid.UUID | str, worker: str) -> Turn | None:
    """Take the lease on a queued turn. None when someone else has it or it is finished
    (a redelivered task after the turn was interrupted or completed does nothing)."""
    return turns_claim(turn_ids=[turn_id], worker=worker).get(str(turn_id))


def turns_claim(*, turn_ids: list[uuid.UUID | str], worker: str) -> dict[str, Turn]:
    """Take the lease on those of `turn_ids` still queued, all under `worker`, in one
    UPDATE, and read them back with their sessions in one SELECT: {turn id: turn} of the
    ones taken (`runtime.store.claims` gathers a burst's claims into one call)."""
    now = timezone.now()
    updated = Turn.objects.filter(AnyOf(F("pk"), turn_ids), status=Turn.Status.QUEUED).update(
        status=Turn.Status.RUNNING,
        lease_owner=worker,
        heartbeat_at=now,
        started_at=now,
        attempts=F("attempts") + 1,
        partial_text="",
        partial_reasoning="",
    )
    if not updated:
        return {}
    if len(turn_ids) == 1:
        claimed = _CLAIMED.instances(turn_id=turn_ids[0], worker=worker)
    else:
        claimed = _CLAIMED_MANY.instances(turn_ids=list(turn_ids), worker=worker)
    return {str(turn.pk): turn for turn in claimed}


# A turn start reads its turn and session back: compiled once (openworker.prepared_query).
_CLAIMED = PreparedQuery(
    lambda turn_id, worker: Turn.objects.select_related("session").filter(
        pk=turn_id, lease_owner=worker, status=Turn.Status.RUNNING
    )[:1],
    turn_id=uuid.UUID,
    worker=str,
)
# A burst's (any number of turns: compiled once too).
_CLAIMED_MANY = PreparedQuery(
    lambda turn_ids, worker: Turn.objects.select_related("session").filter(
        AnyOf(F("pk"), turn_ids), lease_owner=worker, status=Turn.Status.RUNNING
    ),
    turn_ids=list[uuid.UUID],
    worker=str,
)


@dataclass(frozen=True)
class LeaseBeat:
    """One running turn's heartbeat: its lease holder, and its partial reply (text and
    reasoning together) when it changed since the last beat (None: leave it alone)."""

    turn_id: str
    worker: str
    partial_text: str | None = None
    partial_reasoning: str | None = None


def turns_heartbeat(*, beats: list[LeaseBeat]) -> dict[str, HeartbeatReply]:
    """Renew the leases of many turns in two statements: a worker process beats for all
    its turns at once, every second. (One ORM update per turn, then the ORM's CASE-per-
    row `bulk_update`, then one UPDATE per turn in a pipeline, each made the worker's
    heartbeat thread a cost to its streams: bench/stream_path.py.)

    The turns are locked in key order and read (whose lease, what status, Stop asked
    for), then those still ours, running under our lease, are renewed in one `UPDATE ...
    FROM (VALUES ...)`, with their partial reply where it changed. For each turn the
    reply says whether it is still ours, and whether Stop was asked for.
    """
    if not beats:
        return {}
    running = Turn.Status.RUNNING.value
    beat_of = {uuid.UUID(beat.turn_id): beat for beat in beats}
    with transaction.atomic():
        # In key order: a batch of step commits (`step_commits`) locks its turns in that
        # order too, so neither waits for a row the other holds while holding one it wants.
        state = {
            pk: (owner, status, cancel)
            for pk, owner, status, cancel in Turn.objects.select_for_update()
            .filter(pk__in=list(beat_of))
            .order_by("pk")
            .values_list("pk", "lease_owner", "status", "cancel_requested")
        }
        ours = {
            pk
            for pk, (owner, status, _) in state.items()
            if owner == beat_of[pk].worker and status == running
        }
        if ours:
            _leases_renew([beat_of[pk] for pk in sorted(ours)])
    replies = {}
    for beat in beats:
        pk = uuid.UUID(beat.turn_id)
        owned = pk in ours
        replies[beat.turn_id] = HeartbeatReply(owned=owned, cancel_requested=owned and state[pk][2])
    return replies


def _leases_renew(beats: list[LeaseBeat]) -> None:
    """The heartbeat time on each turn, and its partial reply where the beat carries one
    (NULL keeps the stored one). Identifiers come from the model's metadata; every
    value is bound."""
    meta = Turn._meta
    q = connection.ops.quote_name
    column = {name: q(meta.get_field(name).column) for name in _HEARTBEAT_FIELDS}
    fields = [meta.pk, meta.get_field("partial_text"), meta.get_field("partial_reasoning")]
    values, params = values_rows(
        fields, ((beat.turn_id, beat.partial_text, beat.partial_reasoning) for beat in beats)
    )
    now = meta.get_field("heartbeat_at").get_db_prep_value(timezone.now(), connection)
    text, reasoning = column["partial_text"], column["partial_reasoning"]
    sql = (
        f"UPDATE {q(meta.db_table)} AS t SET {column['heartbeat_at']} = %s, "  # noqa: S608
        f"{text} = COALESCE(v.column2, t.{text}), "
        f"{reasoning} = COALESCE(v.column3, t.{reasoning}) "
        f"FROM (VALUES {values}) AS v WHERE t.{q(meta.pk.column)} = v.column1"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [now, *params])


_HEARTBEAT_FIELDS = ("heartbeat_at", "partial_text", "partial_reasoning")


@dataclass(frozen=True)
class StepTotals:
    """A turn's running totals after one more model call. The engine holds the lease,
    so it is the only writer of these and keeps them in memory."""

    usage: dict[str, int] | None
    steps: int
    cost: Decimal | None


@dataclass(frozen=True)
class StepSaved:
    message: Message
    counted: bool  # False: a replayed step, whose message and totals were already saved
    ours: bool  # False: the lease was lost meanwhile (the message is kept all the same)


def turn_step_commit(
    *,
    turn_id: uuid.UUID | str,
    worker: str,
    session_id: uuid.UUID | str,
    message: dict[str, Any],
    dedupe_key: str,
    totals: StepTotals,
    context_tokens: int | None,
    finish: str | None = None,
    parent_seq: int | None = TIP,
) -> StepSaved:
    """One model call's outcome in one transaction: its assistant message, the turn's new
    totals, the session's context size, and for the last call of a turn its final
    status. A lost lease keeps the message, as a stop keeps what was streamed.

    Six statements (with BEGIN and COMMIT) where the separate writes took fourteen and
    three thread hops: 200 turns ending together made that difference the streams'
    latency (bench/stream_path.py)."""
    with transaction.atomic():
        saved, created = message_insert(
            session_id=session_id,
            fields={"turn_id": turn_id, "role": "assistant", **message},
            dedupe_key=dedupe_key,
            context_tokens=context_tokens,
            parent_seq=parent_seq,
        )
        fields: dict[str, Any] = {}
        if created:  # a replayed step was counted the first time
            fields.update(
                usage=totals.usage or None,
                steps=totals.steps,
                cost=totals.cost,
                partial_text="",
                partial_reasoning="",
            )
        if finish is not None:
            fields.update(
                status=finish,
                error_kind="",
                error="",
                lease_owner="",
                finished_at=timezone.now() if finish in Turn.TERMINAL else None,
            )
        owned = Turn.objects.filter(pk=turn_id, lease_owner=worker, status=Turn.Status.RUNNING)
        ours = bool(owned.update(**fields)) if fields else owned.exists()
    return StepSaved(message=saved, counted=created, ours=ours)


def context_tokens_of(usage: dict[str, Any] | None) -> int | None:
    """The prompt's size as the provider counted it: input plus cached tokens."""
    if not usage:
        return None
    return (
        int(usage.get("input", 0))
        + int(usage.get("cache_read", 0))
        + int(usage.get("cache_write", 0))
    )


def usage_add(total: dict[str, Any] | None, more: dict[str, Any] | None) -> dict[str, int]:
    """Token buckets added up, key by key."""
    out = {key: int(value or 0) for key, value in (total or {}).items()}
    for key, value in (more or {}).items():
        out[key] = out.get(key, 0) + int(value or 0)
    return out


def turn_finish(
    *,
    turn_id: uuid.UUID | str,
    worker: str,
    status: str,
    error_kind: str = "",
    error: str = "",
    partial_text: str | None = None,
    partial_reasoning: str | None = None,
) -> bool:
    """Move a turn we hold to a terminal state (or awaiting approval). False when the
    lease was lost meanwhile (the sweeper or a stop got there first)."""
    fields: dict[str, Any] = {
        "status": status,
        "error_kind": error_kind,
        "error": error,
        "lease_owner": "",
        "finished_at": timezone.now() if status in Turn.TERMINAL else None,
    }
    if partial_text is not None:
        fields["partial_text"] = partial_text
    if partial_reasoning is not None:
        fields["partial_reasoning"] = partial_reasoning
    return bool(
        Turn.objects.filter(pk=turn_id, lease_owner=worker, status=Turn.Status.RUNNING).update(
            **fields
        )
    )


def turns_expire_leases(*, now: Any = None) -> list[Turn]:
    """Mark running turns whose worker stopped beating as interrupted (their partial
    text stays on the row). Returns the turns it changed."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=LEASE_SECONDS)
    stale = list(
        Turn.objects.filter(status=Turn.Status.RUNNING)
        .filter(Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True))
        .values_list("pk", flat=True)
    )
    changed = []
    for pk in stale:
        updated = Turn.objects.filter(
            pk=pk, status=Turn.Status.RUNNING, heartbeat_at__lt=cutoff
        ).update(
            status=Turn.Status.INTERRUPTED,
            lease_owner="",
            error_kind="interrupted",
            error="The worker running this reply stopped. Retry to continue.",
            finished_at=now,
        )
        if updated:
            changed.append(Turn.objects.get(pk=pk))
    return changed


def turns_hold_queued(*, turn_ids: list[str], now: Any = None) -> dict[str, str]:
    """Renew the hand-over time of queued turns waiting in a process for a place
    (`runtime.turns.admission`), so `turns_take_stranded` leaves them alone while that
    process lives. Returns {turn id: session id} of those still queued (the others were
    stopped meanwhile). One UPDATE and one SELECT however many wait."""
    if not turn_ids:
        return {}
    now = now or timezone.now()
    waiting = Turn.objects.filter(pk__in=turn_ids, status=Turn.Status.QUEUED)
    waiting.update(heartbeat_at=now)
    return {str(pk): str(session_id) for pk, session_id in waiting.values_list("pk", "session_id")}


def turns_take_stranded(*, now: Any = None, skip: frozenset[str] = frozenset()) -> list[str]:
    """Queued turns to hand to the runner again: waiting REDISPATCH_AFTER_SECONDS since
    they were last handed over. The database, not the broker, says which turns must run
    (a Redis restart empties the queue; a worker whose claim failed on a database error
    consumed the task). For a queued turn `heartbeat_at` is when it was last handed over
    (NULL: at creation); taking a turn moves it to `now` with a conditional UPDATE, so
    each turn is taken by one sweeper per interval however many processes sweep. `skip`
    names turns known to be alive (embedded mode's own tasks). A duplicate task, when
    the first was only waiting behind busy workers, finds nothing to claim
    (`turn_claim`). Returns the ids taken; the caller hands them over."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=REDISPATCH_AFTER_SECONDS)
    waiting = Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, created_at__lt=cutoff)
    stale = list(
        Turn.objects.filter(waiting, status=Turn.Status.QUEUED).values_list("pk", "heartbeat_at")
    )
    taken = []
    for pk, handed_over in stale:
        if str(pk) in skip:
            continue
        unchanged = (
            Q(heartbeat_at=handed_over) if handed_over is not None else Q(heartbeat_at__isnull=True)
        )
        if Turn.objects.filter(unchanged, pk=pk, status=Turn.Status.QUEUED).update(
            heartbeat_at=now
        ):
            taken.append(str(pk))
    return taken
