"""Turn commands: what the web edge (views, the session socket, the admin) may do to a
turn. Send a message, stop, decide a tool approval, retry; and on the transcript's tree
(docs/PROTOCOL.md "Branches"): edit, regenerate, switch branch, continue.

Each validates, writes in one transaction and hands the turn to the runner once that
transaction commits (`runner.turn_enqueue`); the state machine the runtime drives from
there is `runtime.store.turn_state`.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Sum
from django.utils import timezone

from openworker.prepared_query import AnyOf, PreparedQuery
from openworker.runtime.live import events
from openworker.runtime.store import local_cancel, turn_state
from openworker.runtime.turns import runner, watchdog
from providers.capabilities import split_model
from providers.edge.model_policy import model_decide_many
from providers.registry import ANTHROPIC_MESSAGES, BEDROCK_CONVERSE, get_descriptor
from sessions import selectors
from sessions.models import Attachment, Message, Session, Turn, UserLimits
from sessions.services import (
    TurnRefused,
    message_insert,
    model_check,
    turns_first_messages_insert,
)

logger = logging.getLogger(__name__)

__all__ = [
    "SendRequest",
    "TurnRefused",
    "attachment_parts",
    "branch_switch",
    "turn_continue",
    "turn_decide_tool",
    "turn_edit",
    "turn_regenerate",
    "turn_request_stop",
    "turn_retry",
    "turn_send",
    "turn_start",
    "turns_send",
    "user_month_spend",
]


def turn_start(
    *,
    session: Session,
    text: str,
    attachments: list[dict[str, Any]] | None = None,
    model: str | None = None,
) -> Turn:
    """Record the user's message and a queued turn, and hand the turn to the runner once
    the transaction commits."""
    return _turn_start(session=session, text=text, attachments=attachments, model=model)[0]


def _turn_start(
    *,
    session: Session,
    text: str,
    attachments: list[dict[str, Any]] | None,
    model: str | None,
) -> tuple[Turn, Message]:
    new = _new_turn(session=session, text=text, attachments=attachments, model=model)
    refused = _admit_many([session])[0]
    if refused is not None:
        raise refused
    return _start_many([new])[0]


@dataclass(frozen=True)
class _NewTurn:
    session: Session
    model: str
    content: Any


def _new_turn(
    *, session: Session, text: str, attachments: list[dict[str, Any]] | None, model: str | None
) -> _NewTurn:
    text = (text or "").strip()
    if not text and not attachments:
        raise TurnRefused("Type a message or attach a file.")
    content: Any = text
    if attachments:
        content = ([{"type": "text", "text": text}] if text else []) + list(attachments)
    model = (model or session.model or settings.DEFAULT_MODEL).strip()
    return _NewTurn(session=session, model=model, content=content)


def _start_many(new: list[_NewTurn]) -> list[tuple[Turn, Message]]:
    """Write the turns and their messages in one transaction (each session once), and
    hand each turn to the runner once it commits."""
    with transaction.atomic():
        for item in new:
            if item.model != item.session.model:
                Session.objects.filter(pk=item.session.pk).update(model=item.model)
        turns = [Turn(session=item.session, model=item.model) for item in new]
        messages = turns_first_messages_insert(
            turns=[(turn, item.content) for turn, item in zip(turns, new, strict=True)]
        )
        runner.turns_enqueue(turn.pk for turn in turns)
    return list(zip(turns, messages, strict=True))


def _admit(session: Session, *, busy_ok: bool) -> None:
    """`_admit_many` for one session, raising its refusal."""
    refused = _admit_many([session], busy_ok=busy_ok)[0]
    if refused is not None:
        raise refused


def _admit_many(sessions: list[Session], *, busy_ok: bool = False) -> list[TurnRefused | None]:
    """The users' limits, for a new turn in each of `sessions` in order (a refusal or None
    each): a turn of that session already active (unless `busy_ok`: a branch command from
    a tab that had not seen it, docs/PROTOCOL.md "Concurrency"), the concurrent-turn cap
    and the monthly budget. Two queries however many users (each user's spend one more,
    when they have a budget); a turn admitted earlier in the list counts as active."""
    owners = sorted({session.owner_id for session in sessions})
    limits = _limits_of(owners)
    active = _active_turns_of(owners)
    # A running turn whose worker stopped beating is not running anything: the sweeper
    # is about to mark it interrupted, and it must not hold a place of the user's limit
    # meanwhile (cancelled and other ended turns never count).
    cutoff = timezone.now() - timedelta(seconds=turn_state.LEASE_SECONDS)
    busy: set[Any] = set()
    holding: dict[int, int] = dict.fromkeys(owners, 0)
    for owner_id, session_id, status, beat in active:
        busy.add(session_id)
        if status != Turn.Status.RUNNING or (beat is not None and beat >= cutoff):
            holding[owner_id] += 1
    spent: dict[int, Decimal] = {}
    refusals: list[TurnRefused | None] = []
    for session in sessions:
        owner_id = session.owner_id
        limit, budget = limits.get(owner_id, (None, None))
        limit = limit or settings.MAX_CONCURRENT_TURNS_PER_USER
        if not busy_ok and session.pk in busy:
            refusals.append(TurnRefused("This session is still working on the previous message."))
            continue
        if holding[owner_id] >= limit:
            refusals.append(
                TurnRefused(f"You already have {limit} replies running; wait for one to finish.")
            )
            continue
        if budget is not None:
            if owner_id not in spent:
                spent[owner_id] = user_month_spend(user_id=owner_id)
            if spent[owner_id] >= budget:
                refusals.append(
                    TurnRefused(
                        "You have reached this month's spending limit; ask an admin to raise it."
                    )
                )
                continue
        busy.add(session.pk)
        holding[owner_id] += 1
        refusals.append(None)
    return refusals


def _limits_of(owners: list[int]) -> dict[int, tuple[int | None, Decimal | None]]:
    """{user id: (concurrent turns allowed or None for the site default, monthly budget or
    None)} of the users with a limits row."""
    if len(owners) == 1:  # a lone send: the query compiled once
        row = _LIMITS.first(user_id=owners[0])
        return {owners[0]: (row[0], row[1])} if row is not None else {}
    rows = _LIMITS_MANY.rows(user_ids=owners)
    return {user_id: (concurrent, budget) for user_id, concurrent, budget in rows}


def _active_turns_of(owners: list[int]) -> list[tuple[int, Any, str, Any]]:
    """(owner, session, status, heartbeat) of the users' active turns."""
    if len(owners) == 1:
        return [(owners[0], *row) for row in _ACTIVE_TURNS.rows(owner_id=owners[0])]
    return _ACTIVE_TURNS_MANY.rows(owner_ids=owners)


# A lone send asks both, so they are compiled once (openworker.prepared_query).
_ACTIVE_TURNS = PreparedQuery(
    lambda owner_id: Turn.objects.filter(
        session__owner_id=owner_id, status__in=Turn.ACTIVE
    ).values_list("session_id", "status", "heartbeat_at"),
    owner_id=int,
)
_LIMITS = PreparedQuery(
    lambda user_id: UserLimits.objects.filter(user_id=user_id).values_list(
        "max_concurrent_turns", "monthly_budget"
    )[:1],
    user_id=int,
)
# A burst's (any number of users: compiled once too).
_ACTIVE_TURNS_MANY = PreparedQuery(
    lambda owner_ids: Turn.objects.filter(
        AnyOf(F("session__owner_id"), owner_ids), status__in=Turn.ACTIVE
    ).values_list("session__owner_id", "session_id", "status", "heartbeat_at"),
    owner_ids=list[int],
)
_LIMITS_MANY = PreparedQuery(
    lambda user_ids: UserLimits.objects.filter(AnyOf(F("user_id"), user_ids)).values_list(
        "user_id", "max_concurrent_turns", "monthly_budget"
    ),
    user_ids=list[int],
)


def user_month_spend(*, user_id: int) -> Decimal:
    """What the user's turns have cost since the start of this calendar month (local time).

    Turns with unknown cost (unpriced models) count as nothing: a budget cannot guess.
    """
    start = timezone.localtime().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    total = Turn.objects.filter(session__owner_id=user_id, created_at__gte=start).aggregate(
        total=Sum("cost")
    )["total"]
    return total or Decimal(0)


def attachment_parts(*, user: Any, attachment_ids: list[str]) -> list[dict[str, Any]]:
    """Canonical content parts referencing the user's own uploads (by id, never inline)."""
    if len(attachment_ids) > settings.MAX_ATTACHMENTS_PER_MESSAGE:
        raise TurnRefused(f"Attach at most {settings.MAX_ATTACHMENTS_PER_MESSAGE} files.")
    valid = []
    for value in attachment_ids:
        try:
            valid.append(uuid.UUID(value))
        except ValueError:
            raise TurnRefused("Unknown attachment.") from None
    found = {a.pk: a for a in Attachment.objects.filter(owner=user, pk__in=valid)}
    parts = []
    for key in valid:
        attachment = found.get(key)
        if attachment is None:
            raise TurnRefused("Unknown attachment.")
        meta = {
            "id": str(attachment.pk),
            "name": attachment.name,
            "mime": attachment.mime,
            "size": attachment.size,
        }
        if attachment.mime.startswith("image/"):
            part = {"type": "image_url", "image_url": {"url": f"attachment:{attachment.pk}"}}
        else:
            part = {
                "type": "file",
                "file": {"filename": attachment.name, "file_data": f"attachment:{attachment.pk}"},
            }
        parts.append({**part, "attachment": meta})
    return parts


def turn_send(
    *,
    session: Session,
    user: Any,
    text: str,
    attachment_ids: list[str] | None = None,
    model: str | None = None,
) -> Turn:
    """The user sends a message: validate, start the turn, tell the session's sockets."""
    sent = turns_send(
        sends=[
            SendRequest(
                session=session, user=user, text=text, attachment_ids=attachment_ids, model=model
            )
        ]
    )[0]
    if isinstance(sent, Exception):
        raise sent
    return sent


@dataclass(frozen=True)
class SendRequest:
    """One user's `send` (the session socket's message)."""

    session: Session
    user: Any
    text: str
    attachment_ids: list[str] | None = None
    model: str | None = None


def turns_send(*, sends: list[SendRequest]) -> list[Turn | Exception]:
    """Many sends at once (the sends a Daphne received together: `runtime.turns.
    send_batch`), each answered as `turn_send` would: its turn, or why it was refused.
    The model policy is one query per model asked for, the limits two queries, and the
    writes one transaction of four statements, for all of them: a burst of a thousand
    sends no longer waits for ten round trips per send on one thread. If the batch's
    writes fail (a session deleted meanwhile), each send is written alone, so one failure
    is only its own (a database error of a send written alone is that send's answer)."""
    results: list[Turn | Exception | None] = [None] * len(sends)
    asking: list[int] = []
    for index, send in enumerate(sends):
        if send.session.owner_id != send.user.pk:
            results[index] = TurnRefused("Unknown session.")
        elif not isinstance(send.text, str) or len(send.text) > settings.MAX_MESSAGE_CHARS:
            results[index] = TurnRefused(
                f"Messages are limited to {settings.MAX_MESSAGE_CHARS} characters."
            )
        else:
            asking.append(index)
    # The one model policy (providers.edge.model_policy), before anything is written: one
    # query for the lot per model asked for.
    decisions = model_decide_many(
        [
            (sends[i].user.pk, sends[i].model or sends[i].session.model or settings.DEFAULT_MODEL)
            for i in asking
        ]
    )
    checked: list[tuple[int, _NewTurn]] = []
    for index, decision in zip(asking, decisions, strict=True):
        send = sends[index]
        try:
            if not decision.allowed:
                raise TurnRefused(decision.reason)
            ids = send.attachment_ids
            parts = attachment_parts(user=send.user, attachment_ids=ids) if ids else []
            new = _new_turn(
                session=send.session, text=send.text, attachments=parts, model=decision.model
            )
        except TurnRefused as exc:
            results[index] = exc
            continue
        checked.append((index, new))
    refusals = _admit_many([new.session for _, new in checked])
    admitted = []
    for (index, new), refused in zip(checked, refusals, strict=True):
        if refused is not None:
            results[index] = refused
        else:
            admitted.append((index, new))
    if len(admitted) > 1:
        try:
            started = _start_many([new for _, new in admitted])
        except Exception:
            logger.warning("a batch of %d sends failed; sending each alone", len(admitted))
            started = None
        if started is not None:
            _announce(started)
            for (index, _), (turn, _) in zip(admitted, started, strict=True):
                results[index] = turn
            admitted = []
    for index, new in admitted:
        try:
            started = _start_many([new])
        except Session.DoesNotExist:
            results[index] = TurnRefused("Unknown session.")
            continue
        except Exception as exc:
            results[index] = exc
            continue
        _announce(started)
        results[index] = started[0][0]
    assert all(result is not None for result in results)
    return results  # type: ignore[return-value]


def _announce(started: list[tuple[Turn, Message]]) -> None:
    """Tell each session's sockets of its user's message, once the writes commit."""
    notices = [
        (turn.session_id, {"type": "message.user", "message": selectors.message_payload(message)})
        for turn, message in started
    ]
    transaction.on_commit(lambda: events.publish_many(notices))


def turn_request_stop(*, turn: Turn) -> Turn:
    """Stop: a running turn's worker sees the flag at its next heartbeat (and at once when
    it runs in this process); a queued or waiting turn is cancelled here."""
    Turn.objects.filter(pk=turn.pk, status=Turn.Status.RUNNING).update(cancel_requested=True)
    cancelled = Turn.objects.filter(
        pk=turn.pk, status__in=[Turn.Status.QUEUED, Turn.Status.AWAITING_APPROVAL]
    ).update(status=Turn.Status.CANCELLED, finished_at=timezone.now())
    local_cancel.turn_cancel_local(turn.pk)
    turn.refresh_from_db()
    if cancelled:
        # No engine runs this turn to say so (a later delivery finds nothing to claim):
        # tell every open page of the session now.
        transaction.on_commit(lambda: watchdog.announce_status_sync(turn))
    return turn


def turn_decide_tool(*, turn: Turn, call_id: str, approved: bool) -> Turn:
    """Record an approval decision; once every waiting call is decided, queue the turn
    again (a new task picks it up where it paused)."""
    with transaction.atomic():
        turn = Turn.objects.select_for_update().get(pk=turn.pk)
        if turn.status != Turn.Status.AWAITING_APPROVAL:
            raise TurnRefused("This reply is not waiting for an approval.")
        pending = selectors.turn_pending_calls(turn=turn)
        if call_id not in {call["id"] for call in pending}:
            raise TurnRefused("Unknown tool call.")
        turn.approvals = {**turn.approvals, call_id: "approved" if approved else "denied"}
        undecided = [call for call in pending if call["id"] not in turn.approvals]
        fields = ["approvals"]
        if not undecided:
            turn.status = Turn.Status.QUEUED
            turn.heartbeat_at = timezone.now()  # queued: when it was handed over (below)
            fields += ["status", "heartbeat_at"]
        turn.save(update_fields=fields)
        if not undecided:
            runner.turn_enqueue(turn.pk)
    return turn


def turn_retry(*, turn: Turn) -> Turn:
    """Run a failed or interrupted turn again from its last committed message."""
    retryable = [Turn.Status.FAILED, Turn.Status.INTERRUPTED]
    with transaction.atomic():
        updated = Turn.objects.filter(pk=turn.pk, status__in=retryable).update(
            status=Turn.Status.QUEUED,
            heartbeat_at=timezone.now(),  # queued: when it was handed over (below)
            error="",
            error_kind="",
            cancel_requested=False,
            finished_at=None,
        )
        if not updated:
            raise TurnRefused("Only a failed or interrupted reply can be retried.")
        runner.turn_enqueue(turn.pk)
    turn.refresh_from_db()
    return turn


# --- the tree: edit, regenerate, switch, continue (docs/PROTOCOL.md "Branches") ----------

BUSY = "Wait for the reply to finish, or stop it first."
# finish_reason values of a reply that was cut rather than finished: Stop, and the output
# cap as each wire layer reports it (Anthropic and Bedrock "max_tokens", OpenAI-style
# "length", Gemini "MAX_TOKENS").
CUT_REASONS = frozenset({"cancelled", "max_tokens", "length", "MAX_TOKENS"})
# APIs that take an assistant prefill: the request may end with a partial assistant
# message, which the model writes on from.
PREFILL_APIS = frozenset({ANTHROPIC_MESSAGES, BEDROCK_CONVERSE})


def _lock_idle(session: Session, leaf: int | None) -> tuple[Session, bool]:
    """Lock the session row (branch commands of two tabs serialise here, so each sees the
    other's sibling) and decide the busy rule: (the locked session, whether a turn of it
    is active but the page had not seen it). Refused while a turn is active and the page
    shows the session's current active leaf (or does not say what it shows)."""
    locked = Session.objects.select_for_update().get(pk=session.pk)
    busy = Turn.objects.filter(session=locked, status__in=Turn.ACTIVE).exists()
    if busy and (leaf is None or leaf == locked.active_seq):
        raise TurnRefused(BUSY)
    return locked, busy


def _message(session: Session, seq: Any, role: str | None = None) -> Message:
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise TurnRefused("Unknown message.")
    found = Message.objects.filter(session=session, seq=seq).first()
    if found is None or (role is not None and found.role != role):
        raise TurnRefused("Unknown message." if found is None else f"That is not a {role} message.")
    return found


def _forget_context_size(session_id: Any) -> None:
    """The reported context size was another path's: the compaction signal and the meter
    fall back to the estimate until this path's next model call reports its own."""
    Session.objects.filter(pk=session_id).update(last_context_tokens=None)


def _announce_branch(session_id: Any, leaf: int | None, cause: str) -> None:
    """After the commit, tell every socket of the session which path it now shows."""
    path = (
        list(
            selectors.path_rows(session_id=session_id, leaf_seq=leaf)
            .order_by("seq")
            .values_list("seq", flat=True)
        )
        if leaf is not None
        else []
    )
    event = {"type": "session.branch", "leaf": leaf, "path": path, "cause": cause}
    transaction.on_commit(lambda: events.publish(session_id, event))


def _branch_turn(
    *,
    session: Session,
    model: str,
    base_seq: int | None,
    leaf: int | None,
    cause: str,
    content: Any = None,
    continuation: str = "",
) -> Turn:
    """A new turn starting under `base_seq` (with a new user message `content` there, for
    an edit), made the active path, handed to the runner after the commit."""
    with transaction.atomic():
        locked, busy = _lock_idle(session, leaf)
        _admit(locked, busy_ok=busy)
        # "Regenerate with…" another model is for that reply only (as the peers do): the
        # session, and the page's picker, stay on the model the user chose for it.
        if model != locked.model and cause != "regenerate":
            Session.objects.filter(pk=locked.pk).update(model=model)
        turn = Turn.objects.create(
            session=locked, model=model, base_seq=base_seq, continuation=continuation
        )
        new_leaf = base_seq
        if content is not None:
            message, _ = message_insert(
                session_id=locked.pk,
                fields={"turn_id": turn.pk, "role": "user", "content": content},
                dedupe_key=f"{turn.pk}:user",
                new_key=True,
                parent_seq=base_seq,
                activate=True,
            )
            new_leaf = message.seq
            payload = selectors.message_payload(
                selectors.attach_siblings(session=locked, rows=[message])[0]
            )
            transaction.on_commit(
                lambda: events.publish(locked.pk, {"type": "message.user", "message": payload})
            )
        else:
            Session.objects.filter(pk=locked.pk).update(active_seq=base_seq)
        _forget_context_size(locked.pk)
        _announce_branch(locked.pk, new_leaf, cause)
        runner.turn_enqueue(turn.pk)
    return turn


def turn_edit(
    *,
    session: Session,
    user: Any,
    message: Any,
    text: str,
    attachment_ids: list[str] | None = None,
    model: str | None = None,
    leaf: int | None = None,
) -> Turn:
    """Edit a user message: a new sibling with the new text (the edited message's
    attachments unless `attachment_ids` says otherwise) and a new turn from it."""
    if session.owner_id != user.pk:
        raise TurnRefused("Unknown session.")
    if len(text) > settings.MAX_MESSAGE_CHARS:
        raise TurnRefused(f"Messages are limited to {settings.MAX_MESSAGE_CHARS} characters.")
    edited = _message(session, message, role=Message.Role.USER)
    model = model_check(user=user, model=model or session.model or settings.DEFAULT_MODEL)
    if attachment_ids is None:
        kept = edited.content if isinstance(edited.content, list) else []
        parts = [p for p in kept if isinstance(p, dict) and p.get("type") != "text"]
    else:
        parts = attachment_parts(user=user, attachment_ids=attachment_ids)
    text = (text or "").strip()
    if not text and not parts:
        raise TurnRefused("Type a message or attach a file.")
    content: Any = text
    if parts:
        content = ([{"type": "text", "text": text}] if text else []) + parts
    return _branch_turn(
        session=session,
        model=model,
        base_seq=edited.parent_seq,
        leaf=leaf,
        cause="edit",
        content=content,
    )


def turn_regenerate(
    *, session: Session, user: Any, message: Any, model: str | None = None, leaf: int | None = None
) -> Turn:
    """A new reply to the user message that `message` (an assistant reply) answers: a
    sibling of that message's first reply, optionally on another model."""
    if session.owner_id != user.pk:
        raise TurnRefused("Unknown session.")
    reply = _message(session, message, role=Message.Role.ASSISTANT)
    asked = (
        selectors.path_rows(session_id=session.pk, leaf_seq=reply.seq)
        .filter(role=Message.Role.USER)
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    if asked is None:
        raise TurnRefused("There is no message of yours before this reply.")
    model = model_check(user=user, model=model or reply.model or session.model)
    return _branch_turn(session=session, model=model, base_seq=asked, leaf=leaf, cause="regenerate")


def branch_switch(*, session: Session, message: Any, leaf: int | None = None) -> int:
    """Show the branch through `message`: the newest leaf under it becomes the active
    leaf, in every tab (`session.branch`). Returns the new active leaf."""
    target = _message(session, message)
    with transaction.atomic():
        locked, _ = _lock_idle(session, leaf)
        new_leaf = selectors.newest_leaf_under(session=locked, seq=target.seq)
        Session.objects.filter(pk=locked.pk).update(active_seq=new_leaf)
        _forget_context_size(locked.pk)
        _announce_branch(locked.pk, new_leaf, "switch")
    return new_leaf or target.seq


def continuation_kind(model: str) -> str:
    """ "prefill" where the model's API takes an assistant prefill, else "instruction"."""
    provider, _ = split_model(model, default_provider=settings.DEFAULT_PROVIDER)
    descriptor = get_descriptor(provider)
    return "prefill" if descriptor is not None and descriptor.api in PREFILL_APIS else "instruction"


def turn_continue(*, turn: Turn, user: Any, leaf: int | None = None) -> Turn:
    """Continue a reply that Stop or the output cap cut: a new turn on the same model
    whose first row continues the cut message (docs/PROTOCOL.md "Continue")."""
    session = turn.session
    if session.owner_id != user.pk:
        raise TurnRefused("Unknown session.")
    cut = Message.objects.filter(turn=turn, role=Message.Role.ASSISTANT).order_by("-seq").first()
    if cut is None or cut.finish_reason not in CUT_REASONS or cut.tool_calls:
        raise TurnRefused("Only a reply that was stopped or cut short can be continued.")
    model = model_check(user=user, model=turn.model)
    return _branch_turn(
        session=session,
        model=model,
        base_seq=cut.seq,
        leaf=leaf,
        cause="continue",
        continuation=continuation_kind(model),
    )
