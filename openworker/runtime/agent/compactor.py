"""The engine's side of auto-compaction: decide *when*, run the summarizer *with what*,
persist the state. The policy itself is pure (`openworker.runtime.agent.compaction`).

Outbound only: the state is stored with its checkpoint (and the latest on the session)
and applied to the copy sent to the
model; the transcript is never rewritten. A failed summary call never fails the turn:
it is logged and the turn goes on uncompacted.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import F, Subquery

from openworker.prepared_query import AnyOf, PreparedQuery
from openworker.runtime.agent import compaction
from openworker.runtime.store.dbcall import db
from providers.base import ProviderClient
from providers.errors import ProviderError
from sessions.models import CompactionCheckpoint, CompactionSettings, Message, Session

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompactionOutcome:
    state: compaction.CompactionState
    checkpoint: CompactionCheckpoint


def load_state(
    session_id: Any, rows: list[Message] | None = None
) -> tuple[compaction.CompactionState | None, int | None]:
    """The compaction state for the path `rows` and the last reported context size.

    A checkpoint belongs to the path it was computed on and applies to `rows` only when
    its boundary message is on them: the path to a message is unique, so all it summarised
    is then their shared prefix. Of those, the deepest boundary wins (the one this path
    used last, so a branch switched back to sends the same prefix bytes as before).
    Checkpoints from before the tree carry no state: the session's stored state stands
    for the newest of them."""
    row = (
        Session.objects.filter(pk=session_id)
        .values("compaction_state", "last_context_tokens")
        .get()
    )
    return _state_on_path(session_id, rows, row["compaction_state"], row["last_context_tokens"])


# The organisation's settings, the compaction state of a path, the last reported size.
SettingsAndState = tuple[CompactionSettings, compaction.CompactionState | None, int | None]


def load_settings_and_state(session_id: Any, rows: list[Message]) -> SettingsAndState:
    """The organisation's compaction settings with `load_state`'s answer, the session's
    row and the settings' row in one query (every model call reads both: a burst of turn
    starts queues them on one database thread)."""
    found = _SESSION_AND_SETTINGS.first(session_id=session_id)
    if found is None:
        raise Session.DoesNotExist(f"no session {session_id}")
    stored, reported, *values = found
    return _settings_of(values), *_state_on_path(session_id, rows, stored, reported)


def load_settings_and_states(
    paths: list[tuple[Any, list[Message]]],
) -> list[SettingsAndState | Exception]:
    """`load_settings_and_state` for each (session id, path) of a burst of turn starts, in
    order, in one query for the lot (plus a session's checkpoints when it has compacted);
    Session.DoesNotExist for a session that is gone."""
    if len(paths) == 1:  # a lone start: the query compiled once
        try:
            return [load_settings_and_state(*paths[0])]
        except Session.DoesNotExist as exc:
            return [exc]
    ids = list({session_id for session_id, _ in paths})
    found = {str(row[0]): row[1:] for row in _SESSIONS_AND_SETTINGS.rows(session_ids=ids)}
    out: list[SettingsAndState | Exception] = []
    for session_id, rows in paths:
        row = found.get(str(session_id))
        if row is None:
            out.append(Session.DoesNotExist(f"no session {session_id}"))
            continue
        stored, reported, *values = row
        out.append((_settings_of(values), *_state_on_path(session_id, rows, stored, reported)))
    return out


def _settings_of(values: list[Any]) -> CompactionSettings:
    if values[0] is None:  # no settings row yet: made with its defaults
        return CompactionSettings.load()
    return CompactionSettings(pk=1, **dict(zip(_SETTINGS, values, strict=True)))


_SETTINGS = ("enabled", "threshold_pct", "cap_tokens", "keep_recent_fraction", "summary_model")
_ANNOTATED = tuple(f"settings_{name}" for name in _SETTINGS)


def _settings_annotations() -> dict[str, Subquery]:
    return {
        f"settings_{name}": Subquery(CompactionSettings.objects.filter(pk=1).values(name)[:1])
        for name in _SETTINGS
    }


_SESSION_AND_SETTINGS = PreparedQuery(
    lambda session_id: (
        Session.objects.filter(pk=session_id)
        .annotate(**_settings_annotations())
        .values_list("compaction_state", "last_context_tokens", *_ANNOTATED)[:1]
    ),
    session_id=uuid.UUID,
)
# A burst's (of any size), compiled once too.
_SESSIONS_AND_SETTINGS = PreparedQuery(
    lambda session_ids: (
        Session.objects.filter(AnyOf(F("pk"), session_ids))
        .annotate(**_settings_annotations())
        .values_list("pk", "compaction_state", "last_context_tokens", *_ANNOTATED)
    ),
    session_ids=list[uuid.UUID],
)


def _state_on_path(
    session_id: Any, rows: list[Message] | None, stored: Any, reported: int | None
) -> tuple[compaction.CompactionState | None, int | None]:
    if rows is None or not stored:
        # Every compaction also stores its state on the session: none there, no
        # checkpoint anywhere (a session never compacted reads no more than this).
        return compaction.CompactionState.from_dict(stored), reported
    index = {message.seq: i for i, message in enumerate(rows)}
    checkpoints = list(
        CompactionCheckpoint.objects.filter(session_id=session_id)
        .order_by("created_at", "pk")
        .values("boundary_seq", "state")
    )
    best: tuple[int, compaction.CompactionState] | None = None
    for position, checkpoint in enumerate(checkpoints):
        at = index.get(checkpoint["boundary_seq"])
        data = checkpoint["state"]
        if data is None and position == len(checkpoints) - 1:
            data = stored
        if at is None or not data:
            continue
        state = compaction.CompactionState.from_dict(data)
        if state is None or state.boundary_index != at:
            continue
        if best is None or at >= best[0]:
            best = (at, state)
    return (best[1] if best else None), reported


def _save(
    *,
    session_id: Any,
    turn_id: Any,
    state: compaction.CompactionState,
    rows: list[Message],
    tokens_before: int,
    tokens_after: int,
) -> CompactionCheckpoint:
    with transaction.atomic():
        # The signal was the pre-compaction size: forget it, the estimate takes over
        # until the next model call reports the new size.
        Session.objects.filter(pk=session_id).update(
            compaction_state=state.to_dict(), last_context_tokens=None
        )
        return CompactionCheckpoint.objects.create(
            session_id=session_id,
            turn_id=turn_id,
            boundary_index=state.boundary_index,
            boundary_seq=rows[state.boundary_index].seq,
            summary=state.summary,
            state=state.to_dict(),
            tokens_before=tokens_before,
            tokens_after=tokens_after,
        )


async def maybe_compact(
    *,
    session_id: Any,
    turn_id: Any,
    rows: list[Message],
    history: list[dict[str, Any]],
    provider: ProviderClient,
    model: str,
    context_window: int | None,
    cancel: Any = None,
    may_use: Callable[[str], Awaitable[bool]] | None = None,
    preread: SettingsAndState | None = None,
) -> tuple[compaction.CompactionState | None, CompactionOutcome | None]:
    """The state to apply to this request, and the new checkpoint if one was made now.

    `may_use(model)`: the model policy's word on the admin's summary model for this turn
    (refused, the summary is asked of the turn's own model). `preread`: the settings and
    state `load_settings_and_states` read for these `rows` with the turn's start."""
    if preread is None:
        preread = await db(load_settings_and_state)(session_id, rows)
    cfg, state, reported = preread
    if state is not None and state.boundary_index >= len(history):
        state = None  # stale (should not happen: the transcript is append-only)
    signal = reported or compaction.estimate_tokens(compaction.apply_to_outbound(history, state))
    if not compaction.should_compact(
        signal,
        context_window,
        threshold_pct=cfg.threshold_pct,
        cap_tokens=cfg.cap_tokens,
        enabled=cfg.enabled,
    ):
        return state, None
    keep = compaction.keep_tokens(
        context_window,
        keep_fraction=cfg.keep_recent_fraction,
        threshold_pct=cfg.threshold_pct,
        cap_tokens=cfg.cap_tokens,
    )
    boundary = compaction.pick_boundary(
        history, keep_tokens=keep, after=state.boundary_index if state else 0
    )
    if boundary is None:
        return state, None
    span = compaction.span_to_summarize(history, boundary=boundary, prior=state)
    request = compaction.summarizer_messages(span, prior_summary=state.summary if state else "")
    summary_model = cfg.summary_model or model
    if summary_model != model and may_use is not None and not await may_use(summary_model):
        summary_model = model
    try:
        summary = await asyncio.to_thread(
            provider.complete,
            model=summary_model,
            messages=request,
            max_tokens=compaction.SUMMARY_MAX_TOKENS,
            cancel=cancel,
        )
    except ProviderError as exc:
        logger.warning("compaction summary failed (%s); continuing uncompacted", exc.kind)
        return state, None
    if not (summary.text or "").strip():
        logger.warning("compaction summary came back empty; continuing uncompacted")
        return state, None
    new_state = compaction.compact(history, summary=summary.text, boundary=boundary, prior=state)
    after = compaction.estimate_tokens(compaction.apply_to_outbound(history, new_state))
    checkpoint = await db(_save)(
        session_id=session_id,
        turn_id=turn_id,
        state=new_state,
        rows=rows,
        tokens_before=signal,
        tokens_after=after,
    )
    return new_state, CompactionOutcome(new_state, checkpoint)
