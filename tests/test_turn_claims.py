"""Turn starts claim their turns in batches (`openworker.runtime.store.claims`): the turns
starting together take one UPDATE and one read-back, each turn is claimed once, and a
failed claim call fails every start that waited on it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection
from django.test.utils import CaptureQueriesContext

from openworker.runtime.store import claims, turn_state
from sessions.models import Session, Turn

pytestmark = pytest.mark.django_db(transaction=True)


def _queued_turns(owner: Any, n: int) -> list[str]:
    """`n` queued turns, one per session (as many users' sends would leave them)."""
    ids = []
    for index in range(n):
        session = Session.objects.create(
            owner=owner, model="anthropic:claude-test-1", title=f"s{index}"
        )
        ids.append(str(Turn.objects.create(session=session, model=session.model).pk))
    return ids


def _claim_together(turn_ids: list[str]) -> list[claims.Claim | None]:
    async def together() -> list[claims.Claim | None]:
        claimer = claims.Claimer()
        return list(await asyncio.gather(*(claimer.claim(turn_id) for turn_id in turn_ids)))

    return async_to_sync(together)()


def test_turns_starting_together_are_claimed_in_one_update_and_one_read(owner: Any) -> None:
    ids = _queued_turns(owner, 5)
    with CaptureQueriesContext(connection) as queries:
        claimed = _claim_together(ids)
    statements = [q["sql"].split()[0].upper() for q in queries.captured_queries]
    assert statements == ["UPDATE", "SELECT"], statements
    assert [c.turn.pk for c in claimed if c] == [Turn.objects.get(pk=i).pk for i in ids]
    owners = {c.worker for c in claimed if c}
    assert len(owners) == 1
    for claim in claimed:
        assert claim is not None
        turn = Turn.objects.get(pk=claim.turn.pk)
        assert (turn.status, turn.lease_owner, turn.attempts) == ("running", claim.worker, 1)
        # The session came with the read-back: no query to reach it.
        with CaptureQueriesContext(connection) as more:
            assert claim.turn.session.owner_id == owner.pk
        assert not more.captured_queries


def test_a_turn_asked_for_twice_in_one_batch_is_claimed_once(owner: Any) -> None:
    (turn_id,) = _queued_turns(owner, 1)
    first, second = _claim_together([turn_id, turn_id])
    assert first is not None and first.turn.pk == Turn.objects.get(pk=turn_id).pk
    assert second is None


def test_a_turn_no_longer_queued_is_not_claimed_and_the_others_are(owner: Any) -> None:
    running, finished, queued = _queued_turns(owner, 3)
    assert turn_state.turn_claim(turn_id=running, worker="elsewhere") is not None
    Turn.objects.filter(pk=finished).update(status=Turn.Status.CANCELLED)
    got = _claim_together([running, finished, queued])
    assert got[0] is None and got[1] is None
    assert got[2] is not None and str(got[2].turn.pk) == queued
    # The other worker's lease is untouched.
    assert Turn.objects.get(pk=running).lease_owner == "elsewhere"


def test_claims_asked_while_a_claim_runs_go_together_in_the_next_call(
    owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _queued_turns(owner, 4)
    batches: list[list[str]] = []

    async def scenario() -> list[claims.Claim | None]:
        gate = asyncio.Event()

        def gated_db(fn: Any, **_: Any) -> Any:
            async def call(**kwargs: Any) -> Any:
                batches.append([str(i) for i in kwargs["turn_ids"]])
                await gate.wait()
                return await sync_to_async(fn)(**kwargs)

            return call

        monkeypatch.setattr(claims, "db", gated_db)
        claimer = claims.Claimer()
        first = asyncio.ensure_future(claimer.claim(ids[0]))
        while not batches:
            await asyncio.sleep(0)
        rest = [asyncio.ensure_future(claimer.claim(turn_id)) for turn_id in ids[1:]]
        await asyncio.sleep(0)
        gate.set()
        return list(await asyncio.gather(first, *rest))

    got = async_to_sync(scenario)()
    assert batches == [ids[:1], ids[1:]]
    assert all(claim is not None for claim in got)
    assert got[0].worker != got[1].worker  # type: ignore[union-attr]


def test_a_failed_claim_call_fails_every_start_that_waited_on_it(
    owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _queued_turns(owner, 3)

    def broken(**_: Any) -> dict[str, Turn]:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(turn_state, "turns_claim", broken)

    async def together() -> list[Any]:
        claimer = claims.Claimer()
        return list(await asyncio.gather(*(claimer.claim(i) for i in ids), return_exceptions=True))

    outcomes = async_to_sync(together)()
    assert all(isinstance(outcome, RuntimeError) for outcome in outcomes)
    assert set(Turn.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"queued"}


# --- a claimer that starts what it claims (the engine's: `agent.starts.claim_starter`) ---


def _claim_and_start_together(
    turn_ids: list[str], start: Any, abandoned: Any = None
) -> list[claims.Claim | None]:
    async def together() -> list[claims.Claim | None]:
        claimer = claims.Claimer(start=start, abandoned=abandoned)
        asks = [claimer.claim(turn_id, f"with {n}") for n, turn_id in enumerate(turn_ids)]
        return list(await asyncio.gather(*asks))

    return async_to_sync(together)()


def test_a_starting_claimer_starts_the_turns_it_took_in_the_claims_own_call(
    owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken, finished, other = _queued_turns(owner, 3)
    Turn.objects.filter(pk=finished).update(status=Turn.Status.CANCELLED)
    calls: list[str] = []
    real_db = claims.db

    def counting_db(fn: Any, **kwargs: Any) -> Any:
        calls.append(fn.__name__)
        return real_db(fn, **kwargs)

    monkeypatch.setattr(claims, "db", counting_db)
    started: list[list[tuple[str, str, str]]] = []

    def start(claimed: list[tuple[Turn, str]]) -> list[str]:
        # On the database thread, after the claim: the turns are already running.
        started.append([(str(turn.pk), turn.status, given) for turn, given in claimed])
        return [f"started {turn.pk}" for turn, _given in claimed]

    got = _claim_and_start_together([taken, finished, other], start)
    assert calls == ["turns_claim_and_start"]
    # Only the turns taken are started, each with what its own asker gave.
    assert started == [[(taken, "running", "with 0"), (other, "running", "with 2")]]
    assert got[1] is None
    assert got[0] is not None and got[0].started == f"started {taken}"
    assert got[2] is not None and got[2].started == f"started {other}"


def test_a_start_that_fails_as_a_whole_fails_each_turns_start_but_keeps_the_claims(
    owner: Any,
) -> None:
    ids = _queued_turns(owner, 2)

    def start(claimed: list[tuple[Turn, str]]) -> list[str]:
        raise RuntimeError("the policy's table went away")

    got = _claim_and_start_together(ids, start)
    for claim in got:
        assert claim is not None
        assert isinstance(claim.started, RuntimeError)
    # The claims stand: each turn's run reports its failed start and ends the turn.
    assert set(Turn.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"running"}


def test_a_start_whose_asker_left_while_it_was_made_is_handed_to_abandoned(
    owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    (turn_id,) = _queued_turns(owner, 1)
    abandoned: list[str] = []

    async def scenario() -> None:
        gate = asyncio.Event()
        real_db = claims.db

        def gated_db(fn: Any, **_: Any) -> Any:
            async def call(**kwargs: Any) -> Any:
                await gate.wait()
                return await real_db(fn)(**kwargs)

            return call

        monkeypatch.setattr(claims, "db", gated_db)
        claimer = claims.Claimer(
            start=lambda claimed: [f"provider of {turn.pk}" for turn, _ in claimed],
            abandoned=abandoned.append,
        )
        asker = asyncio.ensure_future(claimer.claim(turn_id, "with"))
        await asyncio.sleep(0)
        asker.cancel()  # the turn's task is stopped while the claim's call runs
        gate.set()
        for _ in range(500):  # the claim's call and the spread settling, well within 5 s
            if abandoned:
                break
            await asyncio.sleep(0.01)

    async_to_sync(scenario)()
    assert abandoned == [f"provider of {Turn.objects.get(pk=turn_id).pk}"]


def test_a_starting_claimer_refuses_a_claim_without_its_start_and_a_plain_one_with_one() -> None:
    async def scenario() -> None:
        with pytest.raises(ValueError):
            await claims.Claimer(start=lambda claimed: []).claim("turn")
        with pytest.raises(ValueError):
            await claims.Claimer().claim("turn", "with")

    asyncio.run(scenario())
