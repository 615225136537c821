"""A list of typed rows for a written-out `UPDATE ... FROM (VALUES ...)`, and new rows
written out in one `INSERT ... VALUES ... RETURNING` (`rows_insert`).

Updating a wave of turns row by row, or with the ORM's CASE of a WHEN per row and column,
held the worker's GIL for milliseconds while every stream waited (docs/PERFORMANCE.md,
sessions 12-14). One statement over a VALUES list costs the same few microseconds of
Python per row, and one round trip.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection
from django.db.models import Field, Model
from django.db.models.fields import NOT_PROVIDED


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


def rows_insert(objs: Sequence[Model]) -> None:
    """`bulk_create(objs)` for plain new rows of one model, written out: one `INSERT ...
    VALUES (...), ... RETURNING` its key when the database makes it. Each value is what a
    save writes (`pre_save`, so `auto_now_add` is set on the instance too, then
    `get_db_prep_save`); the instances come back saved, with their keys.

    Django 5.2's `bulk_create` on PostgreSQL sends a column's values as one array each
    (`UNNEST`), which psycopg's client-side binding quotes item by item in Python, and
    compiles the insert per call: about half of a wave's step commits on the worker's
    database thread (bench/turn_start.py --batch 5). Models with database defaults or
    generated columns, and batches past the backend's parameter limit, take
    `bulk_create` itself."""
    if not objs:
        return
    model = type(objs[0])
    opts = model._meta
    pk = opts.pk
    assert pk is not None
    returned = pk if pk.db_returning and all(obj.pk is None for obj in objs) else None
    fields = [f for f in opts.concrete_fields if f is not returned]
    plain = all(f.db_default is NOT_PROVIDED and not getattr(f, "generated", False) for f in fields)
    if (
        not plain
        or (returned is not None and not connection.features.can_return_rows_from_bulk_insert)
        or connection.ops.bulk_batch_size(fields, objs) < len(objs)
        or any(type(obj) is not model for obj in objs)
    ):
        model._default_manager.bulk_create(objs)
        return
    quote = connection.ops.quote_name
    params: list[Any] = []
    for obj in objs:
        obj._prepare_related_fields_for_save(operation_name="bulk_create")
        params += [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]
    one = f"({', '.join(['%s'] * len(fields))})"
    sql = (
        f"INSERT INTO {quote(opts.db_table)} "  # noqa: S608 (quoted identifiers only)
        f"({', '.join(quote(f.column) for f in fields)}) VALUES {', '.join([one] * len(objs))}"
    )
    if returned is not None:
        sql += f" RETURNING {quote(returned.column)}"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        keys = cursor.fetchall() if returned is not None else []
    for index, obj in enumerate(objs):
        if returned is not None:
            setattr(obj, returned.attname, keys[index][0])
        obj._state.adding = False
        obj._state.db = connection.alias
