"""`openworker.compact_json.dumps` (the C encoder made once), which encodes every
streamed event for the replay buffer and the sockets, writes exactly what
`json.dumps(event, separators=(",", ":"))` writes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openworker.compact_json import dumps

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@given(st.dictionaries(st.text(max_size=10), json_values, max_size=6))
def test_an_event_is_encoded_as_compact_json_dumps_encodes_it(event: dict[str, Any]) -> None:
    assert dumps(event) == json.dumps(event, separators=(",", ":"))


def test_a_value_json_cannot_encode_is_refused_as_json_dumps_refuses_it() -> None:
    with pytest.raises(TypeError):
        dumps({"type": "delta", "text": object()})
