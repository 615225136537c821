"""Publishing session events to the channel layer.

Events are small JSON dicts with a `type`; they travel to every socket of the session
through one channel-layer group. Publish only after the transaction that made the event
true has committed (`transaction.on_commit`), so a browser never sees a message the
database does not have.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

# Consumers join this group; the handler name is the `type` of the channel message.
GROUP_MESSAGE_TYPE = "session.event"


def session_group(session_id: object) -> str:
    # Group names allow only ASCII alphanumerics, hyphens, underscores and periods.
    return f"session.{session_id}"


async def apublish(session_id: object, event: dict[str, Any]) -> None:
    layer = get_channel_layer()
    await layer.group_send(session_group(session_id), {"type": GROUP_MESSAGE_TYPE, "event": event})


def publish(session_id: object, event: dict[str, Any]) -> None:
    async_to_sync(apublish)(session_id, event)


def publish_many(notices: list[tuple[object, dict[str, Any]]]) -> None:
    """`publish` of many (session, event) notices in one hop to the event loop (a batch
    of sends: `runtime.turns.commands.turns_send`), queued together."""
    if notices:
        async_to_sync(_apublish_many)(notices)


async def _apublish_many(notices: list[tuple[object, dict[str, Any]]]) -> None:
    await asyncio.gather(*(publish_soon(session_id, event) for session_id, event in notices))


def publish_soon(session_id: object, event: dict[str, Any]) -> Awaitable[None]:
    """Queue a publish now, in call order, and return what to await for its outcome.

    The turn emitter's hot path: the distributed layer queues the PUBLISH on its
    round-trip batcher without a task per event; any other layer gets a task (tasks
    start in creation order, so the order holds there too).
    """
    layer = get_channel_layer()
    message = {"type": GROUP_MESSAGE_TYPE, "event": event}
    send_nowait = getattr(layer, "group_send_nowait", None)
    if send_nowait is not None:
        return send_nowait(session_group(session_id), message)
    return asyncio.ensure_future(apublish(session_id, event))


# `publish_soon` with no outcome to await: (session id, event, called with the error if it
# fails).
QuietPublish = Callable[[object, dict[str, Any], Callable[[BaseException], None]], None]


def quiet_publisher() -> QuietPublish | None:
    """The layer's publish that returns nothing to await, when it has one (the distributed
    layer's `group_send_quiet`): the turn emitter's deltas, thousands a second, without a
    future each. `published_settled()` waits for what it queued."""
    send_quiet = getattr(get_channel_layer(), "group_send_quiet", None)
    if send_quiet is None:
        return None

    def publish(
        session_id: object, event: dict[str, Any], on_error: Callable[[BaseException], None]
    ) -> None:
        message = {"type": GROUP_MESSAGE_TYPE, "event": event}
        send_quiet(session_group(session_id), message, on_error)

    return publish


async def published_settled() -> None:
    """Return once every publish this loop queued before has its outcome."""
    settled = getattr(get_channel_layer(), "settled", None)
    if settled is not None:
        await settled()


def user_group(user_id: object) -> str:
    """Every socket of one user (closing them on sign-out or deactivation)."""
    return f"user.{user_id}"


USER_MESSAGE_TYPE = "user.event"


async def apublish_user(user_id: object, event: dict[str, Any]) -> None:
    layer = get_channel_layer()
    await layer.group_send(user_group(user_id), {"type": USER_MESSAGE_TYPE, "event": event})


def publish_user(user_id: object, event: dict[str, Any]) -> None:
    async_to_sync(apublish_user)(user_id, event)
