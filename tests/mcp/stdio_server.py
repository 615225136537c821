"""The test MCP server over stdio: `python tests/mcp/stdio_server.py [EVENTS_FILE]`.
With a file, every event the server sees (and `pid:<n>` at start) is appended to it, one
a line, so a test can see what a server process it cannot reach into received."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.mcp.servers import build_server


class _FileEvents(list):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.append(f"pid:{os.getpid()}")

    def append(self, item: str) -> None:
        super().append(item)
        with open(self.path, "a") as out:
            out.write(item + "\n")


if __name__ == "__main__":
    events = _FileEvents(sys.argv[1]) if len(sys.argv) > 1 else None
    build_server(events).run("stdio")
