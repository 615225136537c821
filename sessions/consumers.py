"""The websocket of one chat session: `/ws/sessions/<id>/`.

Only the signed-in owner may connect; anyone else is closed before `accept()` so not
even the existence of the session leaks. Server events come from the session's
channel-layer group (see `sessions.events`).
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from sessions import events, selectors

# Application close codes (4000-4999 are ours): the page reacts to each differently.
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404


class SessionConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        session_id = self.scope["url_route"]["kwargs"]["session_id"]
        session = await database_sync_to_async(selectors.session_get_for_user)(
            session_id=session_id, user=user
        )
        if session is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.session_id = str(session.pk)
        self.group = events.session_group(self.session_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json({"type": "hello", "session": self.session_id})

    async def disconnect(self, code: int) -> None:
        group = getattr(self, "group", None)
        if group:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # The client protocol (send, stop, approve, resume) arrives with the turn engine.
        await self.send_json({"type": "error", "error": "unsupported message"})

    async def session_event(self, message: dict[str, Any]) -> None:
        await self.send_json(message["event"])
