from collections import OrderedDict
from dataclasses import dataclass, field

from providers.json_copy import json_copy, json_copy_all


def _ids_of_containers(value, seen=None):
    seen = set() if seen is None else seen
    if isinstance(value, dict):
        seen.add(id(value))
        for item in value.values():
            _ids_of_containers(item, seen)
    elif isinstance(value, (list, tuple)):
        seen.add(id(value))
        for item in value:
            _ids_of_containers(item, seen)
    return seen


def test_a_request_shaped_value_is_copied_equal_sharing_no_container():
    original = {
        "role": "user",
        "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
        "n": 1,
        "x": 1.5,
        "ok": True,
        "none": None,
        "tools": [{"name": "t", "input_schema": {"type": "object", "properties": {}}}],
    }
    copied = json_copy(original)
    assert copied == original
    assert not _ids_of_containers(copied) & _ids_of_containers(original)
    copied["content"][0]["cache_control"]["ttl"] = "1h"
    assert "ttl" not in original["content"][0]["cache_control"]


def test_anything_but_dicts_lists_and_atoms_is_deep_copied_too():
    @dataclass
    class Part:
        data: dict = field(default_factory=dict)

    inner = {"k": [1]}
    original = {"tuple": (inner,), "part": Part({"a": [2]}), "ordered": OrderedDict(a=[3])}
    copied = json_copy(original)
    assert copied == original
    assert copied["tuple"][0] is not inner and copied["tuple"][0] == inner
    assert copied["part"].data is not original["part"].data
    assert type(copied["ordered"]) is OrderedDict
    assert copied["ordered"]["a"] is not original["ordered"]["a"]


def test_json_copy_all_makes_a_new_list_of_copies():
    items = ({"a": [1]}, {"b": 2})
    copied = json_copy_all(items)
    assert copied == list(items)
    assert copied[0] is not items[0] and copied[0]["a"] is not items[0]["a"]
