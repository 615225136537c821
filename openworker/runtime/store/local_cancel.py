"""Cancel tokens of the turns running in this process.

Stop reaches a turn of this process at once through its token (closing the upstream
socket); a turn in another process sees the database flag its heartbeat reads.
"""

from __future__ import annotations

import threading
import uuid

from providers.cancel import CancelToken

_local_tokens: dict[str, CancelToken] = {}
_local_lock = threading.Lock()


def register_local(turn_id: str, token: CancelToken) -> None:
    with _local_lock:
        _local_tokens[turn_id] = token


def unregister_local(turn_id: str) -> None:
    with _local_lock:
        _local_tokens.pop(turn_id, None)


def turn_cancel_local(turn_id: uuid.UUID | str) -> bool:
    with _local_lock:
        token = _local_tokens.get(str(turn_id))
    if token is None:
        return False
    token.cancel()
    return True
