"""The web process: Daphne, with an access log that leaves query strings out.

Daphne's access log (on by default, to stdout) writes each request's whole URI. Query
strings carry what must not reach a log: the authorization code and state of the SSO
and MCP OAuth callbacks (`?code=...&state=...`), search terms a user typed. The log keeps
the method, the path, the status and the size, and says a query was there.

Autobahn (Daphne's websocket protocol) builds the arguments of a debug log line for every
frame it sends, whether or not debug is logged: three `click.style` calls, about 8 µs a
frame, 5 % of Daphne's CPU per frame (py-spy, bench/stream_path.py). The web process
gives it plain versions of those two helpers (`plain_autobahn_log_arguments`), and
writes plain text frames itself (`web_frames`).

Run as `python -m openworker.web_server` with Daphne's own arguments (`make run`, the
Dockerfile, docker-compose.yml). It serves on uvloop where installed
(`openworker.event_loop`), through `web_reactor.FlushingReactor`: Daphne builds Twisted's
reactor when `daphne.server` is first imported unless one is installed, so the loop policy
is set and the reactor installed before that import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from openworker import web_reactor
from openworker.event_loop import install_policy

if __name__ == "__main__":
    # Served by this module; importing it (tests) changes no policy and no reactor.
    install_policy()
    web_reactor.install()  # writes without epoll round trips: see web_reactor.py

# After the policy and the reactor: Daphne keeps an asyncio reactor it finds installed.
from daphne.cli import CommandLineInterface
from daphne.server import Server

from openworker.web_frames import frame_text_directly

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


def _plain_type(obj: object) -> str:
    return f"<{getattr(obj, '__qualname__', type(obj).__qualname__)}>"


def _plain_value(value: object, *_: Any, **__: Any) -> object:
    return value


def plain_autobahn_log_arguments() -> None:
    """Autobahn's websocket modules format their debug log arguments with these names,
    eagerly (`hltype`, `hlval`: colours from `click`); plain ones cost a fraction. The
    debug lines, when logged, read the same without the colours."""
    from autobahn.twisted import websocket as twisted_websocket
    from autobahn.websocket import protocol

    for module in (protocol, twisted_websocket):
        module.hltype = _plain_type  # type: ignore[attr-defined]
        module.hlval = _plain_value  # type: ignore[attr-defined]


def main() -> None:
    plain_autobahn_log_arguments()
    frame_text_directly()
    WebServerCLI.entrypoint()


if __name__ == "__main__":
    main()
