"""Garbage-collector settings for the serving processes (Daphne, Celery workers).

A full (generation 2) collection walks every tracked object: with Django, Channels or
Celery loaded that is hundreds of thousands, and each one stopped the process for
50-140 ms (measured while streaming 200 turns, bench/stream_path.py): a pause every few
seconds that every open stream felt at once. After start-up, everything imported so far
is frozen (`gc.freeze()`: never collected, never walked again), so a full collection
only walks what the process has made since; and the youngest generation is collected
less often, since a streaming process allocates many short-lived objects that reference
counting frees anyway.
"""

from __future__ import annotations

import gc

# Allocations between two young collections (CPython's default is 700).
GEN0_THRESHOLD = 700

_tuned = False


def tune_for_serving() -> None:
    """Freeze what start-up made and raise the young-generation threshold. Once per
    process; safe to call again."""
    global _tuned
    if _tuned:
        return
    _tuned = True
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
