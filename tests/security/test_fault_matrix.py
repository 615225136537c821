"""Upstream fault matrix: every fault a provider throws at us, ten times each, through the
real turn engine (embedded, in-process) against the fake Anthropic and OpenAI servers.

Faults: 429 with a short Retry-After, 429 with a Retry-After above the cap, 500, 502
(JSON, and a proxy's HTML page), 503, 529, a connection reset mid-stream, a truncated
stream, an error event after HTTP 200, and a slow drip whose whole reply takes longer
than the read timeout. For each turn we assert:

- zero unhandled exceptions: no ERROR record from any logger (the engine logs
  "turn ... crashed" for anything it did not expect), and never error kind `internal`;
- at most 3 HTTP attempts per model call (the fake counts requests; every turn here is
  one model call), and the retryable statuses are retried (transient ones recover);
- partial text kept: what streamed before a mid-stream fault is on `turn.partial_text`;
- a friendly error: `error_kind` and `error` set, in plain words (no JSON, no HTML, no
  traceback), naming what happened;
- the slow drip completes with its whole text.

Retries never really sleep: the router is built with a `Transport` whose `sleep`
records the delay instead, so the matrix runs in seconds and the recorded delays show
that a short Retry-After is honoured as given.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings

from openworker.runtime.agent.engine import run_turn
from providers.edge.matrix import curated_matrix
from providers.edge.secret_store import UserSecretStore
from providers.outbound import OutboundPolicy
from providers.router import ProviderRouter
from providers.transport import MAX_BACKOFF_SECONDS, Transport
from sessions import services
from sessions.models import Message, Session, Turn
from tests.fakes import (
    AnthropicMessagesFake,
    OpenAIChatFake,
    OpenAIResponsesFake,
    Reply,
    drip,
    error_event,
    http_error,
    pause,
    rate_limited,
    reset,
    text,
    truncate,
)
from tests.fakes.server import FakeServer
from tests.security.figures import record
from tests.support.chat import point_provider_at

pytestmark = pytest.mark.django_db(transaction=True)

# Each fault is played this many times per provider (the "x 10").
REPEATS = 10
# The transport's own default: 2 retries, so at most 3 HTTP attempts per model call.
MAX_ATTEMPTS = 3
# Short enough to honour, well under the transport's cap (30 s).
SHORT_RETRY_AFTER = 0.25
# Far above the cap: raised at once, the user is told when to try again.
LONG_RETRY_AFTER = 3600
# The slow drip: each event waits DRIP_SECONDS and the reply has DRIP_WORDS words plus
# the protocol's start and end events, so it lasts about 0.8 s against a read (idle)
# timeout of 0.3 s: the timeout is between reads, not for the whole reply. (Sequential:
# the in-memory SQLite test database locks under concurrent turns.)
DRIP_SECONDS = 0.08
DRIP_WORDS = 6
READ_TIMEOUT_SECONDS = 0.3
# A turn that takes longer than this is hung, not slow.
TURN_TIMEOUT_SECONDS = 20.0

DRIP_WORDS_SENT = [f"d{i} " for i in range(DRIP_WORDS)]
DRIP_TEXT = "".join(DRIP_WORDS_SENT)
PARTIAL = "Here is the first half of my answer, "
RECOVERED = "Recovered answer."
PROXY_PAGE = (
    "<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway"
    "</h1></center><hr><center>nginx</center></body></html>"
)
# Marks of a raw upstream payload leaking into what the user reads.
RAW_MARKS = re.compile(r"[{}<>]|Traceback|request_id|_error\b|HTTP \d{3}:")

# One provider per wire API the fakes speak: Anthropic Messages, OpenAI Responses, and
# Chat Completions (DeepSeek, like every OpenAI-compatible vendor).
PROVIDERS: dict[str, tuple[type[FakeServer], str]] = {
    "anthropic": (AnthropicMessagesFake, "anthropic:claude-test-1"),
    "openai": (OpenAIResponsesFake, "openai:gpt-test-1"),
    "deepseek": (OpenAIChatFake, "deepseek:deepseek-chat"),
}


@dataclass(frozen=True)
class Fault:
    """One row of the matrix: what the upstream does and what the user must end up with."""

    name: str
    # The replies for one turn; `transient` is the 0-based repeat index's parity: an even
    # repeat of a retryable status fails once and then answers.
    replies: Callable[[bool], list[Reply]]
    status: Callable[[bool], str]
    kinds: frozenset[str] = frozenset()
    attempts: Callable[[bool], int] = lambda _transient: 1
    partial: str = ""
    # Words the friendly message must contain (lower-cased), when the turn failed.
    says: tuple[str, ...] = ()
    retried_statuses: bool = False


def _persistent_or_transient(fault: Reply) -> Callable[[bool], list[Reply]]:
    """Transient: the fault once, then an answer. Persistent: the fault on every attempt,
    plus one spare that a fourth attempt would consume (and the test would see)."""

    def replies(transient: bool) -> list[Reply]:
        if transient:
            return [fault, Reply(text(RECOVERED))]
        return [fault] * (MAX_ATTEMPTS + 1)

    return replies


def _retryable(name: str, fault: Reply, kinds: set[str], says: tuple[str, ...]) -> Fault:
    return Fault(
        name=name,
        replies=_persistent_or_transient(fault),
        status=lambda transient: "completed" if transient else "failed",
        kinds=frozenset(kinds),
        attempts=lambda transient: 2 if transient else MAX_ATTEMPTS,
        says=says,
        retried_statuses=True,
    )


FAULTS: list[Fault] = [
    _retryable(
        "429_short_retry_after",
        Reply(rate_limited(SHORT_RETRY_AFTER)),
        {"rate_limited"},
        ("rate-limiting", "try again"),
    ),
    Fault(
        name="429_long_retry_after",
        replies=lambda _t: [Reply(rate_limited(LONG_RETRY_AFTER)), Reply(text(RECOVERED))],
        status=lambda _t: "failed",
        kinds=frozenset({"rate_limited"}),
        says=("rate-limiting", f"{LONG_RETRY_AFTER} s"),
    ),
    _retryable("500", Reply(http_error(500)), {"unavailable"}, ("provider",)),
    _retryable("502", Reply(http_error(502)), {"unavailable"}, ("provider",)),
    _retryable(
        "502_proxy_html", Reply(http_error(502, PROXY_PAGE)), {"unavailable"}, ("provider",)
    ),
    _retryable("503", Reply(http_error(503)), {"unavailable", "overloaded"}, ("provider",)),
    _retryable("529", Reply(http_error(529)), {"overloaded"}, ("overloaded",)),
    Fault(
        name="reset_mid_stream",
        # The pause lets the client read the text before the RST tears the socket down.
        replies=lambda _t: [Reply(text(PARTIAL), pause(0.1), reset())],
        status=lambda _t: "failed",
        kinds=frozenset({"stream"}),
        partial=PARTIAL,
        says=("broke off",),
    ),
    Fault(
        name="truncated",
        replies=lambda _t: [Reply(text(PARTIAL), truncate())],
        status=lambda _t: "failed",
        kinds=frozenset({"stream"}),
        partial=PARTIAL,
        says=("broke off",),
    ),
    Fault(
        name="error_after_200",
        replies=lambda _t: [Reply(text(PARTIAL), error_event("overloaded"))],
        status=lambda _t: "failed",
        # Anthropic's `overloaded_error` event keeps its kind; OpenAI's in-stream error
        # object has no type to match, so it is a broken stream that says "overloaded".
        kinds=frozenset({"overloaded", "stream"}),
        partial=PARTIAL,
        says=("overloaded",),
    ),
    Fault(
        name="slow_drip",
        replies=lambda _t: [Reply(drip(DRIP_SECONDS), *[text(w) for w in DRIP_WORDS_SENT])],
        status=lambda _t: "completed",
    ),
]


@dataclass
class Harness:
    """A fake upstream, the user's profile pointing at it, and a provider factory whose
    transports record their retry sleeps instead of sleeping."""

    fake: FakeServer
    model: str
    owner: Any
    sleeps: list[float] = field(default_factory=list)

    def factory(self, user_id: int) -> ProviderRouter:
        policy = OutboundPolicy.from_env(embedded=True)
        return ProviderRouter(
            UserSecretStore(user_id),
            matrix=curated_matrix(),
            embedded=True,
            default_provider=settings.DEFAULT_PROVIDER,
            transport_factory=lambda: Transport(
                policy=policy, read_timeout=READ_TIMEOUT_SECONDS, sleep=self.sleeps.append
            ),
        )

    def new_turn(self, prompt: str) -> Turn:
        """A queued turn with its user message, as `turn_start` records it (without handing
        it to a runner: the test runs it)."""
        session = Session.objects.create(owner=self.owner, model=self.model)
        turn = Turn.objects.create(session=session, model=self.model)
        services.message_append(
            session_id=session.pk,
            role="user",
            content=prompt,
            turn_id=turn.pk,
            dedupe_key=f"{turn.pk}:user",
        )
        return turn


@pytest.fixture(params=sorted(PROVIDERS))
def harness(request: pytest.FixtureRequest, owner: Any) -> Iterator[Harness]:
    fake_class, model = PROVIDERS[request.param]
    with fake_class(api_key="test-key") as fake:
        point_provider_at(owner, request.param, fake.base_url)
        yield Harness(fake=fake, model=model, owner=owner)


def _errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        f"{r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.levelno >= logging.ERROR or "crashed" in r.getMessage()
    ]


def _assert_friendly(turn: Turn, fault: Fault) -> None:
    assert turn.error_kind in fault.kinds, (fault.name, turn.error_kind, turn.error)
    assert turn.error, fault.name
    assert not RAW_MARKS.search(turn.error), (fault.name, turn.error)
    lowered = turn.error.lower()
    for words in fault.says:
        assert words in lowered, (fault.name, turn.error)


async def _run(harness: Harness, fault: Fault, repeat: int) -> Turn:
    transient = repeat % 2 == 0
    harness.fake.script.clear()
    harness.fake.push(*fault.replies(transient))
    before = len(harness.fake.requests)
    turn = await sync_to_async(harness.new_turn)(f"{fault.name} #{repeat}")
    await asyncio.wait_for(
        run_turn(str(turn.pk), provider_factory=harness.factory), TURN_TIMEOUT_SECONDS
    )
    attempts = len(harness.fake.requests) - before
    assert attempts <= MAX_ATTEMPTS, (fault.name, attempts)
    assert attempts == fault.attempts(transient), (fault.name, transient, attempts)
    return await _check(turn, fault, transient)


async def _check(turn: Turn, fault: Fault, transient: bool) -> Turn:
    await turn.arefresh_from_db()
    assert turn.status == fault.status(transient), (fault.name, turn.status, turn.error)
    assert turn.error_kind != "internal", (fault.name, turn.error)
    if turn.status == "failed":
        _assert_friendly(turn, fault)
        assert turn.partial_text == fault.partial, (fault.name, turn.partial_text)
        assert not await Message.objects.filter(turn=turn, role="assistant").aexists()
    else:
        reply = await Message.objects.aget(turn=turn, role="assistant")
        expected = RECOVERED if fault.retried_statuses else DRIP_TEXT
        assert reply.content == expected, (fault.name, reply.content)
        assert not turn.error_kind
    return turn


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
async def test_every_upstream_fault_ends_the_turn_cleanly_with_its_text_and_a_friendly_error(
    harness: Harness, fault: Fault, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    outcomes: dict[str, int] = {}
    turns = [await _run(harness, fault, repeat) for repeat in range(REPEATS)]
    for turn in turns:
        outcomes[turn.status] = outcomes.get(turn.status, 0) + 1
    assert _errors_logged(caplog) == []

    # Retry waits: a short Retry-After is honoured as given; nothing waits past the caps.
    assert all(0 <= s <= max(MAX_BACKOFF_SECONDS, SHORT_RETRY_AFTER) for s in harness.sleeps)
    if fault.name == "429_short_retry_after":
        assert harness.sleeps and set(harness.sleeps) == {SHORT_RETRY_AFTER}
    if not fault.retried_statuses:
        assert harness.sleeps == [], (fault.name, harness.sleeps)
    record(
        "faults.turns",
        REPEATS,
        "turns through the engine under upstream faults (11 faults x 10 x the Anthropic "
        "Messages, OpenAI Responses and Chat Completions fakes): zero unhandled "
        "exceptions, at most 3 HTTP attempts per model call, partial text kept, "
        "friendly errors",
    )
    if fault.partial:
        record("faults.partial_kept", REPEATS, "mid-stream faults whose partial text was kept")
    if fault.retried_statuses:
        record(
            "faults.recovered",
            outcomes.get("completed", 0),
            "transient retryable faults (429/5xx/529 once) that recovered by retry",
        )
    if fault.name == "slow_drip":
        record(
            "faults.slow_drip_completed",
            outcomes.get("completed", 0),
            f"slow-drip replies completed (each longer than the {READ_TIMEOUT_SECONDS:g} s "
            "read timeout)",
        )
