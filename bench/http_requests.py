"""Benchmark: the worker's CPU per provider request, connections kept across turns or not.

Every turn builds its own router and `Transport` and makes two requests (its reply and,
for a new session, its title). Before `providers.kept_connections`, each turn opened a
connection of its own (a TCP connect and, to a real provider, a TLS handshake) and
closed it at its end; now a finished turn's connection waits, idle, for the next turn to
the same address. This bench runs TURNS turns of two streamed requests each, CONCURRENCY
at a time, on one uvloop loop in this process (as the worker's turn loop runs them)
against the stamping upstream (bench/_common.py, a subprocess: its CPU is not counted),
over plain HTTP and over TLS (a certificate made for the run), and prints this process's
CPU per request (user and system, `time.process_time`) and the connections it opened
after a warm-up round of CONCURRENCY turns:

- "kept": the transport as it is;
- "per turn": each turn's transport with a connection pool of its own, as before (the
  shared keeper switched off for the run).

Alternated runs, medians of REPEATS. No target: docs/PERFORMANCE.md records the figures.

    .venv/bin/python bench/http_requests.py [--turns 400] [--concurrency 50]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import print_table, run_on_serving_loop, upstream_process
from tests.support.tls import write_tls_files

REPEATS = 5
HEADERS = {"x-api-key": "sk-bench-0123456789", "anthropic-version": "2023-06-01"}
BODY = {
    "model": "claude-bench",
    "max_tokens": 64,
    "stream": True,
    "messages": [{"role": "user", "content": "Hello there."}],
}


@contextlib.contextmanager
def per_turn_connections(enabled: bool) -> Iterator[None]:
    """Each Transport with a pool of its own (the keeper off), for the "per turn" rows."""
    from providers import transport

    if not enabled:
        yield
        return
    kept = transport.loop_keeper
    transport.loop_keeper = lambda: None  # type: ignore[assignment]
    try:
        yield
    finally:
        transport.loop_keeper = kept  # type: ignore[assignment]


async def run_turns(url: str, turns: int, concurrency: int) -> tuple[float, float, int]:
    """(CPU µs per request, wall s, connections opened) for `turns` turns."""
    import httpcore

    from providers.kept_connections import aclose_loop_keeper
    from providers.outbound import OutboundPolicy
    from providers.transport import Transport

    policy = OutboundPolicy(allowlist=["127.0.0.1"])
    opened = 0
    connect = httpcore.AsyncHTTPConnection._connect

    async def counting(self: object, request: object) -> object:
        nonlocal opened
        opened += 1
        return await connect(self, request)  # type: ignore[arg-type]

    async def turn(gate: asyncio.Semaphore) -> None:
        async with gate:
            transport = Transport(policy=policy)
            try:
                for _ in range(2):  # the reply, then the title
                    async for _event in transport.astream_sse(
                        url, headers=HEADERS, body=BODY, model="claude-bench"
                    ):
                        pass
            finally:
                await transport.aclose()

    httpcore.AsyncHTTPConnection._connect = counting  # type: ignore[method-assign]
    try:
        gate = asyncio.Semaphore(concurrency)
        await asyncio.gather(*(turn(gate) for _ in range(concurrency)))  # warm
        opened = 0
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(turn(gate) for _ in range(turns)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        httpcore.AsyncHTTPConnection._connect = connect  # type: ignore[method-assign]
        await aclose_loop_keeper()
    return cpu / (2 * turns) * 1e6, wall, opened


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args()
    os.environ.setdefault("OPENWORKER_OUTBOUND_ALLOWLIST", "127.0.0.1")
    from providers import outbound

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        ca, cert, key = write_tls_files(Path(folder))
        trusting = ssl.create_default_context(cafile=str(ca))
        outbound.default_ssl_context = functools.cache(lambda: trusting)
        for scheme, tls in (("http", None), ("https", (cert, key))):
            with upstream_process(2, 1000.0, tls=tls) as base:
                url = base + "/v1/messages"
                figures: dict[str, list[tuple[float, float, int]]] = {"kept": [], "per turn": []}
                for _ in range(args.repeats):
                    for mode in ("per turn", "kept"):  # alternated
                        with per_turn_connections(mode == "per turn"):
                            figures[mode].append(
                                run_on_serving_loop(run_turns(url, args.turns, args.concurrency))
                            )
                for mode, runs in figures.items():
                    rows.append(
                        (
                            scheme,
                            mode,
                            round(statistics.median(r[0] for r in runs)),
                            f"{min(r[0] for r in runs):.0f}-{max(r[0] for r in runs):.0f}",
                            round(statistics.median(r[1] for r in runs), 2),
                            round(statistics.median(r[2] for r in runs)),
                        )
                    )
    print(
        f"provider requests: {args.turns} turns of 2 streamed requests, {args.concurrency} at "
        f"a time, medians of {args.repeats} alternated runs, load average before: "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}\n"
    )
    print_table(
        ["scheme", "connections", "CPU µs / request", "range", "wall s", "connections opened"],
        rows,
    )


if __name__ == "__main__":
    main()
