"""Search over a user's sessions: titles and message text.

PostgreSQL (distributed mode): full-text search. `to_tsvector` over the title, and over
the message `content` jsonb (PostgreSQL's jsonb form of `to_tsvector` indexes string
VALUES only, so part keys such as "type"/"text" never match), each backed by a GIN
expression index (migration `0004_search`). The query expressions below and the index
expressions are built by the same functions, so the planner can use the indexes.

SQLite (embedded mode): a case-insensitive substring match; one team's laptop-sized
database does not need an index to feel instant.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import connection
from django.db.models import BooleanField, Exists, F, Func, OuterRef, Q, QuerySet, TextField, Value

from sessions.models import Message, Session

# "simple" does no stemming and no stop words: it treats every language the same, and
# teams write in many. (An English-only install could switch to "english".)
SEARCH_CONFIG = "simple"
# Only what people wrote and read: tool output (file dumps, web pages) would drown hits.
SEARCHED_ROLES = (Message.Role.USER, Message.Role.ASSISTANT)
MAX_QUERY_CHARS = 200


class _ToTsvector(Func):
    """`to_tsvector('<config>'::regconfig, <expr>)`, built identically for index and query."""

    function = "to_tsvector"
    template = "%(function)s('" + SEARCH_CONFIG + "'::regconfig, %(expressions)s)"
    output_field = TextField()


def title_vector() -> Func:
    return _ToTsvector(F("title"))


def content_vector() -> Func:
    # `content` is jsonb on PostgreSQL: to_tsvector(regconfig, jsonb) reads its string values.
    return _ToTsvector(F("content"))


class _Matches(Func):
    """`<tsvector> @@ websearch_to_tsquery('<config>', <query>)`: quoted phrases, OR, -not."""

    template = (
        "%(expressions)s @@ websearch_to_tsquery('" + SEARCH_CONFIG + "'::regconfig, %(query)s)"
    )
    output_field = BooleanField()
    arg_joiner = ""

    def __init__(self, vector: Func, query: str) -> None:
        super().__init__(vector, Value(query))

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        vector_sql, vector_params = compiler.compile(self.source_expressions[0])
        query_sql, query_params = compiler.compile(self.source_expressions[1])
        sql = self.template % {"expressions": vector_sql, "query": query_sql}
        return sql, (*vector_params, *query_params)


def _postgres() -> bool:
    return connection.vendor == "postgresql"


def normalise_query(query: str) -> str:
    return " ".join((query or "").split())[:MAX_QUERY_CHARS]


def session_search(*, sessions: QuerySet[Session], query: str) -> QuerySet[Session]:
    """`sessions` (already scoped to one owner) whose title or message text matches."""
    query = normalise_query(query)
    if not query:
        return sessions
    messages = Message.objects.filter(session=OuterRef("pk"), role__in=SEARCHED_ROLES)
    if _postgres():
        title_hit = Q(_Matches(title_vector(), query)) | Q(title__icontains=query)
        text_hit = Exists(messages.filter(_Matches(content_vector(), query)))
        return sessions.filter(title_hit | text_hit)
    # SQLite stores JSON with ASCII escapes ("café" as "caf\u00e9"): match either spelling.
    escaped = json.dumps(query)[1:-1]
    text = Q(content__icontains=query)
    if escaped != query:
        text |= Q(content__icontains=escaped)
    return sessions.filter(Q(title__icontains=query) | Exists(messages.filter(text)))
