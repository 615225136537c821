"""The test MCP server over stdio: `python tests/mcp/stdio_server.py`."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.mcp.servers import build_server

if __name__ == "__main__":
    build_server().run("stdio")
