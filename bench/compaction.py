"""Benchmark: pick_boundary and estimate_tokens must scale linearly with the history.

Run from the repository root: `python bench/compaction.py`. Builds synthetic histories of
1k, 10k and 100k messages (user asks, assistant tool calls, tool results, answers), times
each function (best of several runs) and prints the growth per 10x messages. Linear time
grows ~10x; the target is at most 12x, which still tells linear (10x) apart from the
quadratic (100x) that estimating every candidate suffix from scratch would give.
Exits non-zero on a MISS. Takes well under a minute.
"""

from __future__ import annotations

import gc
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openworker.runtime.agent.compaction import estimate_tokens, keep_tokens, pick_boundary

SIZES = (1_000, 10_000, 100_000)
# Growth per 10x messages: linear is ~10x; allow some slack for cache effects at 100k.
MAX_GROWTH = 12.0
# Enough repeats that the best run filters scheduler noise, few enough to stay under ~30 s.
REPEATS = {1_000: 30, 10_000: 10, 100_000: 3}
SEED = 20240611


def synthetic_history(size: int, *, seed: int = SEED) -> list[dict]:
    """A system prompt then turns of: a user ask, 1-6 tool round-trips, a final answer."""
    rng = random.Random(seed)
    out: list[dict] = [{"role": "system", "content": "You are a coworker."}]
    n = 0
    while len(out) < size:
        out.append({"role": "user", "content": f"task {n}: " + "u" * rng.randint(20, 400)})
        for step in range(rng.randint(1, 6)):
            call_id = f"call_{n}_{step}"
            out.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"id": call_id, "name": "read_file", "arguments": {"path": f"/src/{n}.py"}}
                    ],
                    "reasoning": "r" * rng.randint(0, 200),
                }
            )
            out.append(
                {"role": "tool", "tool_call_id": call_id, "content": "t" * rng.randint(50, 3_000)}
            )
        out.append({"role": "assistant", "content": f"done {n}: " + "a" * rng.randint(20, 600)})
        n += 1
    return out[:size]


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """Best wall time of `repeats` runs, with the garbage collector off (as timeit does):
    a collection landing in one size's runs but not another's would skew the ratio."""
    best = float("inf")
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
    finally:
        gc.enable()
    return best


def main() -> int:
    budget = keep_tokens(None)
    histories = {size: synthetic_history(size) for size in SIZES}
    timings: dict[str, dict[int, float]] = {"pick_boundary": {}, "estimate_tokens": {}}
    for size, messages in histories.items():
        timings["pick_boundary"][size] = best_of(
            lambda m=messages: pick_boundary(m, keep_tokens=budget), REPEATS[size]
        )
        timings["estimate_tokens"][size] = best_of(
            lambda m=messages: estimate_tokens(m), REPEATS[size]
        )

    print(f"{'function':<16} {'messages':>9} {'best ms':>10} {'growth':>8}  result")
    missed = False
    for name, by_size in timings.items():
        previous = None
        for size in SIZES:
            seconds = by_size[size]
            growth, verdict = "", ""
            if previous is not None:
                ratio = seconds / previous
                growth = f"{ratio:.1f}x"
                verdict = "PASS" if ratio <= MAX_GROWTH else "MISS"
                missed = missed or verdict == "MISS"
            print(f"{name:<16} {size:>9,} {seconds * 1e3:>10.2f} {growth:>8}  {verdict}")
            previous = seconds
    boundary = pick_boundary(histories[SIZES[-1]], keep_tokens=budget)
    print(f"keep budget {budget:,} tokens; boundary in the {SIZES[-1]:,} history: {boundary:,}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
