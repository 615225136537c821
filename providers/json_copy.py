"""A deep copy of JSON-shaped data, without `copy.deepcopy`'s machinery.

A model request is copied several times on its way out (the history, the neutral
context, the cache policy's breakpoints), every copy of every turn's messages and tool
schemas: `copy.deepcopy` keeps a memo and dispatches per object, and was 13 % of the
worker's event loop per turn in a cProfile of `bench/stream_path.py` (session 16).
Dicts, lists and atoms, what such a request is made of, are copied directly here, at a
third of the cost; anything else (a tuple, a dataclass, bytes) still goes through
`copy.deepcopy`, so the result is always a copy that shares nothing mutable.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any, TypeVar

T = TypeVar("T")

_ATOMS = frozenset({str, int, float, bool, type(None)})


def json_copy(value: T) -> T:
    """A deep copy of `value`. Pure."""
    kind = type(value)
    if kind is dict:
        return {key: json_copy(item) for key, item in value.items()}  # type: ignore[attr-defined,return-value]
    if kind is list:
        return [json_copy(item) for item in value]  # type: ignore[attr-defined,return-value]
    if kind in _ATOMS:
        return value
    return deepcopy(value)


def json_copy_all(values: Any) -> list[Any]:
    """`json_copy` of each item of an iterable, as a new list."""
    return [json_copy(item) for item in values]
