"""The web process: Daphne, with an access log that leaves query strings out.

Daphne's access log (on by default, to stdout) writes each request's whole URI. Query
strings carry what must not reach a log: the authorization code and state of the SSO
and MCP OAuth callbacks (`?code=...&state=...`), search terms a user typed. The log keeps
the method, the path, the status and the size, and says a query was there.

Run as `python -m openworker.web_server` with Daphne's own arguments (`make run`, the
Dockerfile, docker-compose.yml). It serves on uvloop where installed
(`openworker.event_loop`): Daphne builds Twisted's event loop when `daphne.server` is
first imported, so the loop policy is set before that import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from openworker.event_loop import install_policy

if __name__ == "__main__":
    install_policy()  # served by this module; importing it (tests) changes no policy

# After the policy: importing daphne.server builds Twisted's event loop.
from daphne.cli import CommandLineInterface
from daphne.server import Server

REDACTED_QUERY = "?[query omitted]"


def path_without_query(path: str) -> str:
    """The logged form of a request path: the query string replaced by a marker. Pure."""
    head, separator, _ = path.partition("?")
    return head + REDACTED_QUERY if separator else head


def _redacting(logger: Callable[[str, str, dict[str, Any]], None]) -> Callable[..., None]:
    def log(protocol: str, action: str, details: dict[str, Any]) -> None:
        path = details.get("path")
        if isinstance(path, str):
            details = {**details, "path": path_without_query(path)}
        logger(protocol, action, details)

    return log


class RedactingServer(Server):
    """Daphne's server, its action logger (the access log) given paths without queries."""

    def __init__(self, *args: Any, action_logger: Any = None, **kwargs: Any) -> None:
        if action_logger is not None:
            action_logger = _redacting(action_logger)
        super().__init__(*args, action_logger=action_logger, **kwargs)


class WebServerCLI(CommandLineInterface):
    server_class = RedactingServer


def main() -> None:
    WebServerCLI.entrypoint()


if __name__ == "__main__":
    main()
