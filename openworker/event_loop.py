"""The event loop the serving processes run on: uvloop where it is installed.

A worker process streams hundreds of turns from one event loop (`WorkerLoop`), and a
Daphne process serves every socket from one: both spend much of their CPU in the loop's
own machinery (selecting, reading and writing sockets, scheduling callbacks). uvloop does
that in C on libuv. `bench/stream_path.py --ks 500`, alternating runs: the worker's CPU
per delivered frame fell 10-15 % with it, Daphne's 5-10 %, and p99 added latency from
150-178 ms to 65-104 ms (docs/PERFORMANCE.md, session 10).

`OPENWORKER_UVLOOP=0` keeps asyncio's own loop; where uvloop is not installed (it has no
Windows build) the serving processes use asyncio's loop without being asked.
"""

from __future__ import annotations

import asyncio
import importlib.util

from openworker.env import envbool


def uvloop_wanted() -> bool:
    """Whether the serving processes run on uvloop: installed, and not switched off."""
    return envbool("OPENWORKER_UVLOOP", True) and importlib.util.find_spec("uvloop") is not None


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop of the configured kind (the worker's turn loop)."""
    if uvloop_wanted():
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def install_policy() -> None:
    """Make every loop this process creates from now on of the configured kind. The web
    server calls it before importing Daphne, which builds Twisted's loop at import."""
    if uvloop_wanted():
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
