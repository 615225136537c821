"""ASGI entry point: HTTP to Django, websockets through origin and auth checks.

`AllowedHostsOriginValidator` refuses a socket whose Origin is not one of ALLOWED_HOSTS
(cross-site websocket hijacking); `AuthMiddlewareStack` resolves the signed-in user
from the session cookie; consumers close anonymous sockets themselves.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "openworker.settings")
# Django must be set up before anything imports models (the consumers do).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from openworker import gc_tuning  # noqa: E402
from openworker.runtime.turns import watchdog  # noqa: E402
from openworker.runtime.turns.runner import embedded_runner  # noqa: E402
from sessions.routing import websocket_urlpatterns  # noqa: E402


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
            "websocket": AllowedHostsOriginValidator(
                AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
            ),
        }
    )
)

# Everything above is start-up: keep the collector from walking it again.
gc_tuning.tune_for_serving()
