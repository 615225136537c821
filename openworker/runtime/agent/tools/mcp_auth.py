"""A user's OAuth access token as an `httpx.Auth` for the MCP client: it signs each
request, renews the token shortly before its stated expiry, and once more when the server
answers 401 anyway (expired early, revoked access token), then re-sends the request.

No Django and no protocol here: `renew(stale)` is the caller's (it refreshes under a row
lock and stores the new tokens, so two calls of one user never spend one rotating
refresh token twice) and returns the new `(token, expires_at)`, or None when the grant is
gone; `refused` then tells the tool to ask the user to connect again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable

import httpx

# Renew when the token has less than this left: a call that starts just before the
# expiry must not reach the server with a token that dies on the way.
EXPIRY_MARGIN_SECONDS = 30

Renew = Callable[[str], Awaitable[tuple[str, float | None] | None]]


class UserTokenAuth(httpx.Auth):
    # The body is kept so the request can be sent again after a 401 and a renewal.
    requires_request_body = True

    def __init__(self, token: str, *, expires_at: float | None, renew: Renew) -> None:
        self._token = token
        self._expires_at = expires_at
        self._renew_with = renew
        self._lock = asyncio.Lock()
        self.refused = False

    def __repr__(self) -> str:
        return "UserTokenAuth(…)"

    def _expiring(self) -> bool:
        return (
            self._expires_at is not None and self._expires_at - EXPIRY_MARGIN_SECONDS < time.time()
        )

    async def _renew(self, stale: str) -> None:
        async with self._lock:
            if self._token != stale or self.refused:
                return  # another request of this connection renewed it meanwhile
            fresh = await self._renew_with(stale)
            if fresh is None:
                self.refused = True
                return
            self._token, self._expires_at = fresh

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        if self._expiring() and not self.refused:
            await self._renew(self._token)
        sent = self._token
        request.headers["Authorization"] = f"Bearer {sent}"
        response = yield request
        if response.status_code != 401 or self.refused:
            return
        await self._renew(sent)
        if self.refused:
            return
        request.headers["Authorization"] = f"Bearer {self._token}"
        yield request

    def sync_auth_flow(self, request: httpx.Request):  # type: ignore[no-untyped-def]
        raise RuntimeError("UserTokenAuth is for the async MCP client only")
