"""A burst of turns run together on one event loop, a gathered database call's batches
counted: how the calls that `runtime.store.gather` batches are tested end to end."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from openworker.runtime.agent import engine
from openworker.runtime.store import gather
from openworker.runtime.turns import commands, runner
from sessions import selectors
from sessions.models import Turn
from tests.fakes import Reply, text
from tests.support.chat import users_with_a_session

TURNS = 8
MODEL = "anthropic:claude-test-1"


def run_a_burst_counting(
    fake: Any,
    monkeypatch: pytest.MonkeyPatch,
    *,
    owner_of_gatherer: Any,
    name: str,
    call: Callable[[list[Any]], list[Any]],
    max_batch: int,
    make: Callable[[Callable[[list[Any]], list[Any]]], Any] | None = None,
) -> list[int]:
    """`TURNS` users send at once and their turns run together, with
    `owner_of_gatherer.<name>` (a `gather.PerLoop`, or what `make` builds over a batch
    function) replaced by one over `call` that records each batch's size; every turn
    must complete with its own reply. Returns the batch sizes."""
    pairs = users_with_a_session(TURNS, fake.base_url, prefix="burst", model=MODEL)
    for index in range(TURNS):
        fake.push(Reply(text(f"Reply {index}.")))
    monkeypatch.setattr(runner, "_dispatch", lambda turn_ids: None)
    turn_ids = [
        str(commands.turn_send(session=session, user=user, text="hello").pk)
        for user, session in pairs
    ]
    sizes: list[int] = []

    def counting(asks: list[Any]) -> list[Any]:
        sizes.append(len(asks))
        return call(asks)

    if make is None:
        counted = gather.PerLoop(lambda: gather.Gatherer(counting, max_batch=max_batch))
    else:
        counted = make(counting)
    monkeypatch.setattr(owner_of_gatherer, name, counted)

    async def together() -> None:
        await asyncio.gather(*(engine.run_turn(turn_id) for turn_id in turn_ids))

    async_to_sync(together)()
    statuses = set(Turn.objects.filter(pk__in=turn_ids).values_list("status", flat=True))
    assert statuses == {"completed"}
    replies = sorted(
        m.content
        for tid in turn_ids
        for m in selectors.turn_path(turn=Turn.objects.get(pk=tid))
        if m.role == "assistant"
    )
    assert replies == sorted(f"Reply {i}." for i in range(TURNS))
    return sizes
