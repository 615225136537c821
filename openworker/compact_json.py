"""`json.dumps(value, separators=(",", ":"))` with its encoder made once.

`json.dumps` builds its encoder (and the C encoder under it) on every call: two thirds
of the 7 µs it takes for a streamed delta. Every event of every streaming turn is encoded
by the worker for the replay buffer, and by the web process for each socket it goes to.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable
from typing import Any


def _compact_encoder() -> Callable[[Any], str]:
    """The C encoder `JSONEncoder.iterencode` makes for a one-shot encode, without the
    circular-reference markers (what is encoded here is plain data); the pure-Python
    encoder where this Python has no C accelerator."""
    plain = json.JSONEncoder(separators=(",", ":"))
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return plain.encode
    encode = make(
        None, plain.default, json.encoder.encode_basestring_ascii, None, ":", ",",
        False, False, True,
    )  # fmt: skip
    return lambda value: "".join(encode(value, 0))


dumps: Callable[[Any], str] = _compact_encoder()
