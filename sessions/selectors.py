"""Reads of chat sessions. Every user-facing read is scoped to an owner: another user's
id is a 404, never a 403 that confirms it exists."""

from __future__ import annotations

import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection
from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.expressions import RawSQL

from openworker.prepared_query import PreparedQuery
from providers.capabilities import split_model
from providers.edge.matrix import curated_matrix, models_for_user
from providers.edge.models import ProviderProfile
from sessions.content import text_parts as _text_parts
from sessions.models import CompactionCheckpoint, Message, Session, Turn, UserPreferences
from sessions.search import SEARCHED_ROLES, normalise_query, session_search


def session_list(*, user: AbstractBaseUser) -> QuerySet[Session]:
    return Session.objects.filter(owner=user).order_by("-updated_at")


def _uuid(value: object) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def session_get_for_user(*, session_id: str | uuid.UUID, user: AbstractBaseUser) -> Session | None:
    """The session if `user` owns it, else None (never reveals that it exists)."""
    if not getattr(user, "is_authenticated", False):
        return None
    key = _uuid(session_id)
    if key is None:
        return None
    return Session.objects.filter(pk=key, owner=user).first()


def turn_get_for_session(*, session: Session, turn_id: object) -> Turn | None:
    key = _uuid(turn_id)
    if key is None:
        return None
    return Turn.objects.filter(pk=key, session=session).first()


def session_messages(*, session_id: uuid.UUID | str) -> list[Message]:
    """Every message of the session, every branch, in append order (exports, admin)."""
    return list(Message.objects.filter(session_id=session_id).order_by("seq"))


def session_history(*, session_id: uuid.UUID | str) -> list[dict[str, Any]]:
    """The canonical transcript of the active path as dicts, in order."""
    return [m.to_canonical() for m in session_path(session_id=session_id)]


# --- the tree (docs/PROTOCOL.md "Branches") ----------------------------------------------


def _path_seqs_sql(
    session_id: uuid.UUID | str, leaf_seq: int, *, below: int | None = None, first: int = 0
) -> RawSQL:
    """The seqs of the path root → `leaf_seq`, as a subquery: a recursive CTE that walks
    parent links over the (session, seq) unique index, so it costs O(depth), whatever the
    size of the tree (PostgreSQL and SQLite both run it).

    The walk goes leaf-first, so seqs come out in descending order (a parent's seq is
    always smaller): `first` > 0 keeps only the newest `first` seqs below `below`, and
    both databases stop walking there (PostgreSQL evaluates a WITH query only as far as
    its reader fetches; SQLite runs it as a coroutine of the outer LIMIT). The chat
    page's window then costs O(window), not O(depth)."""
    table = connection.ops.quote_name(Message._meta.db_table)
    field = Message._meta.get_field("session")
    key = field.get_db_prep_value(_uuid(session_id) or session_id, connection)
    sql = (
        "WITH RECURSIVE path(seq, parent_seq) AS ("  # noqa: S608 (quoted identifier only)
        f"SELECT seq, parent_seq FROM {table} WHERE session_id = %s AND seq = %s "
        "UNION ALL "
        f"SELECT m.seq, m.parent_seq FROM {table} m JOIN path p ON m.seq = p.parent_seq "
        "WHERE m.session_id = %s"
        ") SELECT seq FROM path"
    )
    params: list[Any] = [key, leaf_seq, key]
    if below is not None:
        sql += " WHERE seq < %s"
        params.append(below)
    if first:
        sql += " LIMIT %s"
        params.append(first)
    return RawSQL(sql, params)  # noqa: S611 (every value is a parameter)


def path_rows(
    *,
    session_id: uuid.UUID | str,
    leaf_seq: int | None,
    below: int | None = None,
    first: int = 0,
) -> QuerySet[Message]:
    """The messages of the path root → `leaf_seq` (unordered queryset; filter and order
    it); with `first`, only the newest `first` of them below seq `below` (the walk stops
    there: see `_path_seqs_sql`).

    `leaf_seq` None (a session that has no active leaf: empty, or its rows were written
    around `services.message_insert`) reads as a line: every message of the session."""
    rows = Message.objects.filter(session_id=session_id)
    if leaf_seq is None:
        if below is not None:
            rows = rows.filter(seq__lt=below)
        return rows
    return rows.filter(seq__in=_path_seqs_sql(session_id, leaf_seq, below=below, first=first))


def session_path(*, session_id: uuid.UUID | str, leaf_seq: int | None = None) -> list[Message]:
    """The path root → `leaf_seq` (default: the session's active leaf), in order."""
    if leaf_seq is None:
        leaf_seq = Session.objects.filter(pk=session_id).values_list("active_seq", flat=True)[0]
    return list(path_rows(session_id=session_id, leaf_seq=leaf_seq).order_by("seq"))


def turn_path(*, turn: Turn) -> list[Message]:
    """What a turn's next model call is built from: the path root → the turn's tip (its
    newest message, else the message it started from, else the session's active leaf).
    One query: the tip is found inside the path walk's seed. It runs before every model
    call, so its SQL is compiled once (openworker.prepared_query)."""
    return _TURN_PATH.instances(session_id=turn.session_id, turn_id=turn.pk, base_seq=turn.base_seq)


def _turn_path_query(session_id: uuid.UUID, turn_id: uuid.UUID, base_seq: int) -> QuerySet:
    table = connection.ops.quote_name(Message._meta.db_table)
    sessions = connection.ops.quote_name(Session._meta.db_table)
    key = Message._meta.get_field("session").get_db_prep_value(session_id, connection)
    turn_key = Message._meta.get_field("turn").get_db_prep_value(turn_id, connection)
    seed = (
        f"COALESCE((SELECT MAX(t.seq) FROM {table} t WHERE t.turn_id = %s), %s, "  # noqa: S608
        f"(SELECT s.active_seq FROM {sessions} s WHERE s.id = %s))"
    )
    sql = (
        "WITH RECURSIVE path(seq, parent_seq) AS ("  # noqa: S608 (quoted identifiers only)
        f"SELECT seq, parent_seq FROM {table} WHERE session_id = %s AND seq = {seed} "
        "UNION ALL "
        f"SELECT m.seq, m.parent_seq FROM {table} m JOIN path p ON m.seq = p.parent_seq "
        "WHERE m.session_id = %s"
        ") SELECT seq FROM path"
    )
    params = [key, turn_key, base_seq, key, key]
    found = RawSQL(sql, params)  # noqa: S611 (every value is a parameter)
    return Message.objects.filter(session_id=session_id, seq__in=found).order_by("seq")


_TURN_PATH = PreparedQuery(_turn_path_query, session_id=uuid.UUID, turn_id=uuid.UUID, base_seq=int)


def turn_paths(*, turns: list[Turn]) -> list[list[Message]]:
    """`turn_path` of each of `turns`, in order, in one query: a burst of turn starts
    reads its first paths together (one walk seeded from every turn's tip)."""
    if len(turns) <= 1:  # a lone start: the query compiled once
        return [turn_path(turn=turn) for turn in turns]
    table = connection.ops.quote_name(Message._meta.db_table)
    sessions = connection.ops.quote_name(Session._meta.db_table)
    session_field = Message._meta.get_field("session")
    turn_field = Message._meta.get_field("turn")
    seeds, params = [], []
    for index, turn in enumerate(turns):
        key = session_field.get_db_prep_value(turn.session_id, connection)
        seeds.append(
            f"SELECT {index}, %s, COALESCE("  # noqa: S608 (quoted identifiers only)
            f"(SELECT MAX(t.seq) FROM {table} t WHERE t.turn_id = %s), %s, "
            f"(SELECT s.active_seq FROM {sessions} s WHERE s.id = %s))"
        )
        params += [key, turn_field.get_db_prep_value(turn.pk, connection), turn.base_seq, key]
    sql = (
        f"WITH RECURSIVE seeds(k, session_id, seq) AS ({' UNION ALL '.join(seeds)}), "  # noqa: S608
        "path(k, session_id, seq, parent_seq) AS ("
        f"SELECT s.k, m.session_id, m.seq, m.parent_seq FROM seeds s JOIN {table} m "
        "ON m.session_id = s.session_id AND m.seq = s.seq "
        "UNION ALL "
        f"SELECT p.k, m.session_id, m.seq, m.parent_seq FROM path p JOIN {table} m "
        "ON m.session_id = p.session_id AND m.seq = p.parent_seq"
        f") SELECT m.*, p.k AS path_of FROM path p JOIN {table} m "
        "ON m.session_id = p.session_id AND m.seq = p.seq ORDER BY p.k, m.seq"
    )
    found: list[list[Message]] = [[] for _ in turns]
    for message in Message.objects.raw(sql, params):
        found[message.__dict__.pop("path_of")].append(message)
    return found


def siblings_of(*, session: Session, rows: list[Message]) -> dict[int | None, list[int]]:
    """parent seq → the seqs of its children in creation order, for the parents of `rows`
    (one query, for a branched session or not, so the page costs the same either way).
    Empty for a session read as a line (no active leaf)."""
    if not rows or session.active_seq is None:
        return {}
    parents = {m.parent_seq for m in rows}
    match = Q(parent_seq__in=[p for p in parents if p is not None])
    if None in parents:
        match |= Q(parent_seq__isnull=True)
    out: dict[int | None, list[int]] = {}
    children = (
        Message.objects.filter(session=session)
        .filter(match)
        .order_by("seq")
        .values_list("parent_seq", "seq")
    )
    for parent, seq in children:
        out.setdefault(parent, []).append(seq)
    return out


def attach_siblings(*, session: Session, rows: list[Message]) -> list[Message]:
    """Set `siblings` (seqs, this one included) on each row, for payloads and views."""
    found = siblings_of(session=session, rows=rows)
    for row in rows:
        row.siblings = found.get(row.parent_seq) or [row.seq]  # type: ignore[attr-defined]
    return rows


def newest_leaf_under(*, session: Session, seq: int) -> int | None:
    """The newest message (highest seq) in the subtree of `seq`, or None when `seq` is not
    a message of the session. A child always has a higher seq than its parent, so the
    newest descendant has no children: it is a leaf."""
    table = connection.ops.quote_name(Message._meta.db_table)
    key = Message._meta.get_field("session").get_db_prep_value(session.pk, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH RECURSIVE below(seq) AS ("  # noqa: S608 (quoted identifier only)
            f"SELECT seq FROM {table} WHERE session_id = %s AND seq = %s "
            "UNION ALL "
            f"SELECT m.seq FROM {table} m JOIN below b ON m.parent_seq = b.seq "
            "WHERE m.session_id = %s"
            ") SELECT MAX(seq) FROM below",
            [key, seq, key],
        )
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] is not None else None


def branch_count(*, session: Session) -> int:
    """How many leaves the tree has besides the active one (the Markdown export says so)."""
    if session.active_seq is None:
        return 0
    leaves = (
        Message.objects.filter(session=session)
        .exclude(
            seq__in=Message.objects.filter(session=session, parent_seq__isnull=False).values(
                "parent_seq"
            )
        )
        .count()
    )
    return max(0, leaves - 1)


def active_turns(*, session: Session) -> list[Turn]:
    return list(Turn.objects.filter(session=session, status__in=Turn.ACTIVE).order_by("created_at"))


def active_turn_ids_by_session(*, session_ids: set[str]) -> dict[str, set[str]]:
    """Session id → ids of its turns that are producing events (queued or running; a
    turn awaiting approval is quiet by design), for many sessions in one query."""
    found: dict[str, set[str]] = {}
    ids = sorted(session_ids)
    for start in range(0, len(ids), 1000):  # within every backend's parameter limit
        rows = Turn.objects.filter(
            session_id__in=ids[start : start + 1000],
            status__in=[Turn.Status.QUEUED, Turn.Status.RUNNING],
        ).values_list("session_id", "pk")
        for session_id, turn_id in rows:
            found.setdefault(str(session_id), set()).add(str(turn_id))
    return found


def message_payload(message: Message, siblings: list[int] | None = None) -> dict[str, Any]:
    """A message as it travels on the socket (JSON types only; no provider sidecars).
    `siblings`: the seqs sharing its parent (`attach_siblings`), else just its own."""
    siblings = siblings or getattr(message, "siblings", None) or [message.seq]
    return {
        "seq": message.seq,
        "role": message.role,
        "content": message.content,
        "tool_calls": message.tool_calls or [],
        "tool_call_id": message.tool_call_id,
        "reasoning": message.reasoning,
        "tool": (message.extras or {}).get("tool") if message.role == "tool" else None,
        "is_error": bool((message.extras or {}).get("is_error"))
        if message.role == "tool"
        else False,
        "usage": message.usage,
        "model": message.model,
        "finish_reason": message.finish_reason,
        "turn": str(message.turn_id) if message.turn_id else None,
        "parent": message.parent_seq,
        "siblings": list(siblings),
        "continues": message.parent_seq if message.continuation else None,
    }


def workspace_root(session_id: uuid.UUID | str) -> Path:
    return Path(settings.MEDIA_ROOT) / "workspaces" / str(session_id)


def checkpoint_payload(checkpoint: CompactionCheckpoint) -> dict[str, Any]:
    return {
        "id": checkpoint.pk,
        "boundary_seq": checkpoint.boundary_seq,
        "summary": checkpoint.summary,
        "tokens_before": checkpoint.tokens_before,
        "tokens_after": checkpoint.tokens_after,
    }


def session_checkpoints(*, session: Session) -> list[CompactionCheckpoint]:
    return list(CompactionCheckpoint.objects.filter(session=session).order_by("created_at"))


# --- the web app's reads ---------------------------------------------------------------

# The chat page opens on this many messages; older ones come on request ("load earlier"),
# so a 5,000-message session costs the same queries and roughly the same HTML as a short one.
MESSAGE_WINDOW = 100


def session_list_page(
    *, user: AbstractBaseUser, query: str = "", archived: bool = False
) -> QuerySet[Session]:
    """The user's sessions, newest first, optionally filtered by a search (sessions.search)."""
    sessions = Session.objects.filter(owner=user, archived=archived).order_by("-updated_at")
    return session_search(sessions=sessions, query=query)


def messages_window(
    *,
    session: Session,
    before: int | None = None,
    after: int | None = None,
    limit: int = 0,
    leaf: int | None = None,
) -> tuple[list[Message], bool]:
    """Up to `limit` messages of the path root → `leaf` (default: the active leaf), in
    transcript order, and whether older ones exist; each row carries `siblings`.

    `before`: the newest messages with seq < before (the default window is the latest);
    `after`: the oldest messages with seq > after (a live page catching up). Two queries,
    branched or not: the window (the path walk is a subquery; one row beyond the limit
    is read to know whether there is more) and the window's siblings.
    """
    limit = limit or MESSAGE_WINDOW
    leaf = leaf if leaf is not None else session.active_seq
    if after is not None:
        rows = path_rows(session_id=session.pk, leaf_seq=leaf)
        found = list(rows.filter(seq__gt=after).order_by("seq")[: limit + 1])
        return attach_siblings(session=session, rows=found[:limit]), len(found) > limit
    rows = path_rows(session_id=session.pk, leaf_seq=leaf, below=before, first=limit + 1)
    newest_first = list(rows.order_by("-seq")[: limit + 1])
    more = len(newest_first) > limit
    return attach_siblings(session=session, rows=list(reversed(newest_first[:limit]))), more


def turns_by_id(*, session: Session, turn_ids: set[Any]) -> dict[str, Turn]:
    ids = {t for t in turn_ids if t}
    if not ids:
        return {}
    return {str(t.pk): t for t in Turn.objects.filter(session=session, pk__in=ids)}


def session_last_turn(*, session: Session) -> Turn | None:
    return Turn.objects.filter(session=session).order_by("-created_at").first()


def checkpoints_between(
    *, session: Session, first_seq: int, last_seq: int, shown: list[Message] | None = None
) -> list[Any]:
    """Compaction checkpoints whose boundary falls inside a rendered window (and, given
    the window's rows, is one of them: a checkpoint of another branch is not shown)."""
    rows = CompactionCheckpoint.objects.filter(
        session=session, boundary_seq__gte=first_seq, boundary_seq__lte=last_seq
    )
    if shown is not None:
        rows = rows.filter(boundary_seq__in=[m.seq for m in shown])
    return list(rows.order_by("boundary_seq", "created_at"))


def session_cost(*, session: Session) -> Any:
    """The session's total cost (0 before any priced call), or None when any model call of
    it had an unknown price (a partial sum would under-report; the page hides it instead)."""
    totals = Turn.objects.filter(session=session).aggregate(
        total=Sum("cost"),
        unknown=Count("pk", filter=Q(cost__isnull=True, steps__gt=0)),
    )
    if totals["unknown"]:
        return None
    return totals["total"] or Decimal(0)


def user_default_model(*, user: AbstractBaseUser) -> str:
    chosen = (
        UserPreferences.objects.filter(user=user).values_list("default_model", flat=True).first()
    )
    return chosen or settings.DEFAULT_MODEL


def attachment_kinds(*, session: Session) -> list[dict[str, Any]]:
    """The user messages that carry attachments, as small canonical dicts (content only):
    what `runtime.agent.degradation.degradation_note` needs, without loading the transcript.
    Of the active path only: what the next turn sends."""
    out = []
    contents = (
        path_rows(session_id=session.pk, leaf_seq=session.active_seq)
        .filter(role=Message.Role.USER)
        .order_by("seq")
        .values_list("content", flat=True)
        .iterator(chunk_size=500)
    )
    for content in contents:
        if isinstance(content, list):
            parts = [
                {"type": p.get("type")}
                for p in content
                if isinstance(p, dict) and p.get("type") in ("image_url", "file")
            ]
            if parts:
                out.append({"role": "user", "content": parts})
    return out


def session_export_messages(*, session: Session) -> Any:
    """Every message of the session in order, streamed from the database (exports)."""
    return Message.objects.filter(session=session).order_by("seq").iterator(chunk_size=500)


def model_choices(*, user: AbstractBaseUser) -> list[Any]:
    """The curated models this user may pick (`CuratedModel`s, admin order), from
    `providers.edge.matrix.curated_matrix()`; rows restricted to teams the user is not in
    are left out."""
    table = curated_matrix()
    allowed = {row.model_id for row in models_for_user(user)}
    return [
        entry
        for model_id, entry in table.items()
        if getattr(entry, "enabled", True) and model_id in allowed
    ]


def turn_pending_calls(*, turn: Turn) -> list[dict[str, Any]]:
    """Tool calls of the turn's latest assistant message that have no result yet."""
    last = Message.objects.filter(turn=turn, role=Message.Role.ASSISTANT).order_by("-seq").first()
    if last is None or not last.tool_calls:
        return []
    answered = set(
        Message.objects.filter(turn=turn, role=Message.Role.TOOL, seq__gt=last.seq).values_list(
            "tool_call_id", flat=True
        )
    )
    return [call for call in last.tool_calls if call["id"] not in answered]


# --- the sidebar and the first run -------------------------------------------------------

# The sidebar lists this many recent sessions (older ones: search, or the full list on
# the home page): enough for weeks of work, bounded so a page stays one cheap query.
SIDEBAR_LIMIT = 100
# Search results in the sidebar, each with a snippet.
SEARCH_RESULTS = 20
# Characters of context either side of a search hit in its snippet.
SNIPPET_CONTEXT = 60
SIDEBAR_GROUPS = ("Pinned", "Today", "Yesterday", "Previous 7 days", "Older")


def sidebar_groups(*, user: AbstractBaseUser, today: Any = None) -> list[tuple[str, list[Session]]]:
    """The user's active sessions for the sidebar: pinned first, then by age group
    (Today / Yesterday / Previous 7 days / Older), newest first within each; empty groups
    left out."""
    from datetime import timedelta

    from django.utils import timezone

    today = today or timezone.localdate()
    rows = list(
        Session.objects.filter(owner=user, archived=False)
        .order_by("-pinned", "-updated_at")
        .only("id", "title", "pinned", "updated_at", "archived")[:SIDEBAR_LIMIT]
    )
    groups: dict[str, list[Session]] = {name: [] for name in SIDEBAR_GROUPS}
    for session in rows:
        day = timezone.localdate(session.updated_at)
        if session.pinned:
            name = "Pinned"
        elif day >= today:
            name = "Today"
        elif day == today - timedelta(days=1):
            name = "Yesterday"
        elif day > today - timedelta(days=8):
            name = "Previous 7 days"
        else:
            name = "Older"
        groups[name].append(session)
    return [(name, items) for name, items in groups.items() if items]


def _snippet(text: str, query: str) -> str | None:
    """Up to SNIPPET_CONTEXT characters either side of the first hit of `query` (or of its
    first word), on one line; None when it does not occur."""
    flat = " ".join(text.split())
    lowered = flat.lower()
    for needle in (query.lower(), *query.lower().split()):
        at = lowered.find(needle) if needle else -1
        if at >= 0:
            start = max(0, at - SNIPPET_CONTEXT)
            end = min(len(flat), at + len(needle) + SNIPPET_CONTEXT)
            return ("…" if start else "") + flat[start:end] + ("…" if end < len(flat) else "")
    return None


def session_search_results(*, user: AbstractBaseUser, query: str) -> list[dict[str, Any]]:
    """Sidebar search: matching sessions (sessions.search), newest first, each with a
    snippet of the message text that matched (or of the title)."""
    query = normalise_query(query)
    if not query:
        return []
    found = session_search(
        sessions=Session.objects.filter(owner=user).order_by("-updated_at"), query=query
    )[:SEARCH_RESULTS]
    results = []
    for session in found:
        snippet = None
        texts = (
            Message.objects.filter(session=session, role__in=SEARCHED_ROLES)
            .order_by("-seq")
            .values_list("content", flat=True)
            .iterator(chunk_size=100)
        )
        for content in texts:
            snippet = _snippet(_text_parts(content), query)
            if snippet:
                break
        results.append(
            {
                "id": str(session.pk),
                "title": str(session),
                "archived": session.archived,
                "snippet": snippet or _snippet(session.title, query) or "",
            }
        )
    return results


def providers_with_keys(*, user: AbstractBaseUser) -> set[str]:
    """Providers this user can call: a profile of their own or the organisation's."""
    return set(
        ProviderProfile.objects.filter(Q(owner=user) | Q(owner__isnull=True)).values_list(
            "provider", flat=True
        )
    )


def model_provider(model: str) -> str:
    return split_model(model, default_provider=settings.DEFAULT_PROVIDER)[0]


def usable_model(*, user: AbstractBaseUser) -> str | None:
    """The model a new session should start with: the first with a key for its provider
    among the user's own default, the curated models (admin order) and the site default;
    None when no provider has a key anywhere (the page then says so, with a link to
    Settings)."""
    keys = providers_with_keys(user=user)
    if not keys:
        return None
    chosen = (
        UserPreferences.objects.filter(user=user).values_list("default_model", flat=True).first()
    )
    candidates = [chosen] if chosen else []
    candidates += [entry.id for entry in model_choices(user=user)]
    candidates.append(settings.DEFAULT_MODEL)
    for model in candidates:
        if model and model_provider(model) in keys:
            return model
    return None


def new_session_model(*, user: AbstractBaseUser) -> str:
    """What a new session starts on: a model the user can run now (`usable_model`); with
    no key anywhere, the model they chose as their default, else the site default when
    it is one of the curated models they may pick, else the first of those. A curated
    model is one the policy lets them start a session with, so a first run lands in the
    composer, which then says where the key goes."""
    usable = usable_model(user=user)
    if usable:
        return usable
    chosen = (
        UserPreferences.objects.filter(user=user).values_list("default_model", flat=True).first()
    )
    if chosen:
        return chosen
    curated = [entry.id for entry in model_choices(user=user)]
    if not curated or settings.DEFAULT_MODEL in curated:
        return settings.DEFAULT_MODEL
    return curated[0]


def workspace_files(*, session: Session, limit: int = 500) -> list[dict[str, Any]]:
    """Files the agent wrote in this session's workspace: relative path and size, sorted."""
    root = workspace_root(session.pk)
    if not root.is_dir():
        return []
    out = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            out.append({"path": path.relative_to(root).as_posix(), "size": path.stat().st_size})
            if len(out) >= limit:
                break
    return out


def user_theme(*, user: AbstractBaseUser) -> str:
    if not getattr(user, "is_authenticated", False):
        return UserPreferences.Theme.SYSTEM
    chosen = UserPreferences.objects.filter(user=user).values_list("theme", flat=True).first()
    return chosen or UserPreferences.Theme.SYSTEM
