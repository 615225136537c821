"""Benchmark: the web process's CPU per frame written, Twisted's stock asyncio reactor
against `openworker.web_reactor.FlushingReactor`.

Run from the repository root: `.venv/bin/python bench/web_writes.py`. For each reactor,
alternated over RUNS rounds, it starts a server process on that reactor (on uvloop, as the
web process runs) that writes a FRAME_BYTES frame to each of CONNECTIONS sockets RATE
times a second, each socket on its own timer (as Daphne writes a frame from each socket's
consumer), and a client process that reads every socket on loopback. It reports the
server's CPU (user + system, `resource.getrusage`) per frame over SECONDS, and the
system calls it made per frame are visible with `strace -c -f -p <pid>` if wanted.

What it isolates: the write path alone, without Daphne's protocol, the channel layer or
the websocket framing (`bench/stream_path.py` measures the whole path). No target: a
figure to compare the two reactors by (docs/PERFORMANCE.md). About a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CONNECTIONS = 500
RATE = 20.0
FRAME_BYTES = 120
SECONDS = 8.0
RUNS = 3
REACTORS = ("stock", "flushing")


def serve(kind: str, connections: int, rate: float, seconds: float) -> None:
    """The server: print the port, accept `connections`, write for `seconds`, print µs/frame."""
    from openworker.event_loop import install_policy

    install_policy()
    if kind == "flushing":
        from openworker import web_reactor

        web_reactor.install()
    else:
        from twisted.internet import asyncioreactor

        asyncioreactor.install(asyncio.new_event_loop())
    from twisted.internet import reactor
    from twisted.internet.protocol import Factory, Protocol

    frame = b"x" * FRAME_BYTES
    interval = 1.0 / rate
    opened: list[Protocol] = []
    counted = {"frames": 0}

    class Writer(Protocol):
        def connectionMade(self) -> None:
            opened.append(self)
            if len(opened) == connections:
                reactor.callLater(0.5, start)

        def tick(self) -> None:
            self.transport.write(frame)
            counted["frames"] += 1
            reactor.callLater(interval, self.tick)

    def start() -> None:
        for index, protocol in enumerate(opened):
            reactor.callLater(interval * index / len(opened), protocol.tick)
        reactor.callLater(1.0, measure)

    def measure() -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        began = (usage.ru_utime + usage.ru_stime, counted["frames"])

        def done() -> None:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            cpu = usage.ru_utime + usage.ru_stime - began[0]
            frames = counted["frames"] - began[1]
            print(f"{cpu / frames * 1e6:.2f}", flush=True)
            reactor.stop()

        reactor.callLater(seconds, done)

    port = reactor.listenTCP(0, Factory.forProtocol(Writer), interface="127.0.0.1", backlog=1024)
    print(port.getHost().port, flush=True)
    reactor.run()


async def _read_all(port: int, connections: int) -> None:
    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while await reader.read(65536):
            pass
        writer.close()

    await asyncio.gather(*(one() for _ in range(connections)), return_exceptions=True)


def client(port: int, connections: int) -> None:
    from openworker.event_loop import new_event_loop

    loop = new_event_loop()
    loop.run_until_complete(_read_all(port, connections))


def one_run(kind: str, connections: int, rate: float, seconds: float) -> float:
    me = str(Path(__file__).resolve())
    server = subprocess.Popen(
        [sys.executable, me, "serve", kind, str(connections), str(rate), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        reader = subprocess.Popen([sys.executable, me, "client", str(port), str(connections)])
        try:
            return float(server.stdout.readline())
        finally:
            reader.terminate()
            reader.wait(timeout=10)
    finally:
        server.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=CONNECTIONS)
    parser.add_argument("--rate", type=float, default=RATE, help="frames a second per socket")
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--runs", type=int, default=RUNS)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {kind: [] for kind in REACTORS}
    for _ in range(args.runs):
        for kind in REACTORS:  # alternated: the machine's speed drifts
            figures[kind].append(one_run(kind, args.connections, args.rate, args.seconds))
    print(
        f"web writes: {args.connections} sockets x {args.rate:g} frames/s of {FRAME_BYTES} B, "
        f"{args.runs} alternated runs of {args.seconds:g} s; server CPU µs per frame"
    )
    for kind in REACTORS:
        values = ", ".join(f"{v:.2f}" for v in figures[kind])
        print(f"  {kind:9}: median {statistics.median(figures[kind]):.2f} ({values})")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
    elif sys.argv[1:2] == ["client"]:
        client(int(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit(main())
