"""A burst of turn starts reads what its turns need together: one database call for the lot.

Before its first model call a turn needs its session's tools, the model policy's word,
its owner's provider profiles (decrypted, for the router), its path and the compaction
settings and state. Read turn by turn that was five statements and four trips to the
worker's one database thread per turn, and at K = 200 the last turns' starts queued there
for two seconds after their claims (docs/PERFORMANCE.md, session 10): under load each
statement also waits to take the GIL back from the streaming loop. Here the turns starting
together (those that ask while a call runs go in the next one) read all of it in one
call: one query for the sessions' MCP choices, one per model for the policy, one for
every owner's profiles and the organisation's (each decrypted once), one walk for every
path and one for the compaction settings and states. Each turn's provider is built
last, once every read is done, so a failed read leaves no connection open.

The engine's turns make these reads in the call that claims them (`claim_starter`,
`claims.Claimer`): a turn of a wave no longer waits in the database thread's queue a
second time between its claim and its start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from openworker.runtime.agent.compactor import SettingsAndState, load_settings_and_states
from openworker.runtime.agent.llm import router_for_user
from openworker.runtime.agent.tools.mcp import session_registries
from openworker.runtime.agent.tools.registry import ToolRegistry
from openworker.runtime.store.claims import Claimer, loop_claimers
from providers.base import ProviderClient
from providers.edge.matrix import curated_matrix
from providers.edge.model_policy import ModelDecision, ModelRefused, model_decide_many
from providers.edge.secret_store import user_secret_stores
from sessions import selectors
from sessions.models import Message, Turn

logger = logging.getLogger(__name__)

ProviderFactory = Callable[[int], ProviderClient]

# Turns per start call: the path walk's seeds and the IN lists stay small statements.
MAX_BATCH = 100
# Turns per claim-and-start call (`claim_starter`). Smaller than a claim's batch: such a
# call holds the database thread, and the GIL most of that time, for about a millisecond
# per turn, and a wave's claims behind it wait. At K = 1000 with 500 places, batches of
# 100 made the streams' p99 worse than separate claim and start calls in three paired
# runs out of three; batches of 25 halved the start and gave a lower p99 in two runs of
# four, equal in one (docs/PERFORMANCE.md, session 19).
CLAIM_START_BATCH = 25


@dataclass(frozen=True)
class StartAsk:
    turn: Turn
    # Read the session's tools (False when the caller brought its own registry).
    read_tools: bool
    # The model policy's own-key check (skipped for an injected provider, which brings
    # its own credentials).
    check_own_key: bool
    # None: the owner's router over their profiles; else the caller's factory (tests and
    # benchmarks), called with the owner's id.
    factory: ProviderFactory | None = None


@dataclass(frozen=True)
class StartWith:
    """What a turn's start needs besides the turn, given when it asks for its claim."""

    read_tools: bool
    check_own_key: bool
    factory: ProviderFactory | None = None


@dataclass(frozen=True)
class Started:
    decision: ModelDecision
    provider: ProviderClient
    tools: ToolRegistry | None
    # The turn's path and its compaction settings and state, for its first model call.
    path: list[Message]
    compaction: SettingsAndState


def turns_start(asks: list[StartAsk]) -> list[Started | Exception]:
    """What each turn of `asks` needs before its first model call, in order (runs on the
    database thread). A turn whose model the policy refuses gets ModelRefused; one whose
    provider cannot be built, that error; a failed read fails the lot."""
    owners = [ask.turn.session.owner_id for ask in asks]
    decisions = _decisions(asks, owners)
    wanted_tools = [i for i, ask in enumerate(asks) if ask.read_tools]
    registries = dict(
        zip(
            wanted_tools,
            session_registries([(asks[i].turn.session_id, owners[i]) for i in wanted_tools]),
            strict=True,
        )
    )
    routed = [i for i, ask in enumerate(asks) if ask.factory is None and decisions[i].allowed]
    stores = dict(
        zip(
            routed,
            user_secret_stores([(owners[i], decisions[i].org_keys) for i in routed]),
            strict=True,
        )
    )
    matrix = curated_matrix() if routed else None
    paths = selectors.turn_paths(turns=[ask.turn for ask in asks])
    compactions = load_settings_and_states(
        [(ask.turn.session_id, path) for ask, path in zip(asks, paths, strict=True)]
    )
    # Last: nothing can fail once a provider holds a connection.
    out: list[Started | Exception] = []
    for i, ask in enumerate(asks):
        decision, compaction = decisions[i], compactions[i]
        if not decision.allowed:
            out.append(ModelRefused(decision.reason))
            continue
        if isinstance(compaction, Exception):
            out.append(compaction)
            continue
        try:
            if ask.factory is not None:
                provider = ask.factory(owners[i])
            else:
                provider = router_for_user(
                    owners[i], org_keys=decision.org_keys, store=stores[i], matrix=matrix
                )
        except Exception as exc:
            out.append(exc)
            continue
        out.append(Started(decision, provider, registries.get(i), paths[i], compaction))
    return out


def turns_start_claimed(claimed: list[tuple[Turn, StartWith]]) -> list[Started | Exception]:
    """`turns_start` of turns just claimed, with what their askers gave (runs on the
    database thread, in the claim's call)."""
    return turns_start(
        [
            StartAsk(turn, start.read_tools, start.check_own_key, start.factory)
            for turn, start in claimed
        ]
    )


def _decisions(asks: list[StartAsk], owners: list[int]) -> list[ModelDecision]:
    """The model policy's decisions in order: one query per model for each setting of the
    own-key check in the batch (in practice one)."""
    decisions: list[ModelDecision | None] = [None] * len(asks)
    for check in (True, False):
        picked = [i for i, ask in enumerate(asks) if ask.check_own_key is check]
        found = model_decide_many(
            [(owners[i], asks[i].turn.model) for i in picked], check_own_key=check
        )
        for i, decision in zip(picked, found, strict=True):
            decisions[i] = decision
    return [decision for decision in decisions if decision is not None]


def abandon_start(started: Started) -> None:
    """A start whose turn left while it was read (cancelled): close its provider."""
    task = asyncio.get_running_loop().create_task(_close(started.provider))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


async def _close(provider: ProviderClient) -> None:
    try:
        await provider.aclose()
    except Exception:
        logger.warning("closing an abandoned start's provider failed", exc_info=True)


_closing: set[asyncio.Task[None]] = set()

# The running event loop's claimer that starts what it claims, in the same database call:
# `claim_starter().claim(turn_id, StartWith(...))`, the answer's `started` being the
# turn's `Started` or the exception its start raised.
claim_starter = loop_claimers(
    lambda: Claimer(start=turns_start_claimed, abandoned=abandon_start, max_batch=CLAIM_START_BATCH)
)
