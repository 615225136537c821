"""Benchmark: how much of a long tool-using session's prompt is read from the cache.

Run from the repository root: `python bench/cache_efficiency.py`. Starts the caching
Anthropic and OpenAI fakes (`simulate_cache=True`: they meter prefixes the way the vendors
do), then drives a scripted 20-request session through OUR client — a `ProviderRouter`
whose secrets point at the fakes, with an outbound policy that admits loopback — and
prints, per request, the fresh input, cache read and cache write tokens, then the share of
prompt tokens read from cache from request 3 on (requests 1-2 can only write).

Each session runs twice: plainly, and with a compaction at request 10 (the outbound view
becomes system + compacted block + verbatim tail, which must stay byte-stable between
requests from then on, or the cache misses every time). Target: >= 0.90 for Anthropic in
both runs. OpenAI's share is printed too (automatic caching, 128-token granularity).
Exits non-zero on a MISS. Takes a few seconds.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openworker.runtime.agent.compaction import (
    CompactionState,
    apply_to_outbound,
    compact,
    estimate_tokens,
    pick_boundary,
)
from providers.outbound import OutboundPolicy
from providers.registry import get_descriptor
from providers.router import ProviderRouter
from providers.types import TokenUsage
from providers.wire.openai_completions import OpenAICompletionsClient
from tests.fakes import script as fake
from tests.fakes.anthropic_messages import AnthropicMessagesFake
from tests.fakes.openai_chat import OpenAIChatFake

KEY = "bench-key"
REQUESTS = 20
# Requests 1 and 2 can only write the cache: the share is measured from request 3 on.
MEASURE_FROM = 3
COMPACT_AT = 10
TARGET_SHARE = 0.90
# A realistic agent system prompt (instructions, conventions, tool guidance): ~4k tokens.
SYSTEM_PROMPT = "\n".join(
    f"Rule {n}: work carefully, cite the files you read, and keep answers short and exact."
    for n in range(190)
)
# A tool result of ~300 tokens (a file excerpt) per tool call.
TOOL_RESULT_LINES = 12
COMPACTION_SUMMARY = "The user asked about files 0 to 3; each was read and summarized."
TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file of the workspace and return its text.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
    {
        "name": "search",
        "description": "Search the workspace for a phrase.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
    {
        "name": "write_file",
        "description": "Write text to a file of the workspace.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
        },
    },
]


def completions_client(name, profile, secrets, *, transport, capabilities):
    """The router's client for `openai` on Chat Completions (its default wire is Responses;
    the caching fake speaks Completions, and the cache declaration is the same)."""
    return OpenAICompletionsClient(
        get_descriptor(name),
        api_key=profile.get("api_key"),
        base_url=profile.get("base_url"),
        transport=transport,
        capabilities=capabilities,
    )


@dataclass
class Run:
    label: str
    usages: list[TokenUsage]

    def share(self) -> float:
        measured = self.usages[MEASURE_FROM - 1 :]
        prompt = sum(u.context_tokens for u in measured)
        return sum(u.cache_read for u in measured) / prompt if prompt else 0.0


def scripted_replies() -> list[fake.Reply]:
    """Odd requests call a tool, even ones answer: ten user turns of one tool call each."""
    replies = []
    for n in range(REQUESTS):
        turn = n // 2
        if n % 2 == 0:
            replies.append(
                fake.Reply(
                    fake.text("Let me read it."),
                    fake.tool_call("read_file", {"path": f"src/{turn}.py"}, id=f"call_{turn}"),
                )
            )
        else:
            replies.append(fake.Reply(fake.text(f"File src/{turn}.py defines part {turn}.")))
    return replies


def tool_result(path: str) -> str:
    return "\n".join(f"{path}:{line}: value_{line} = compute({line})" for line in range(1, 60))[
        : TOOL_RESULT_LINES * 100
    ]


def run_session(router: ProviderRouter, model: str, *, compaction: bool, **settings: Any) -> Run:
    history: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "Question 0: what does src/0.py do?"},
    ]
    state: CompactionState | None = None
    usages: list[TokenUsage] = []
    for request in range(1, REQUESTS + 1):
        if compaction and request == COMPACT_AT:
            boundary = pick_boundary(history, keep_tokens=estimate_tokens(history) // 3)
            if boundary is not None:
                state = compact(history, summary=COMPACTION_SUMMARY, boundary=boundary)
        outbound = apply_to_outbound(history, state)
        chunks = list(router.stream(model=model, messages=outbound, tools=TOOLS, **settings))
        turn = chunks[-1].turn
        if turn is None or turn.usage is None:
            raise SystemExit(f"{model}: request {request} reported no usage")
        usages.append(turn.usage)
        history.append(
            {
                "role": "assistant",
                "content": turn.text or "",
                "tool_calls": [call.to_dict() for call in turn.tool_calls],
            }
        )
        if turn.tool_calls:
            call = turn.tool_calls[0]
            result = tool_result(str(call.arguments.get("path")))
            history.append({"role": "tool", "tool_call_id": call.id, "content": result})
        else:
            n = request // 2
            history.append({"role": "user", "content": f"Question {n}: what does src/{n}.py do?"})
    label = f"{model} ({'with a compaction at request 10' if compaction else 'no compaction'})"
    return Run(label, usages)


def print_run(run: Run, *, target: float | None) -> bool:
    print(f"\n{run.label}")
    print(f"{'req':>4} {'input':>8} {'cache_read':>11} {'cache_write':>12} {'read share':>11}")
    for number, usage in enumerate(run.usages, start=1):
        share = usage.cache_read / usage.context_tokens if usage.context_tokens else 0.0
        print(
            f"{number:>4} {usage.input:>8} {usage.cache_read:>11} {usage.cache_write:>12}"
            f" {share:>11.3f}"
        )
    share = run.share()
    if target is None:
        print(f"share read from cache, requests {MEASURE_FROM}-{REQUESTS}: {share:.3f}")
        return True
    verdict = "PASS" if share >= target else "MISS"
    print(
        f"share read from cache, requests {MEASURE_FROM}-{REQUESTS}: {share:.3f}"
        f" (target >= {target:.2f}) {verdict}"
    )
    return share >= target


def main() -> int:
    ok = True
    policy = OutboundPolicy(allow_loopback=True)
    for compaction in (False, True):
        with AnthropicMessagesFake(api_key=KEY, simulate_cache=True) as server:
            server.push(*scripted_replies())
            secrets = {"provider:anthropic": {"api_key": KEY, "base_url": server.base_url}}
            router = ProviderRouter(secrets, outbound=policy)
            try:
                run = run_session(router, "anthropic:claude-fake", compaction=compaction)
            finally:
                router.close()
        ok = print_run(run, target=TARGET_SHARE) and ok
    for compaction in (False, True):
        with OpenAIChatFake(api_key=KEY, simulate_cache=True) as server:
            server.push(*scripted_replies())
            secrets = {"provider:openai": {"api_key": KEY, "base_url": server.base_url}}
            router = ProviderRouter(secrets, outbound=policy, client_factory=completions_client)
            try:
                run = run_session(
                    router, "openai:gpt-fake", compaction=compaction, cache_key="bench-session"
                )
            finally:
                router.close()
        print_run(run, target=None)
    print("\nPASS" if ok else "\nMISS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
