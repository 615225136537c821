"""The turn engine: `run_turn(turn_id)`, the agent loop the runtime owns.

One coroutine for both run modes. It claims the turn's lease, then loops: load the
canonical history, build the outbound view for the active model, read the provider's
stream on the event loop (`astream`: no thread per turn), publish coalesced deltas,
persist the assistant
message when it completes, run the tool calls (pausing for approval where a tool's
policy is `ask`), until the model answers without tool calls or the step limit is hit.

Faults: a heartbeat renews the lease every second and carries the partial text (the
process's `LeaseKeeper` beats for all its turns in one database call); losing
the lease stops the turn silently (someone else decided its fate); Stop cancels the
upstream request through the `CancelToken` and keeps what was streamed; provider errors
end the turn failed with the friendly message. Every write is idempotent per step, so a
retried or redelivered turn never duplicates a message.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.conf import settings

from openworker.runtime.agent import history as outbound_history
from openworker.runtime.agent import titles
from openworker.runtime.agent.compactor import SettingsAndState, maybe_compact
from openworker.runtime.agent.degradation import degradation_note
from openworker.runtime.agent.llm import router_for_user
from openworker.runtime.agent.starts import (
    ProviderFactory,
    Started,
    StartWith,
    abandon_start,
    claim_starter,
)
from openworker.runtime.agent.tools.base import ToolContext, ToolResult
from openworker.runtime.agent.tools.fetch_url import tool_outbound_policy
from openworker.runtime.agent.tools.registry import ToolRegistry
from openworker.runtime.live import events
from openworker.runtime.live.emitter import TurnEmitter
from openworker.runtime.live.replay import get_replay_buffer
from openworker.runtime.store import dbretry, step_commits, turn_state
from openworker.runtime.store.dbcall import db as _db
from openworker.runtime.store.leases import Lease, lease_keeper
from openworker.runtime.store.local_cancel import register_local, unregister_local
from openworker.runtime.store.priority_pool import AFTER_EVERY_TURN, call_priority, next_arrival
from providers.base import ProviderClient
from providers.cancel import CancelToken
from providers.edge.model_policy import ModelRefused, model_decide_for_user_id
from providers.errors import ProviderError, RequestCancelled, StreamError
from providers.types import AssistantTurn, StreamChunk, TokenUsage, ToolCall
from sessions import selectors, services
from sessions.models import Message, ToolPolicy, Turn

logger = logging.getLogger(__name__)


class LeaseLost(Exception):
    """The turn is no longer ours (swept as interrupted, or stopped and finished)."""


@dataclass
class _Progress:
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)

    @property
    def partial_text(self) -> str:
        return "".join(self.text)

    @property
    def partial_reasoning(self) -> str:
        return "".join(self.reasoning)

    def reset(self) -> None:
        self.text.clear()
        self.reasoning.clear()


async def run_turn(
    turn_id: str,
    *,
    provider_factory: ProviderFactory | None = None,
    tools: ToolRegistry | None = None,
    on_final: Callable[[], None] | None = None,
) -> None:
    """Run one turn to a terminal state (or to awaiting approval). Safe to call twice:
    only the caller that claims the queued turn runs it. `on_final()` is called once the
    turn's status is final, before a new session's title is made (admission: the place
    goes to a waiting turn without waiting for the title call)."""
    # Every database call of this turn queues by the turn's arrival (priority_pool).
    call_priority.set(next_arrival())
    # The model policy is checked against keys only when the router resolves them: an
    # injected provider (tests, benchmarks) brings its own credentials.
    start_with = StartWith(
        read_tools=tools is None, check_own_key=provider_factory is None, factory=provider_factory
    )
    # The turn's last event number is read from its replay buffer while the claim's call
    # runs: a turn of a wave waited for the two one after the other on a busy loop.
    last_seq = asyncio.ensure_future(get_replay_buffer().last_seq(str(turn_id)))
    try:
        # Claimed and started together with the other turns starting now: one database
        # call for a burst, which also reads what the first model call needs (`starts`).
        claimed = await claim_starter().claim(turn_id, start_with)
    except BaseException:
        _drop(last_seq)
        raise
    if claimed is None:
        _drop(last_seq)
        logger.info("turn %s not claimable (already running or finished)", turn_id)
        return
    run = _TurnRun(claimed.turn, claimed.worker, provider_factory or router_for_user, tools)
    run.check_own_key = start_with.check_own_key
    run.started = claimed.started
    run.last_seq = last_seq
    run.on_final = on_final
    await run.run()


def _drop(read: asyncio.Future[Any]) -> None:
    """A read no longer wanted: cancelled, or its failure taken (never logged as lost)."""
    read.cancel()
    read.add_done_callback(lambda done: done.cancelled() or done.exception())


class _TurnRun:
    def __init__(
        self,
        turn: Turn,
        me: str,
        provider_factory: ProviderFactory,
        tools: ToolRegistry | None,
    ) -> None:
        self.turn = turn
        self.turn_id = str(turn.pk)
        self.step_continuation = ""
        self.session = turn.session
        self.me = me
        self.provider_factory = provider_factory
        # None until the turn starts: then the built-in tools plus the MCP servers' tools
        # this session uses (`_start`).
        self.tools: ToolRegistry = tools  # type: ignore[assignment]
        self.tools_given = tools is not None
        self.cancel = CancelToken()
        self.progress = _Progress()
        self.lease_lost = False
        self.noted = False
        self.emitter: TurnEmitter | None = None
        # The status the last step's commit already wrote (it finishes a completed turn
        # in the same transaction as its message), and the messages a title is made of.
        self.committed_status: str | None = None
        self.exchange: list[Message] = []
        self.totals = turn_state.StepTotals(
            usage=dict(turn.usage or {}) or None, steps=turn.steps, cost=turn.cost
        )
        self.check_own_key = True
        self.on_final: Callable[[], None] | None = None
        # Whether this turn's router may use the organisation's keys (the model policy),
        # and the policy's answer per model this turn used (decided once per turn).
        self.org_keys = True
        self.allowed: dict[str, bool] = {}
        # Set when TURN_TIME_LIMIT_SECONDS ran out: the cancel that follows is a failure.
        self.timed_out = False
        # What the start read for the first model call: its path, and the compaction
        # settings and state for that path (later steps read their own).
        self.first_path: list[Message] | None = None
        self.first_compaction: SettingsAndState | None = None
        # What the claim's call read for the start (`starts.Started`), or the exception
        # it raised (`ModelRefused`: the policy refused the turn's model).
        self.started: Started | Exception | None = None
        # The replay buffer's last event number for this turn, read as it was claimed.
        self.last_seq: Awaitable[int] | None = None

    # --- lifecycle -----------------------------------------------------------------

    async def run(self) -> None:
        # The lease first: the claim started its clock, and what follows waits its turn on
        # the loop and the database thread (a burst's starts waited past LEASE_SECONDS
        # on a slow machine, and the sweeper interrupted them).
        register_local(self.turn_id, self.cancel)
        keeper = lease_keeper()
        keeper.hold(
            Lease(
                turn_id=self.turn_id,
                worker=self.me,
                partials=lambda: (self.progress.partial_text, self.progress.partial_reasoning),
                on_lost=self._lease_lost,
                on_cancel=self.cancel.cancel,
            )
        )
        buffer = get_replay_buffer()
        try:
            start_seq = await (self.last_seq or buffer.last_seq(self.turn_id))
        except Exception:
            logger.warning("replay buffer unavailable for turn %s", self.turn_id, exc_info=True)
            start_seq = 0
        except BaseException:
            keeper.release(self.turn_id)
            unregister_local(self.turn_id)
            self._abandon_start()
            raise
        self.emitter = TurnEmitter(
            session_id=str(self.session.pk),
            turn_id=self.turn_id,
            buffer=buffer,
            start_seq=start_seq,
            coalesce_seconds=settings.STREAM_COALESCE_SECONDS,
        )
        status = Turn.Status.FAILED
        provider: ProviderClient | None = None
        try:
            # Not waited for: the model call's request goes out at once, and what the
            # turn sends next is queued after this status.
            self.emitter.emit_soon("turn.status", status=Turn.Status.RUNNING, model=self.turn.model)
            # The one model policy, before any model call of the turn (a send, a retry,
            # an imported session's model): refused, the turn fails saying why. Decided
            # once per turn, with the router, the session's tools and the first call's
            # path in one database call shared with the turns starting now (`starts`).
            try:
                provider = self._start()
            except ModelRefused as exc:
                status = Turn.Status.FAILED
                await self._finish(status, "model_refused", str(exc))
                return
            status, kind, error = await self._loop_within_time_limit(provider)
            await self._finish(status, kind, error)
            if status == Turn.Status.COMPLETED and not self.session.title:
                if self.on_final is not None:
                    self.on_final()
                await self._title(provider)
        except LeaseLost:
            logger.info("turn %s: lease lost, stopping", self.turn_id)
        except asyncio.CancelledError:
            # Embedded shutdown: keep what we have and say so.
            status = Turn.Status.INTERRUPTED
            await asyncio.shield(
                self._finish(status, "interrupted", "The server stopped while this reply ran.")
            )
            raise
        except Exception:
            logger.exception("turn %s crashed", self.turn_id)
            await self._finish(Turn.Status.FAILED, "internal", "Something went wrong on our side.")
        finally:
            if provider is None and isinstance(self.started, Started):
                provider = self.started.provider  # the run ended before its start
                self.started = None
            if provider is not None:
                try:
                    await provider.aclose()
                except Exception:
                    logger.warning("closing the provider failed", exc_info=True)
            keeper.release(self.turn_id)
            unregister_local(self.turn_id)
            await self.emitter.close()
            if status != Turn.Status.AWAITING_APPROVAL:
                try:
                    await buffer.finish(self.turn_id)
                except Exception:
                    logger.warning("replay buffer finish failed", exc_info=True)

    async def _loop_within_time_limit(self, provider: ProviderClient) -> tuple[str, str, str]:
        """The agent loop under the turn's wall-clock limit, enforced here (Celery's threads
        pool enforces no task time limit): when it runs out, the CancelToken closes the
        upstream request as Stop does, what was streamed is kept, and the turn fails."""
        limit = settings.TURN_TIME_LIMIT_SECONDS
        timer = asyncio.get_running_loop().call_later(limit, self._time_up)
        try:
            status, kind, error = await self._loop(provider)
        finally:
            timer.cancel()
        if self.timed_out and status == Turn.Status.CANCELLED:
            amount, unit = (limit // 60, "minute") if limit % 60 == 0 else (limit, "second")
            took = f"{amount} {unit}{'s' if amount != 1 else ''}"
            return (
                Turn.Status.FAILED,
                "time_limit",
                f"This reply ran longer than the {took} a reply may take and was stopped; "
                "what it wrote so far is kept. Send a message to continue.",
            )
        return status, kind, error

    def _time_up(self) -> None:
        logger.info("turn %s reached its time limit", self.turn_id)
        self.timed_out = True
        self.cancel.cancel()

    def _start(self) -> ProviderClient:
        """The turn's tools when none were given and its provider, once the model policy
        allows the turn's model (ModelRefused when not): one router for the turn and its
        title, built over the owner's profiles (read in the claim's call, `starts`)."""
        started, self.started = self.started, None
        if isinstance(started, Exception):
            raise started
        if started is None:
            raise RuntimeError("the turn was claimed without its start")
        if started.tools is not None:
            self.tools = started.tools
        self.org_keys = started.decision.org_keys
        self.allowed[self.turn.model] = True
        self.first_path, self.first_compaction = started.path, started.compaction
        return started.provider

    def _abandon_start(self) -> None:
        """The run ends before taking its start: the provider built for it is closed."""
        started, self.started = self.started, None
        if isinstance(started, Started):
            abandon_start(started)

    async def _may_also_use(self, model: str) -> bool:
        """Whether a side call (title, compaction summary) may use `model` on this turn's
        router: the policy allows it, and never on keys the turn's own model may not use."""
        if model == self.turn.model:
            return True
        if model not in self.allowed:
            # Once per model per turn: a compaction and a title may both ask.
            decision = await _db(model_decide_for_user_id)(
                user_id=self.session.owner_id, model=model, check_own_key=self.check_own_key
            )
            self.allowed[model] = decision.allowed and (decision.org_keys or not self.org_keys)
        return self.allowed[model]

    async def _title(self, provider: ProviderClient) -> None:
        """Name a new session after its first exchange (a short model call, or the first
        words when titling by model is off or fails) and tell the open pages. The model
        call streams on this loop; the exchange is the one in memory, so only the write uses
        the database."""
        request = titles.title_request_for(self.session, self.exchange)
        if request is None:
            return
        # The turn gave its place back: its title's database calls wait behind the turns
        # still starting and streaming (a wave's titles went before its successors' claims).
        call_priority.set(AFTER_EVERY_TURN + call_priority.get())
        title = ""
        if settings.AUTO_TITLE and await self._may_also_use(request.model):
            title = await titles.atitle_from_model(request, provider)
        # Retried like the turn's other writes: a reply already complete must not end in a
        # crash for its title (it only writes an empty title, so a replay does nothing).
        title = await dbretry.write_gathered(
            titles.title_saver(),
            (self.session.pk, title or request.fallback),
            name="session_title_save",
        )
        if title:
            await events.apublish(self.session.pk, {"type": "session.title", "title": title})

    async def _finish(self, status: str, kind: str = "", error: str = "") -> None:
        assert self.emitter is not None
        if self.committed_status is not None:
            # The last model call's commit ended the turn; whatever happened after it
            # (even a crash, or a shutdown), that is the turn's status.
            await self.emitter.emit("turn.status", status=self.committed_status)
            return
        done = await dbretry.write(
            turn_state.turn_finish,
            turn_id=self.turn_id,
            worker=self.me,
            status=status,
            error_kind=kind,
            error=error,
            partial_text=self.progress.partial_text,
            partial_reasoning=self.progress.partial_reasoning,
        )
        if not done:
            raise LeaseLost
        fields: dict[str, Any] = {"status": status}
        if kind:
            fields["error_kind"] = kind
        if error:
            fields["error"] = error
        await self.emitter.emit("turn.status", **fields)

    def _lease_lost(self) -> None:
        self.lease_lost = True
        self.cancel.cancel()

    def _check(self) -> None:
        if self.lease_lost:
            raise LeaseLost

    # --- the agent loop --------------------------------------------------------------

    async def _loop(self, provider: ProviderClient) -> tuple[str, str, str]:
        tool_defs, revision = self.tools.definitions(), self.tools.revision
        for _ in range(settings.TURN_MAX_STEPS):
            self._check()
            if self.cancel.cancelled:
                return Turn.Status.CANCELLED, "", ""
            # The turn's own path (root → its tip): other branches never reach the model.
            rows, self.first_path = self.first_path, None  # the first, read with the start
            if rows is None:
                rows = await _db(selectors.turn_path)(turn=self.turn)
                self.first_compaction = None  # it was read for another path
            pending = _unanswered_calls(rows, self.turn_id)
            if pending:
                waiting = await self._run_tools(pending)
                if waiting:
                    await self.emitter.emit("tool.approval", calls=waiting)  # type: ignore[union-attr]
                    return Turn.Status.AWAITING_APPROVAL, "", ""
                continue
            if self.tools.revision != revision:
                # A tool call changed the registry (an MCP server's tools/list_changed).
                tool_defs, revision = self.tools.definitions(), self.tools.revision
            outcome = await self._model_step(provider, rows, tool_defs)
            if outcome is not None:
                return outcome
        return (
            Turn.Status.COMPLETED,
            "step_limit",
            (f"Stopped after {settings.TURN_MAX_STEPS} steps; send a message to continue."),
        )

    async def _model_step(
        self, provider: ProviderClient, rows: list[Message], tool_defs: list[dict]
    ) -> tuple[str, str, str] | None:
        """One model call. Returns a final outcome, or None to keep looping (tool calls)."""
        model = self.turn.model
        history = [row.to_canonical() for row in rows]
        caps = provider.capabilities(model)
        # Stored on this step's reply: it is the continuation row of a continue turn.
        self.step_continuation = self._continuing(rows)
        if not self.noted:
            self.noted = True
            note = degradation_note(history, caps)
            if note:
                await self.emitter.emit("notice", note=note.lstrip(" —"))  # type: ignore[union-attr]
        state, outcome = await maybe_compact(
            session_id=self.session.pk,
            turn_id=self.turn_id,
            rows=rows,
            history=history,
            provider=provider,
            model=model,
            context_window=caps.context_window,
            cancel=self.cancel,
            may_use=self._may_also_use,
            preread=self.first_compaction,
        )
        self.first_compaction = None
        if outcome is not None:
            await self.emitter.emit(
                "compaction", checkpoint=selectors.checkpoint_payload(outcome.checkpoint)
            )  # type: ignore[union-attr]
        # On the database thread only for images and files (attachments read, PDFs'
        # text extracted): a burst's starts queue there behind the wave's commits
        # (bench/stream_path.py's phases).
        outbound = functools.partial(
            outbound_history.outbound_messages,
            history,
            owner_id=self.session.owner_id,
            caps=caps,
            compaction_state=state,
            continuing=self.step_continuation,
        )
        if outbound_history.has_file_parts(history):
            messages = await _db(outbound)()
        else:
            messages = outbound()
        step_key = f"{self.turn_id}:a{_assistant_count(rows, self.turn_id)}"
        self.progress.reset()
        try:
            result = await self._stream(
                provider.astream(
                    model=model,
                    messages=messages,
                    tools=tool_defs or None,
                    cancel=self.cancel,
                    cache_key=str(self.session.pk),
                )
            )
        except RequestCancelled:
            result = None
        except ProviderError as exc:
            self._check()
            if self.cancel.cancelled:
                result = None
            else:
                if exc.partial is not None and exc.partial.text and not self.progress.text:
                    self.progress.text.append(exc.partial.text)
                return Turn.Status.FAILED, exc.kind, exc.friendly
        self._check()
        if result is None or self.cancel.cancelled:
            await self._persist_partial(step_key)
            return Turn.Status.CANCELLED, "", ""
        final = not result.tool_calls
        await self._persist_assistant(
            result, step_key, provider, rows, finish=Turn.Status.COMPLETED if final else None
        )
        self.progress.reset()
        if final:
            return Turn.Status.COMPLETED, "", ""
        return None

    async def _payload(self, message: Message) -> dict[str, Any]:
        """A reply's socket payload. The first reply of a regenerate or continue turn hangs
        under a message that may have other children: only then are its siblings looked
        up (one query), so the page can show "< i / n >" at once; every other reply is an
        only child."""
        if self.turn.base_seq is not None and message.parent_seq == self.turn.base_seq:
            await _db(selectors.attach_siblings)(session=self.session, rows=[message])
        return selectors.message_payload(message)

    def _continuing(self, rows: list[Message]) -> str:
        """A continue turn's kind until its first reply is written, else "": the request
        then ends with the cut reply (prefill) or the continuation instruction."""
        if self.turn.continuation and not _assistant_count(rows, self.turn_id):
            return self.turn.continuation
        return ""

    async def _stream(self, chunks: AsyncIterator[StreamChunk]) -> AssistantTurn:
        """Read the provider's stream on this loop (`astream`), publishing deltas as they
        come. Leaving early (the task cancelled) cancels the upstream request too."""
        final: AssistantTurn | None = None
        try:
            async for chunk in chunks:
                if chunk.text:
                    self.progress.text.append(chunk.text)
                if chunk.reasoning:
                    self.progress.reasoning.append(chunk.reasoning)
                if chunk.text or chunk.reasoning:
                    self.emitter.delta(text=chunk.text, reasoning=chunk.reasoning)  # type: ignore[union-attr]
                if chunk.turn is not None:
                    final = chunk.turn
        except asyncio.CancelledError:
            self.cancel.cancel()
            raise
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await asyncio.shield(aclose())
        if final is None:
            raise StreamError("The provider's stream ended without a final reply.", partial=None)
        return final

    async def _persist_partial(self, step_key: str) -> None:
        text = self.progress.partial_text
        if not text and not self.progress.partial_reasoning:
            return
        message = await dbretry.write(
            services.message_append,
            session_id=self.session.pk,
            turn_id=self.turn_id,
            role="assistant",
            content=text,
            reasoning=self.progress.partial_reasoning,
            model=self.turn.model,
            finish_reason="cancelled",
            continuation=self.step_continuation,
            dedupe_key=step_key,
        )
        self.progress.reset()
        await self.emitter.emit("message", message=await self._payload(message))  # type: ignore[union-attr]

    async def _persist_assistant(
        self,
        result: AssistantTurn,
        step_key: str,
        provider: ProviderClient,
        rows: list[Message],
        finish: str | None,
    ) -> None:
        """Commit the model call (message, usage, and with `finish` the turn's status) in
        one transaction, then tell the sockets."""
        usage = result.usage.to_dict() if result.usage else None
        cost = _cost(provider, self.turn.model, result.usage)
        totals = turn_state.StepTotals(
            usage=turn_state.usage_add(self.totals.usage, usage) or None,
            steps=self.totals.steps + 1,
            cost=(self.totals.cost or 0) + cost if cost is not None else self.totals.cost,
        )
        # Gathered with the other turns' commits asked meanwhile: a wave of turns ends
        # together (runtime.store.step_commits).
        ask = step_commits.StepAsk(
            turn_id=self.turn_id,
            worker=self.me,
            session_id=self.session.pk,
            message={
                "content": result.text or "",
                "tool_calls": [_call_dict(call) for call in result.tool_calls] or None,
                "reasoning": result.reasoning or "",
                "extras": result.extras or None,
                "usage": usage,
                "model": self.turn.model,
                "finish_reason": result.finish_reason or "",
                "continuation": self.step_continuation,
            },
            dedupe_key=step_key,
            totals=totals,
            context_tokens=turn_state.context_tokens_of(usage),
            finish=finish,
            # The step's path tip (its rows were read for this call): known here, so the
            # commit moves the active leaf within its one UPDATE.
            parent_seq=rows[-1].seq if rows else services.TIP,
        )
        saved = await dbretry.write_gathered(
            step_commits.step_committer(), ask, name="turn_step_commit"
        )
        if saved.counted:
            self.totals = totals
        if saved.ours:
            self.committed_status = finish
        self.exchange = [*rows, saved.message]
        await self.emitter.emit("message", message=await self._payload(saved.message))  # type: ignore[union-attr]
        if result.usage is not None:
            await self.emitter.emit(  # type: ignore[union-attr]
                "usage",
                usage=usage,
                context_tokens=result.usage.context_tokens,
                cost=str(cost) if cost is not None else None,
            )
        if not saved.ours:
            raise LeaseLost

    # --- tools -------------------------------------------------------------------------

    async def _run_tools(self, pending: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run what may run; return the calls still waiting for the user's decision."""
        approvals = self.turn.approvals or {}
        overrides = await _db(_tool_policy_overrides)()
        waiting = []
        for call in pending:
            self._check()
            policy = self.tools.policy_for(call["name"], overrides)
            decision = approvals.get(call["id"])
            if call.get("error"):
                result = ToolResult(f"Error: {call['error']}", is_error=True)
            elif self.tools.get(call["name"]) is None:
                result = ToolResult(
                    f"Error: there is no tool named {call['name']!r}.", is_error=True
                )
            elif policy == "deny":
                result = ToolResult(
                    f"Error: the tool {call['name']} is disabled by the administrator.",
                    is_error=True,
                )
            elif decision == "denied":
                result = ToolResult("The user denied this tool call.", is_error=True)
            elif policy == "ask" and decision != "approved":
                waiting.append(call)
                continue
            else:
                await self.emitter.emit("tool.started", call_id=call["id"], name=call["name"])  # type: ignore[union-attr]
                result = await self._execute(call)
            message = await dbretry.write(
                services.message_append,
                session_id=self.session.pk,
                turn_id=self.turn_id,
                role="tool",
                content=result.content,
                tool_call_id=call["id"],
                extras={"tool": call["name"], "is_error": result.is_error},
                dedupe_key=f"{self.turn_id}:tool:{call['id']}",
            )
            await self.emitter.emit("message", message=selectors.message_payload(message))  # type: ignore[union-attr]
        return waiting

    async def _execute(self, call: dict[str, Any]) -> ToolResult:
        tool = self.tools.get(call["name"])
        assert tool is not None
        ctx = ToolContext(
            session_id=str(self.session.pk),
            workspace_root=selectors.workspace_root(self.session.pk),
            outbound_policy=tool_outbound_policy(),
            user_id=self.session.owner_id,
            turn_id=self.turn_id,
            call_id=call["id"],
            cancel=self.cancel,
        )
        try:
            return await tool.arun(call.get("arguments") or {}, ctx)
        except Exception as exc:
            logger.warning("tool %s failed", call["name"], exc_info=True)
            return ToolResult(f"Error: the tool failed ({type(exc).__name__}).", is_error=True)


def _tool_policy_overrides() -> dict[str, str]:
    """Tool policy overrides: the settings' defaults, then the admins' ToolPolicy rows."""
    overrides = dict(getattr(settings, "TOOL_POLICY_OVERRIDES", {}) or {})
    overrides.update(ToolPolicy.objects.values_list("tool", "policy"))
    return overrides


def _call_dict(call: ToolCall) -> dict[str, Any]:
    return call.to_dict()


def _cost(provider: ProviderClient, model: str, usage: TokenUsage | None) -> Decimal | None:
    curated = getattr(provider, "curated", None)
    entry = curated(model) if callable(curated) else None
    prices = getattr(entry, "prices", None)
    if prices is None or usage is None:
        return None
    return prices.cost(usage)


def _assistant_count(rows: list[Message], turn_id: str) -> int:
    return sum(1 for m in rows if m.role == "assistant" and str(m.turn_id) == turn_id)


def _unanswered_calls(rows: list[Message], turn_id: str) -> list[dict[str, Any]]:
    """Tool calls of this turn's latest assistant message that have no result yet."""
    for index in range(len(rows) - 1, -1, -1):
        message = rows[index]
        if message.role == "assistant":
            if str(message.turn_id) != turn_id or not message.tool_calls:
                return []
            answered = {m.tool_call_id for m in rows[index + 1 :] if m.role == "tool"}
            return [c for c in message.tool_calls if c["id"] not in answered]
    return []
