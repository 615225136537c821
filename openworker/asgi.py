"""ASGI entry point: HTTP to Django, websockets through origin and auth checks.

`SameOriginValidator` refuses a socket whose Origin is not the site's own origin (scheme,
host and port, the host one of ALLOWED_HOSTS) or one of CSRF_TRUSTED_ORIGINS: the rule
Django's CSRF check applies to a form post, so a page on another port or scheme of the
same host cannot drive a signed-in user's socket (cross-site websocket hijacking).
`AuthMiddlewareStack` resolves the signed-in user from the session cookie; consumers close
anonymous sockets themselves.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "openworker.settings")
# Django must be set up before anything imports models (the consumers do).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import WebsocketDenier  # noqa: E402
from django.conf import settings  # noqa: E402
from django.http.request import split_domain_port, validate_host  # noqa: E402
from django.utils.http import is_same_domain  # noqa: E402

from openworker import gc_tuning, thread_switching  # noqa: E402
from openworker.runtime.agent.llm import warm_for_serving  # noqa: E402
from openworker.runtime.turns import watchdog  # noqa: E402
from openworker.runtime.turns.runner import embedded_runner  # noqa: E402
from sessions.routing import websocket_urlpatterns  # noqa: E402

# Browsers leave the default port out of an Origin; a Host header may carry it.
DEFAULT_PORTS = {"http": "80", "https": "443"}


def _origin_key(scheme: str, netloc: str) -> tuple[str, str]:
    host, port = split_domain_port(netloc.lower())
    if not host:
        return scheme, ""
    if port == DEFAULT_PORTS.get(scheme):
        port = ""
    return scheme, f"{host}:{port}" if port else host


def origin_allowed(
    headers: Iterable[tuple[bytes, bytes]],
    *,
    secure: bool,
    allowed_hosts: list[str],
    trusted_origins: list[str],
    proxy_ssl_header: tuple[str, str] | None = None,
) -> bool:
    """Whether a handshake's Origin is this site (same scheme, host and port as the socket
    was asked of, the host allowed) or a trusted origin. Pure: asgi scope headers in."""
    found = {name.lower(): value.decode("latin-1") for name, value in headers}
    origin, host = found.get(b"origin", ""), found.get(b"host", "")
    if not origin or origin == "null":
        return False
    if proxy_ssl_header is not None:
        header, value = proxy_ssl_header
        forwarded = header.removeprefix("HTTP_").replace("_", "-").lower().encode()
        secure = secure or found.get(forwarded, "").split(",")[0].strip() == value
    parsed = urlsplit(origin)
    if parsed.scheme not in DEFAULT_PORTS or not parsed.netloc:
        return False
    wanted = _origin_key(parsed.scheme, parsed.netloc)
    domain = split_domain_port(host.lower())[0]
    own = _origin_key("https" if secure else "http", host)
    if host and domain and validate_host(domain, allowed_hosts) and wanted == own:
        return True
    for trusted in trusted_origins:
        entry = urlsplit(trusted)
        if entry.scheme != parsed.scheme:
            continue
        if entry.netloc.startswith("*."):
            if is_same_domain(wanted[1], entry.netloc[1:]):
                return True
        elif _origin_key(entry.scheme, entry.netloc) == wanted:
            return True
    return False


class SameOriginValidator:
    """Deny (403 at the handshake) a websocket whose Origin `origin_allowed` refuses."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> Any:
        allowed = origin_allowed(
            scope.get("headers", []),
            secure=scope.get("scheme") == "wss",
            allowed_hosts=settings.ALLOWED_HOSTS,
            trusted_origins=settings.CSRF_TRUSTED_ORIGINS,
            proxy_ssl_header=getattr(settings, "SECURE_PROXY_SSL_HEADER", None),
        )
        if not allowed:
            return await WebsocketDenier()(scope, receive, send)
        return await self.app(scope, receive, send)


class RuntimeBinder:
    """Binds the server's event loop for the parts that live in it: embedded turns run
    on it, and the lease sweeper starts once per loop (every Daphne process)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> Any:
        loop = asyncio.get_running_loop()
        embedded_runner.bind(loop)
        if settings.LEASE_SWEEPER:
            watchdog.start_in_loop(loop)
        return await self.app(scope, receive, send)


application = RuntimeBinder(
    ProtocolTypeRouter(
        {
            "http": django_asgi_app,
            "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
        }
    )
)

if not settings.DISTRIBUTED:
    warm_for_serving()  # turns run in this process (embedded mode)
# Everything above is start-up: keep the collector from walking it again.
gc_tuning.tune_for_serving()
thread_switching.tune_for_serving()  # the loop waits less for the GIL
