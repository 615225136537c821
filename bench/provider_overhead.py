"""Benchmark: CPU cost of our stream clients against the official `openai` and
`anthropic` SDKs reading the same streams.

Run from the repository root: `.venv/bin/python bench/provider_overhead.py` (needs the
dev extras: the SDKs are test-only dependencies). Two streams per API, served by the
local fakes (`tests/fakes`) in their own process so their CPU is not counted here:

- text-heavy: one reply of TEXT_WORDS words, one delta event per word;
- tool-call-heavy: TOOL_CALLS tool calls, each with its JSON arguments in fragments.

Each contender reads the whole stream and builds the final reply, and is timed with
`time.process_time` (this process's CPU, all threads), best of REPEATS, reported per
10,000 SSE events:

- over HTTP: our `ProviderClient.stream()` (transport + SSE decoder + parser) against
  the SDK's streaming call, both plain iteration (`create(stream=True)`) and the SDK's
  accumulating helper (`.stream()` → final message), which is the like-for-like job;
  `stream()` is `astream()` run on the private loop of `providers.blocking`, so the
  "http loop" row times `astream()` itself on an event loop (the engine's path) against
  the same SDK figures;
- in memory: our SSE decoder and parser fed the captured bytes against the SDK over an
  `httpx.MockTransport` replaying the same bytes in the same chunks.

The ratio is ours / SDK; the target is <= 1.0x against every SDK figure (no slower than
the SDKs). Exits non-zero on a MISS. Under two minutes.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench._common import best_cpu_of, print_table, verdict
from providers.factory import build_provider_client
from providers.outbound import OutboundPolicy
from providers.sse import SSEDecoder
from providers.transport import Transport
from providers.types import ModelCapabilities
from providers.wire.anthropic_messages import MessagesStreamParser
from providers.wire.openai_completions import CompletionsStreamParser
from tests.fakes import Reply, text, tool_call
from tests.fakes.process import FakeProcess

# ~10,000 events each: the unit the figures are reported in, so little scaling is needed.
TEXT_WORDS = 10_000
# ~6 events per call. The `openai` SDK's accumulating helper grows quadratically with
# the number of calls in one reply, so its per-event figure depends on this size.
TOOL_CALLS = 500
REPEATS = 7
# CPU seconds one contender may spend on repeats (the slow SDK helper gets fewer runs).
BUDGET_SECONDS = 4.0
PER_EVENTS = 10_000
# Network-sized reads for the in-memory contenders (httpx reads up to 64 KiB at once).
CHUNK_BYTES = 16 * 1024
TARGET_RATIO = 1.0
API_KEY = "test-key"
MODELS = {"openai": "gpt-fake", "anthropic": "claude-fake"}
# Our client per wire API: the registry's `openai` speaks the Responses API, so the Chat
# Completions client is measured as a plain Completions vendor.
OUR_PROVIDER = {"openai": "together", "anthropic": "anthropic"}
MESSAGES = [{"role": "user", "content": "go"}]
TOOLS = [
    {
        "name": "write_file",
        "description": "Write a file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    }
]


def text_reply() -> Reply:
    words = " ".join(f"word{i}" for i in range(TEXT_WORDS))
    return Reply(text(words))


def tool_reply() -> Reply:
    calls = [
        tool_call(
            "write_file",
            {"path": f"src/module_{i}.py", "content": f"print({i})\n" * 8},
            id=f"call_{i:05d}",
        )
        for i in range(TOOL_CALLS)
    ]
    return Reply(*calls)


SHAPES: dict[str, Callable[[], Reply]] = {"text": text_reply, "tool calls": tool_reply}


# -- capturing the stream once --------------------------------------------------------


def request_for(provider: str, base_url: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    model = MODELS[provider]
    if provider == "openai":
        url = base_url + "/chat/completions"
        headers = {"Authorization": f"Bearer {API_KEY}"}
        body: dict[str, Any] = {"model": model, "messages": MESSAGES, "stream": True}
    else:
        url = base_url + "/v1/messages"
        headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
        body = {"model": model, "messages": MESSAGES, "stream": True, "max_tokens": 1024}
    return url, headers, body


def capture(provider: str, base_url: str) -> bytes:
    url, headers, body = request_for(provider, base_url)
    with httpx.stream("POST", url, headers=headers, json=body, timeout=60) as response:
        response.raise_for_status()
        return response.read()


def chunked(raw: bytes) -> list[bytes]:
    return [raw[i : i + CHUNK_BYTES] for i in range(0, len(raw), CHUNK_BYTES)]


# -- contenders ------------------------------------------------------------------------


def ours_client(provider: str, base_url: str) -> Any:
    transport = Transport(policy=OutboundPolicy(allow_loopback=True), max_retries=0)
    return build_provider_client(
        OUR_PROVIDER[provider],
        {"api_key": API_KEY, "base_url": base_url},
        None,
        transport=transport,
        capabilities=lambda model: ModelCapabilities(),
    )


def ours_http(provider: str, base_url: str) -> Callable[[], object]:
    client = ours_client(provider, base_url)
    model = MODELS[provider]

    def run() -> object:
        final = None
        for chunk in client.stream(model=model, messages=MESSAGES, tools=TOOLS):
            final = chunk.turn or final
        return final

    return run


def ours_loop(provider: str, base_url: str) -> Callable[[], object]:
    """`astream` on one event loop, kept between runs as a worker keeps its loop."""
    client = ours_client(provider, base_url)
    model = MODELS[provider]
    loop = asyncio.new_event_loop()

    async def consume() -> object:
        final = None
        async for chunk in client.astream(model=model, messages=MESSAGES, tools=TOOLS):
            final = chunk.turn or final
        return final

    def run() -> object:
        return loop.run_until_complete(consume())

    return run


def ours_memory(provider: str, chunks: list[bytes]) -> Callable[[], object]:
    model = MODELS[provider]

    def run() -> object:
        parser: Any = (
            CompletionsStreamParser(model=model)
            if provider == "openai"
            else MessagesStreamParser(model=model)
        )
        decoder = SSEDecoder()
        for chunk in chunks:
            for event in decoder.feed(chunk):
                parser.feed(event)
        for event in decoder.flush():
            parser.feed(event)
        return parser.finish()

    return run


def replaying_client(chunks: list[bytes], http: Any = httpx) -> Any:
    """A client whose every response is the captured stream, chunk by chunk. `http` is
    the HTTP package the SDK is built on (`anthropic` 2.x uses the `httpx2` fork)."""

    def handler(request: Any) -> Any:
        return http.Response(
            200, headers={"content-type": "text/event-stream"}, content=iter(chunks)
        )

    return http.Client(transport=http.MockTransport(handler))


def sdk_calls(
    provider: str, base_url: str, replay: list[bytes] | None
) -> tuple[Callable[[], object], Callable[[], object]]:
    """(plain iteration, accumulating helper) for the provider's official SDK; over HTTP,
    or replaying `replay` in memory."""
    model = MODELS[provider]
    if provider == "openai":
        import openai

        http_client = replaying_client(replay) if replay is not None else None
        oai = openai.OpenAI(
            base_url=base_url, api_key=API_KEY, max_retries=0, http_client=http_client
        )
        tools: Any = [{"type": "function", "function": t} for t in TOOLS]

        def plain_openai() -> object:
            return list(
                oai.chat.completions.create(
                    model=model, messages=MESSAGES, tools=tools, stream=True
                )
            )

        def helper_openai() -> object:
            with oai.chat.completions.stream(model=model, messages=MESSAGES, tools=tools) as stream:
                return stream.get_final_completion()

        return plain_openai, helper_openai

    import anthropic

    http_client = None
    if replay is not None:
        import httpx2

        http_client = replaying_client(replay, httpx2)
    ant = anthropic.Anthropic(
        base_url=base_url, api_key=API_KEY, max_retries=0, http_client=http_client
    )
    ant_tools: Any = [
        {"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
        for t in TOOLS
    ]

    def plain_anthropic() -> object:
        return list(
            ant.messages.create(
                model=model, messages=MESSAGES, max_tokens=1024, tools=ant_tools, stream=True
            )
        )

    def helper_anthropic() -> object:
        with ant.messages.stream(
            model=model, messages=MESSAGES, max_tokens=1024, tools=ant_tools
        ) as stream:
            return stream.get_final_message()

    return plain_anthropic, helper_anthropic


# -- the run ------------------------------------------------------------------------------


def per_events(seconds: float, events: int) -> float:
    """CPU milliseconds per PER_EVENTS events."""
    return seconds * 1000 * PER_EVENTS / events


def measure(provider: str, shape: str) -> tuple[list[list[Any]], list[float]]:
    with FakeProcess(provider, default=SHAPES[shape](), args=["--no-validate"]) as fake:
        base_url = fake.base_url
        raw = capture(provider, base_url)
        events = raw.count(b"\n\n")
        chunks = chunked(raw)
        plain_http, helper_http = sdk_calls(provider, base_url, None)
        plain_mem, helper_mem = sdk_calls(provider, base_url, chunks)
        timings = {
            name: per_events(best_cpu_of(fn, REPEATS, budget=BUDGET_SECONDS), events)
            for name, fn in {
                "ours http": ours_http(provider, base_url),
                "ours http loop": ours_loop(provider, base_url),
                "sdk http": plain_http,
                "sdk helper http": helper_http,
                "ours memory": ours_memory(provider, chunks),
                "sdk memory": plain_mem,
                "sdk helper memory": helper_mem,
            }.items()
        }
    rows = []
    ratios = []
    for where in ("http", "http loop", "memory"):
        ours = timings[f"ours {where}"]
        sdk = where.split()[0]  # the SDK has no loop row: its blocking figures
        plain, helper = timings[f"sdk {sdk}"], timings[f"sdk helper {sdk}"]
        ratios += [ours / plain, ours / helper]
        rows.append(
            [
                provider,
                shape,
                where,
                events,
                ours,
                plain,
                helper,
                f"{ours / plain:.2f}x",
                f"{ours / helper:.2f}x",
                verdict(max(ours / plain, ours / helper) <= TARGET_RATIO),
            ]
        )
    return rows, ratios


def main() -> int:
    rows: list[list[Any]] = []
    ratios: list[float] = []
    for provider in ("openai", "anthropic"):
        for shape in SHAPES:
            got_rows, got_ratios = measure(provider, shape)
            rows += got_rows
            ratios += got_ratios
    print(f"CPU ms per {PER_EVENTS:,} stream events, best of {REPEATS} (lower is better)\n")
    print_table(
        [
            "API",
            "stream",
            "path",
            "events",
            "ours ms",
            "SDK iterate ms",
            "SDK accumulate ms",
            "vs iterate",
            "vs accumulate",
            "<= 1.0x",
        ],
        rows,
    )
    worst = max(ratios)
    ok = worst <= TARGET_RATIO
    print(f"\nTarget: ours / SDK <= {TARGET_RATIO:.1f}x everywhere (worst {worst:.2f}x): ", end="")
    print(verdict(ok))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
