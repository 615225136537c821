"""A turn's writes ride out a PostgreSQL hiccup: bounded retries with backoff.

A restart, a failover or a fast-stop of PostgreSQL drops every connection; without a
retry the write in flight (often the final save of a complete reply) failed the turn.
Every write retried here is idempotent by design: a step's message and a tool result
carry a dedupe key (`<turn>:a<n>`, `<turn>:tool:<call id>`), finishing a turn is a
conditional update on our lease and a new session's title is written only over an empty
one, so a write whose commit went through before the connection broke does nothing the
second time. Only errors of the connection kind are retried (an integrity error is a
bug, not a hiccup); past WRITE_RETRY_SECONDS the error goes to the engine, which fails
the turn (its partial text is on the turn row, flushed by the heartbeat).

tenacity rather than a hand-written loop: exponential backoff with jitter and a total
deadline, declared in one place, and the library is already well kept and widely used.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from django.db import InterfaceError, OperationalError, connection
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from openworker.runtime.store.dbcall import db
from openworker.runtime.store.gather import Answer, Ask, Gatherer

logger = logging.getLogger(__name__)

# Longer than a fast restart of PostgreSQL (a few seconds) and a pooled connection's
# replacement; short enough that a lasting outage ends the turn while the user waits.
WRITE_RETRY_SECONDS = 30.0
# First wait and cap between attempts (plus up to a second of jitter: many turns of one
# worker retrying at once should not arrive together).
FIRST_WAIT_SECONDS = 0.2
MAX_WAIT_SECONDS = 3.0

# The connection went away (OperationalError: server closed the connection, connection
# refused, the pool timed out) or Django holds a closed one (InterfaceError).
TRANSIENT = (OperationalError, InterfaceError)


def _fresh(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, after dropping this thread's connection if it is broken (the pool hands out
    a checked one)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()
        return fn(*args, **kwargs)

    return call


def _log_retry(name: str, state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    logger.warning(
        "database write %s failed (attempt %d), retrying: %r", name, state.attempt_number, error
    )


def _retrying(name: str) -> AsyncRetrying:
    return AsyncRetrying(
        retry=retry_if_exception_type(TRANSIENT),
        wait=wait_exponential_jitter(initial=FIRST_WAIT_SECONDS, max=MAX_WAIT_SECONDS, jitter=1),
        stop=stop_after_delay(WRITE_RETRY_SECONDS),
        before_sleep=functools.partial(_log_retry, name),
        reraise=True,
    )


async def write(fn: Callable[..., Any], /, **kwargs: Any) -> Any:
    """`await db(fn)(**kwargs)`, retried while the database is briefly away."""
    async for attempt in _retrying(getattr(fn, "__name__", "write")):
        with attempt:
            call = fn if attempt.retry_state.attempt_number == 1 else _fresh(fn)
            return await db(call)(**kwargs)
    raise AssertionError("unreachable")  # pragma: no cover - reraise=True re-raises


async def write_gathered(gatherer: Gatherer[Ask, Answer], ask: Ask, *, name: str) -> Answer:
    """`await gatherer.ask(ask)`, retried as `write` retries. A failed call fails its whole
    batch, and each asker asks again (in the next batch); the database thread re-checks
    its connection after a database error (`dbcall`), as `_fresh` does."""
    async for attempt in _retrying(name):
        with attempt:
            return await gatherer.ask(ask)
    raise AssertionError("unreachable")  # pragma: no cover - reraise=True re-raises
