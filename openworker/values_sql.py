"""A list of typed rows for a written-out `UPDATE ... FROM (VALUES ...)`.

Updating a wave of turns row by row, or with the ORM's CASE of a WHEN per row and column,
held the worker's GIL for milliseconds while every stream waited (docs/PERFORMANCE.md,
sessions 12-14). One statement over a VALUES list costs the same few microseconds of
Python per row, and one round trip.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection
from django.db.models import Field


def values_rows(fields: Sequence[Field], rows: Iterable[Sequence[Any]]) -> tuple[str, list[Any]]:
    """`(VALUES (...), ...)`'s inside and its parameters: each value made ready for its
    field's column as a save would (`get_db_prep_save`). On PostgreSQL each one is cast
    to its column's type: a NULL or a quoted literal in VALUES is text otherwise, which a
    uuid, numeric, timestamp or jsonb column refuses. The columns are `column1`,
    `column2`, ... in PostgreSQL and SQLite alike."""
    if connection.vendor == "postgresql":
        one = ", ".join(f"CAST(%s AS {field.db_type(connection)})" for field in fields)
    else:
        one = ", ".join(["%s"] * len(fields))
    params: list[Any] = []
    count = 0
    for row in rows:
        params += [f.get_db_prep_save(v, connection) for f, v in zip(fields, row, strict=True)]
        count += 1
    return ", ".join([f"({one})"] * count), params
