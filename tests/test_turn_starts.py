"""A burst of turn starts reads what its turns need together (`runtime.agent.starts`): the
model policy, the tools, the owners' profiles, the paths and the compaction state in a
few statements for the lot, each turn's answer the same as reading it alone; a refused
model fails only its own turn; and the turns starting at the same moment share one call
(`runtime.store.gather`). On SQLite here and on PostgreSQL in the distributed phase."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from openworker.runtime.agent import compactor, engine, starts
from openworker.runtime.agent.tools.mcp import session_registry
from openworker.runtime.store import claims, gather, turn_state
from providers.edge.matrix import curated_matrix
from providers.edge.model_policy import ModelRefused, model_decide_for_user_id
from providers.edge.models import MatrixModel, ProviderProfile
from providers.edge.secret_store import UserSecretStore, user_secret_stores
from sessions import selectors
from sessions.models import CompactionSettings, Session, Turn
from tests.support import burst
from tests.support.burst import run_a_burst_counting
from tests.support.chat import point_provider_at

pytestmark = pytest.mark.django_db(transaction=True)

CUSTOM = "anthropic:claude-test-1"
OFFERED = "anthropic:claude-offered-1"


def _org_key() -> None:
    profile = ProviderProfile(owner=None, provider="anthropic", base_url="https://org.invalid")
    profile.set_api_key("sk-org-key-0000")
    profile.save()


def _claimed(sessions: list[Session]) -> list[Turn]:
    """A queued turn per session, claimed as the worker claims them (with their session)."""
    ids = [str(Turn.objects.create(session=s, model=s.model).pk) for s in sessions]
    found = turn_state.turns_claim(turn_ids=ids, worker="test")
    return [found[turn_id] for turn_id in ids]


def _a_mixed_burst(owner: Any, teammate: Any) -> list[Turn]:
    """Turns of three users: one on a custom model with their own key, one on a custom
    model without one (refused), one on a curated model over the organisation's key."""
    _org_key()
    MatrixModel.objects.create(model_id=OFFERED, label="Offered", provider="anthropic")
    curated_matrix()
    point_provider_at(owner, "anthropic", "https://mine.invalid")
    carol = get_user_model().objects.create_user("carol", password=None)
    CompactionSettings.load()
    sessions = [
        Session.objects.create(owner=owner, model=CUSTOM, title="own key"),
        Session.objects.create(owner=teammate, model=CUSTOM, title="refused"),
        Session.objects.create(owner=carol, model=OFFERED, title="org key"),
        Session.objects.create(owner=owner, model=OFFERED, title="own key, curated"),
    ]
    return _claimed(sessions)


def _asks(turns: list[Turn]) -> list[starts.StartAsk]:
    return [starts.StartAsk(turn=t, read_tools=True, check_own_key=True) for t in turns]


def _secret(store: Any) -> Any:
    return store.get("provider:anthropic")


def test_a_burst_of_starts_reads_each_turns_answers_in_statements_for_the_lot(
    owner: Any, teammate: Any
) -> None:
    turns = _a_mixed_burst(owner, teammate)
    with CaptureQueriesContext(connection) as few:
        starts.turns_start(_asks(turns[:2]))
    with CaptureQueriesContext(connection) as more:
        got = starts.turns_start(_asks(turns))
    # The policy (two models), the MCP choices, the profiles, the paths, the compaction
    # state: as many statements for four turns as for two.
    assert len(more.captured_queries) == len(few.captured_queries) + 1  # a second model
    assert len(more.captured_queries) <= 6, [q["sql"][:80] for q in more.captured_queries]

    assert isinstance(got[1], ModelRefused) and "own anthropic key" in str(got[1])
    for turn, started in zip(turns, got, strict=True):
        owner_id = turn.session.owner_id
        alone = model_decide_for_user_id(user_id=owner_id, model=turn.model)
        if not alone.allowed:
            assert isinstance(started, ModelRefused)
            continue
        assert isinstance(started, starts.Started)
        assert started.decision == alone
        expected_tools = session_registry(session_id=turn.session_id, owner_id=owner_id)
        assert started.tools is not None
        assert started.tools.definitions() == expected_tools.definitions()
        path = selectors.turn_path(turn=turn)
        assert [m.pk for m in started.path] == [m.pk for m in path]
        cfg, state, reported = compactor.load_settings_and_state(turn.session_id, path)
        got_cfg, got_state, got_reported = started.compaction
        assert (got_state, got_reported) == (state, reported)
        assert [getattr(got_cfg, f) for f in compactor._SETTINGS] == [
            getattr(cfg, f) for f in compactor._SETTINGS
        ]
        secrets = UserSecretStore(owner_id, org_keys=alone.org_keys)
        assert _secret(started.provider._secrets) == _secret(secrets)  # type: ignore[attr-defined]
    # Each user's own key where the policy says so, the organisation's otherwise.
    assert _secret(got[0].provider._secrets)["base_url"] == "https://mine.invalid"  # type: ignore[union-attr]
    assert _secret(got[2].provider._secrets)["base_url"] == "https://org.invalid"  # type: ignore[union-attr]
    assert _secret(got[3].provider._secrets)["base_url"] == "https://mine.invalid"  # type: ignore[union-attr]


def test_profiles_read_together_equal_each_users_read_alone(owner: Any, teammate: Any) -> None:
    _org_key()
    point_provider_at(owner, "anthropic", "https://mine.invalid")
    point_provider_at(owner, "openai", "https://mine-too.invalid")
    wanted = [(owner.pk, True), (owner.pk, False), (teammate.pk, True), (teammate.pk, False)]
    with CaptureQueriesContext(connection) as queries:
        together = user_secret_stores(wanted)
    assert len(queries.captured_queries) == 1
    for (user_id, org_keys), store in zip(wanted, together, strict=True):
        alone = UserSecretStore(user_id, org_keys=org_keys)
        for provider in ("anthropic", "openai", "gemini"):
            assert store.get(f"provider:{provider}") == alone.get(f"provider:{provider}")
    assert together[3].get("provider:anthropic") is None  # no key of their own
    assert user_secret_stores([]) == []


def test_a_start_whose_provider_cannot_be_built_fails_alone(owner: Any, teammate: Any) -> None:
    turns = _a_mixed_burst(owner, teammate)

    def broken(owner_id: int) -> Any:
        raise RuntimeError("no provider today")

    asks = _asks(turns)
    asks[2] = starts.StartAsk(turn=turns[2], read_tools=False, check_own_key=False, factory=broken)
    got = starts.turns_start(asks)
    assert isinstance(got[2], RuntimeError)
    assert isinstance(got[0], starts.Started) and isinstance(got[3], starts.Started)
    assert got[0].tools is not None


def test_a_session_gone_before_its_start_fails_alone(owner: Any, teammate: Any) -> None:
    turns = _a_mixed_burst(owner, teammate)
    # Deleted between its claim and its start (its turn row goes with it).
    Session.objects.filter(pk=turns[3].session_id).delete()
    got = starts.turns_start(_asks(turns))
    assert isinstance(got[3], Session.DoesNotExist)
    assert isinstance(got[0], starts.Started)


# --- gathering -------------------------------------------------------------------------


def _hold_calls(monkeypatch: pytest.MonkeyPatch, batches: list[list[int]]) -> asyncio.Event:
    """The gatherer's database calls, recorded in `batches` and held until the event is
    set (they then run here, on the loop)."""
    gate = asyncio.Event()

    def gated_db(fn: Any, **_: Any) -> Any:
        async def run(items: list[int]) -> Any:
            batches.append(list(items))
            await gate.wait()
            return fn(items)

        return run

    monkeypatch.setattr(gather, "db", gated_db)
    return gate


def _gatherer_scenario(
    call: Any, asks: list[int], monkeypatch: pytest.MonkeyPatch
) -> tuple[list[list[int]], list[Any]]:
    """Ask `asks[0]` alone, then the rest while its call is held: the batches and outcomes."""
    batches: list[list[int]] = []

    async def scenario() -> list[Any]:
        gate = _hold_calls(monkeypatch, batches)
        gatherer: gather.Gatherer[int, str] = gather.Gatherer(call, max_batch=3)
        first = asyncio.ensure_future(gatherer.ask(asks[0]))
        while not batches:
            await asyncio.sleep(0)
        rest = [asyncio.ensure_future(gatherer.ask(item)) for item in asks[1:]]
        await asyncio.sleep(0)
        gate.set()
        return list(await asyncio.gather(first, *rest, return_exceptions=True))

    return batches, async_to_sync(scenario)()


def test_asks_made_while_a_call_runs_go_together_in_the_next_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def call(items: list[int]) -> list[Any]:
        return [ValueError(f"no {i}") if i == 4 else f"answer {i}" for i in items]

    batches, outcomes = _gatherer_scenario(call, [1, 2, 3, 4, 5, 6], monkeypatch)
    assert batches == [[1], [2, 3, 4], [5, 6]]  # at most max_batch per call
    assert outcomes[:3] == ["answer 1", "answer 2", "answer 3"]
    assert isinstance(outcomes[3], ValueError) and str(outcomes[3]) == "no 4"  # its own
    assert outcomes[4:] == ["answer 5", "answer 6"]


def test_a_failed_call_fails_every_ask_it_carried_and_not_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def call(items: list[int]) -> list[Any]:
        if 2 in items:
            raise RuntimeError("the database went away")
        return [f"answer {i}" for i in items]

    batches, outcomes = _gatherer_scenario(call, [1, 2, 3, 4, 5], monkeypatch)
    assert batches == [[1], [2, 3, 4], [5]]
    assert outcomes[0] == "answer 1" and outcomes[4] == "answer 5"
    assert all(isinstance(outcome, RuntimeError) for outcome in outcomes[1:4])


def test_an_answer_whose_asker_left_is_handed_back_to_be_released(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    released: list[str] = []
    batches: list[list[int]] = []

    async def scenario() -> tuple[str, bool]:
        gate = _hold_calls(monkeypatch, batches)
        gatherer: gather.Gatherer[int, str] = gather.Gatherer(
            lambda items: [f"answer {i}" for i in items], max_batch=10, abandoned=released.append
        )
        kept = asyncio.ensure_future(gatherer.ask(1))
        left = asyncio.ensure_future(gatherer.ask(2))
        while not batches:
            await asyncio.sleep(0)
        left.cancel()
        gate.set()
        return await kept, left.cancelled()

    assert async_to_sync(scenario)() == ("answer 1", True)
    assert batches == [[1, 2]]
    assert released == ["answer 2"]


def test_a_batchs_askers_are_woken_a_few_per_loop_iteration_in_order() -> None:
    # A hundred turns woken at once ran their next steps back to back while the loop's
    # streams waited: answers are handed back WAKE_PER_ITERATION per iteration.
    per = gather.WAKE_PER_ITERATION
    settled: list[int] = []
    seen_per_iteration: list[int] = []

    async def scenario() -> None:
        gather.settle_spread(list(range(3 * per + 1)), settled.append)
        seen_per_iteration.append(len(settled))
        while len(settled) < 3 * per + 1:
            await asyncio.sleep(0)
            seen_per_iteration.append(len(settled))

    async_to_sync(scenario)()
    assert settled == list(range(3 * per + 1))
    assert seen_per_iteration == [per, 2 * per, 3 * per, 3 * per + 1]


# --- the engine ------------------------------------------------------------------------


def test_turns_starting_together_share_their_claim_and_start_calls_and_all_answer(
    anthropic_fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = run_a_burst_counting(
        anthropic_fake,
        monkeypatch,
        owner_of_gatherer=engine,
        name="claim_starter",
        call=starts.turns_start_claimed,
        max_batch=claims.MAX_BATCH,
        make=lambda counting: claims.loop_claimers(
            lambda: claims.Claimer(start=counting, abandoned=starts.abandon_start)
        ),
    )
    assert sum(sizes) == burst.TURNS and len(sizes) < burst.TURNS, sizes


@pytest.mark.distributed
def test_a_burst_of_starts_reads_the_same_answers_on_postgresql(
    require_distributed: None, owner: Any, teammate: Any
) -> None:
    assert connection.vendor == "postgresql"
    turns = _a_mixed_burst(owner, teammate)
    got = starts.turns_start(_asks(turns))
    assert isinstance(got[1], ModelRefused)
    for turn, started in zip(turns, got, strict=True):
        if isinstance(started, starts.Started):
            path = selectors.turn_path(turn=turn)
            assert [m.pk for m in started.path] == [m.pk for m in path]
            assert started.decision == model_decide_for_user_id(
                user_id=turn.session.owner_id, model=turn.model
            )
