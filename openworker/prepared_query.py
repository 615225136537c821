"""Hot read queries written with the ORM and compiled to SQL once per process.

Django compiles a queryset to SQL every time it runs. For the few queries on the path of
every send and every turn start that compilation costs more than the query: the model
policy's one query (five EXISTS subqueries) took 2.3 ms of CPU, 1.7 ms of it compiling
and 0.12 ms executing (PostgreSQL on loopback). A burst of sends waits on exactly that
CPU (docs/PERFORMANCE.md).

A `PreparedQuery` keeps the query in ORM terms, so it follows the models, and compiles
it once per database alias with a stand-in value for each argument: a value no caller
passes, so every place the SQL binds an argument is found by equality. Later calls bind
the real values at those places, run the SQL and convert the columns as the ORM would
(SQLite's booleans, datetimes), into tuples or into model instances as `ModelIterable`
makes them. This is SQLAlchemy's "baked query" idea; Django has no equivalent.

Only for queries whose SQL does not depend on the values: equality and comparison
filters on scalar arguments, and lists through `AnyOf` (not `__in`: its SQL has one
placeholder per item). A list argument is declared `list[int]`, `list[str]` or
`list[uuid.UUID]` and filtered with `AnyOf(F("pk"), values)`: one parameter whatever the
list's length, so a batch of any size runs the SQL compiled once.
An argument the compiled SQL does not bind exactly as given raises at compile time. A
None binds as SQL NULL, so `column = NULL` matches no row, as a missing key should
(the ORM writes `IS NULL` for `filter(column=None)`: a different query).
"""

from __future__ import annotations

import json
import threading
import typing
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import Lookup, QuerySet
from django.db.models.query import get_related_populators

# Stand-ins by argument type. An int stand-in stays inside a 32-bit column's range.
_INT_BASE = 2_000_000_000
_UUID_BASE = 0x5EED_0000_0000_0000_0000_0000_0000_0000


def _stand_in(kind: Any, position: int) -> Any:
    item = _list_kind(kind)
    if item is not None:
        return [_stand_in(item, position)]
    if kind is int:
        return _INT_BASE + position
    if kind is str:
        return f"\x1fprepared-query-argument-{position}\x1f"
    if kind is uuid.UUID:
        return uuid.UUID(int=_UUID_BASE + position)
    raise TypeError(
        f"PreparedQuery arguments are int, str or uuid.UUID (or lists of one), not {kind!r}"
    )


def _list_kind(kind: Any) -> type | None:
    """The item type of a `list[...]` argument, or None for a scalar one."""
    if typing.get_origin(kind) is list:
        (item,) = typing.get_args(kind)
        return item  # type: ignore[no-any-return]
    return None


def list_param(items: Iterable[Any], vendor: str) -> Any:
    """The one SQL parameter of `AnyOf`'s list, its items already as the backend takes
    them: an array on PostgreSQL, a JSON array for SQLite's `json_each`."""
    if vendor == "postgresql":
        return list(items)
    return json.dumps(list(items))


class AnyOf(Lookup):  # type: ignore[type-arg]
    """`AnyOf(F("column"), values)`: the column is one of `values`, written so that its SQL
    is the same for any number of them: `column = ANY(%s)` with an array on PostgreSQL,
    `column IN (SELECT value FROM json_each(%s))` elsewhere (SQLite). `__in` writes one
    placeholder per value, so a batch's query compiled anew for each size. No values
    match nothing, as `__in=[]` does."""

    lookup_name = "any_of"
    prepare_rhs = False

    def get_db_prep_lookup(self, value: Any, connection: Any) -> tuple[str, list[Any]]:
        items = list(value)
        if not items:
            raise EmptyResultSet
        field = self.lhs.output_field
        prepped = (field.get_db_prep_value(item, connection, prepared=False) for item in items)
        return "%s", [list_param(prepped, connection.vendor)]

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        lhs_sql, lhs_params = self.process_lhs(compiler, connection)
        rhs_sql, rhs_params = self.process_rhs(compiler, connection)
        params = (*lhs_params, *rhs_params)
        if connection.vendor == "postgresql":
            return f"{lhs_sql} = ANY({rhs_sql})", params
        # The compiler's own column and placeholder: no value is interpolated.
        return f"{lhs_sql} IN (SELECT value FROM json_each({rhs_sql}))", params  # noqa: S608


def _as_uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def _uuid_hex(value: Any) -> str:
    return _as_uuid(value).hex


@dataclass(frozen=True)
class _Compiled:
    sql: str
    # Per SQL parameter: (argument name, how to pass its value) or (None, the constant).
    params: tuple[tuple[str | None, Any], ...]
    # Per result column index: the ORM's converters for it (with their expression).
    converters: tuple[tuple[int, tuple[tuple[Callable[..., Any], Any], ...]], ...]
    # A query of model rows: how a row becomes an instance, as `ModelIterable` does it.
    instances: _Instances | None
    # The list arguments (`AnyOf`): an empty one answers no rows without a query.
    lists: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Instances:
    model: Any
    init_list: tuple[str, ...]
    start: int
    end: int
    # select_related's models, set on each instance (Django's own populators).
    related: tuple[Any, ...]


class PreparedQuery:
    """`build(**arguments)` returns the queryset (slice it, e.g. `[:1]`, rather than call
    `.first()`); `arguments` maps each argument's name to its type (int, str or
    uuid.UUID). `rows(**values)` runs it and returns its rows as tuples (a `values_list`
    query); `instances(**values)` returns model instances (a plain or `select_related`
    model query)."""

    def __init__(self, build: Callable[..., QuerySet], **arguments: Any) -> None:
        self._build = build
        self._arguments = arguments
        self._compiled: dict[str, _Compiled] = {}
        self._lock = threading.Lock()

    def rows(self, *, using: str = "default", **values: Any) -> list[tuple[Any, ...]]:
        if values.keys() != self._arguments.keys():
            expected, got = sorted(self._arguments), sorted(values)
            raise TypeError(f"expected the arguments {expected}, got {got}")
        compiled = self._compiled.get(using) or self._compile(using)
        connection = connections[using]
        for name in compiled.lists:
            if not values[name]:
                # `AnyOf` of no values: no rows, as the ORM answers (EmptyResultSet),
                # where an empty array would need a type PostgreSQL cannot infer.
                return []
        params = [_bind(name, how, values) for name, how in compiled.params]
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, params)
            rows = cursor.fetchall()
        if not compiled.converters:
            return [tuple(row) for row in rows]
        converted = []
        for row in rows:
            values_out = list(row)
            for index, chain in compiled.converters:
                value = values_out[index]
                for converter, expression in chain:
                    value = converter(value, expression, connection)
                values_out[index] = value
            converted.append(tuple(values_out))
        return converted

    def instances(self, *, using: str = "default", **values: Any) -> list[Any]:
        compiled = self._compiled.get(using) or self._compile(using)
        how = compiled.instances
        if how is None:
            raise TypeError("instances() takes a query of model rows, not values_list")
        found = []
        for row in self.rows(using=using, **values):
            instance = how.model.from_db(using, how.init_list, row[how.start : how.end])
            for populator in how.related:
                populator.populate(row, instance)
            found.append(instance)
        return found

    def first(self, *, using: str = "default", **values: Any) -> tuple[Any, ...] | None:
        """The first row, or None."""
        found = self.rows(using=using, **values)
        return found[0] if found else None

    def _compile(self, using: str) -> _Compiled:
        with self._lock:
            compiled = self._compiled.get(using)
            if compiled is None:
                compiled = self._compiled[using] = self._compile_now(using)
            return compiled

    def _compile_now(self, using: str) -> _Compiled:
        stand_ins = {
            name: _stand_in(kind, position)
            for position, (name, kind) in enumerate(self._arguments.items())
        }
        compiler = self._build(**stand_ins).query.get_compiler(using)
        sql, raw_params = compiler.as_sql()
        vendor = connections[using].vendor
        params: list[tuple[str | None, Any]] = []
        bound: set[str] = set()
        for param in raw_params:
            match = _match(param, stand_ins, vendor)
            if match is None:
                params.append((None, param))
            else:
                params.append(match)
                bound.add(match[0])
        unbound = set(self._arguments) - bound
        if unbound:
            raise ValueError(
                f"PreparedQuery: {sorted(unbound)} are not bound as SQL parameters; "
                "this query's SQL depends on their values"
            )
        columns = [column for column, _, _ in compiler.select[: compiler.col_count]]
        converters = tuple(
            (index, tuple((converter, expression) for converter in chain))
            for index, (chain, expression) in sorted(compiler.get_converters(columns).items())
        )
        lists = tuple(name for name, kind in self._arguments.items() if _list_kind(kind))
        instances = _instances_of(compiler, using)
        return _Compiled(sql, tuple(params), converters, instances, lists)


def _instances_of(compiler: Any, using: str) -> _Instances | None:
    """How `ModelIterable` makes instances of this query's rows, worked out once; None for
    a `values_list` query (the compiler selects no model). Annotated model rows are not
    supported, and `prefetch_related` is not SQL: a prepared query does not run it."""
    info = compiler.klass_info
    if info is None or not compiler.query.default_cols:
        return None  # values_list: its columns, not a model's
    if compiler.annotation_col_map:
        raise ValueError("PreparedQuery: model queries with annotations are not supported")
    start, end = info["select_fields"][0], info["select_fields"][-1] + 1
    return _Instances(
        model=info["model"],
        init_list=tuple(column.target.attname for column, _, _ in compiler.select[start:end]),
        start=start,
        end=end,
        related=tuple(get_related_populators(info, compiler.select, using)),
    )


def _bind(name: str | None, how: Any, values: dict[str, Any]) -> Any:
    """One SQL parameter's value: a constant of the query (`name` None), or the named
    argument passed as the backend takes it."""
    if name is None:
        return how
    value = values[name]
    return None if value is None else how(value)


class _ListOf:
    """How a list argument's values are passed: each item as `item_how` passes a scalar,
    the whole as `AnyOf`'s one parameter (`list_param`)."""

    def __init__(self, item_how: Any, vendor: str) -> None:
        self.item_how = item_how
        self.vendor = vendor

    def __call__(self, values: Iterable[Any]) -> Any:
        items = (None if value is None else self.item_how(value) for value in values)
        return list_param(items, self.vendor)


def _match(param: Any, stand_ins: dict[str, Any], vendor: str) -> tuple[str, Any] | None:
    """Which argument the SQL parameter `param` is, and how its values are passed (the
    backend may pass a UUID as the object or as its hex string; a list as an array or as
    a JSON string)."""
    for name, stand_in in stand_ins.items():
        if isinstance(stand_in, list):
            found = _match_list(param, name, stand_in[0], vendor)
            if found is not None:
                return found
        elif isinstance(stand_in, uuid.UUID):
            if isinstance(param, uuid.UUID) and param == stand_in:
                return name, _as_uuid
            if param == stand_in.hex:
                return name, _uuid_hex
            if param == str(stand_in):
                return name, str
        elif type(param) is not bool and param == stand_in:
            return name, type(stand_in)
    return None


def _match_list(param: Any, name: str, item: Any, vendor: str) -> tuple[str, Any] | None:
    """`param` as `AnyOf`'s parameter of the one-item list `[item]`, or None."""
    if vendor == "postgresql":
        if not isinstance(param, list) or len(param) != 1:
            return None
        found = _match(param[0], {name: item}, vendor)
    else:
        if not isinstance(param, str) or not param.startswith("["):
            return None
        try:
            decoded = json.loads(param)
        except ValueError:
            return None
        if not isinstance(decoded, list) or len(decoded) != 1:
            return None
        found = _match(decoded[0], {name: item}, vendor)
    return None if found is None else (name, _ListOf(found[1], vendor))
