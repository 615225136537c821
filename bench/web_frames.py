"""Benchmark: the web process's CPU per text frame from a socket's send to its transport,
autobahn's path against `openworker.web_frames`.

Run from the repository root: `.venv/bin/python bench/web_frames.py`. One process, no
network: each side sends FRAMES delta-sized text frames (`serverSend`, as Daphne's
websocket protocol is handed a consumer's `websocket.send`) to an in-memory transport
that drops what it is given, and reports the CPU per frame (`time.process_time`), best
and median of RUNS, alternated. What the transport then costs (the write system call,
`bench/web_writes.py`) and everything before the send (`bench/stream_path.py`) are not
here. No target: a figure to compare by (docs/PERFORMANCE.md). A few seconds.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FRAMES = 100_000
RUNS = 5
DELTA = '{"type":"delta","turn":"8a1f0c2e9b7d4e3fa6c5b4a3f2e1d0c9","seq":42,"text":" a token"}'


class _Dropped:
    """A transport that takes the bytes and keeps nothing."""

    def write(self, data: bytes) -> None:
        pass

    def getPeer(self) -> None:  # Twisted's name
        return None


def _opened(cls: type) -> Any:
    from autobahn.websocket.protocol import WebSocketProtocol as AutobahnProtocol

    from openworker.web_frames import FramingWebSocketFactory

    socket = cls()
    socket.factory = FramingWebSocketFactory(None)
    socket.transport = _Dropped()
    AutobahnProtocol._connectionMade(socket)  # the factory's options, the send queue
    socket.state = socket.STATE_OPEN
    socket.client_addr = None
    return socket


def _per_frame(socket: Any) -> float:
    send = socket.serverSend
    started = time.process_time()
    for _ in range(FRAMES):
        send(DELTA)
    return (time.process_time() - started) * 1e6 / FRAMES


def main() -> int:
    from daphne.ws_protocol import WebSocketProtocol

    from openworker.web_frames import FramingWebSocketProtocol
    from openworker.web_server import plain_autobahn_log_arguments

    plain_autobahn_log_arguments()  # as the web process runs autobahn
    sides = {"autobahn": WebSocketProtocol, "web_frames": FramingWebSocketProtocol}
    figures: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(RUNS):
        for name, cls in sides.items():
            figures[name].append(_per_frame(_opened(cls)))
    for name, values in figures.items():
        print(
            f"{name}: CPU per text frame best {min(values):.2f} µs, median "
            f"{statistics.median(values):.2f} µs ({', '.join(f'{v:.2f}' for v in values)})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
