"""Garbage-collector settings for the serving processes (Daphne, Celery workers).

A full (generation 2) collection walks every tracked object: with Django, Channels,
Celery and a few hundred live turns that is hundreds of thousands, and each one stopped
the process for 50-140 ms (measured while streaming 200 turns, bench/stream_path.py): a
pause every few seconds that every open stream felt at once, and most of the streaming
path's tail latency.

So, once start-up is done: what it made is frozen (`gc.freeze()`: never walked again),
full collections no longer start on their own, and a timer runs one every
`FULL_COLLECTION_SECONDS` instead. Young collections (cheap, and where almost all
cyclic garbage dies) keep CPython's defaults; reference counting frees everything else
at once, as always. `OPENWORKER_GC_TUNING=0` keeps CPython's behaviour (the test suite
does: it measures nothing and should see the collector as it ships).
"""

from __future__ import annotations

import gc
import logging
import threading
import time

from openworker.env import envbool

logger = logging.getLogger(__name__)

FULL_COLLECTION_SECONDS = 300.0
# Gen-1 collections before CPython would consider a full one: never, in practice.
NO_AUTOMATIC_FULL_COLLECTION = 1_000_000

_tuned = False


def tune_for_serving() -> None:
    """Freeze what start-up made and move full collections to a timer. Once per process;
    safe to call again."""
    global _tuned
    if _tuned or not envbool("OPENWORKER_GC_TUNING", True):
        return
    _tuned = True
    gc.collect()
    gc.freeze()
    gen0, gen1, _ = gc.get_threshold()
    gc.set_threshold(gen0, gen1, NO_AUTOMATIC_FULL_COLLECTION)
    threading.Thread(target=_collect_periodically, name="gc-full", daemon=True).start()


def _collect_periodically() -> None:
    while True:
        time.sleep(FULL_COLLECTION_SECONDS)
        started = time.perf_counter()
        found = gc.collect()
        logger.debug(
            "full collection: %d unreachable, %.1f ms",
            found,
            (time.perf_counter() - started) * 1000,
        )
