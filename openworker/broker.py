"""kombu's Redis transport, made to survive a Redis restart under a running turn.

With `acks_late`, a worker that loses its Redis connection while a turn runs closes the
broken connection (Celery 5.7, `on_connection_error_after_connected`): kombu first
detaches the transport from its connection (`transport.client = None`), then closing
the channel tries to restore the unacknowledged turn task, which needs a Redis client,
whose parameters are read from that detached connection: `AttributeError: 'NoneType'
object has no attribute 'hostname'`. The error is not a connection error, so it escapes
and the worker exits ("Unrecoverable error") with every later task left queued. The
turn's own late ack fails the same way.

Here a channel whose transport is detached neither restores nor acks: it cannot reach
Redis. Nothing is lost by that. If Redis kept its data, the message stays in kombu's
unacked set and is redelivered after the visibility timeout; either way the database
decides whether the turn must run (the lease sweeper hands a stranded queued turn over
again, `turn_claim` makes a duplicate a no-op, and a turn still running on this worker
carries on and commits). Selected by `CELERY_BROKER_TRANSPORT` in settings.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis as kombu_redis

logger = logging.getLogger(__name__)


def _detached(channel: Any) -> bool:
    transport = getattr(channel, "connection", None)
    return transport is None or getattr(transport, "client", None) is None


class QoS(kombu_redis.QoS):
    def restore_unacked(self, client: Any = None) -> None:
        if client is None and _detached(self.channel):
            if self._delivered:
                logger.warning(
                    "broker connection closed: %d unacknowledged task(s) left to the "
                    "visibility timeout and the turn sweeper",
                    len(self._delivered),
                )
            self._delivered.clear()
            return
        super().restore_unacked(client)

    def ack(self, delivery_tag: Any) -> None:
        if _detached(self.channel):
            # The channel this task came on is gone: its ack cannot reach Redis.
            self._delivered.pop(delivery_tag, None)
            return
        super().ack(delivery_tag)

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        if _detached(self.channel):
            self._delivered.pop(delivery_tag, None)
            return
        super().reject(delivery_tag, requeue=requeue)


class Channel(kombu_redis.Channel):
    QoS = QoS


class Transport(kombu_redis.Transport):
    Channel = Channel
