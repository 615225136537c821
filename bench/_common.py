"""Shared helpers for the benches: tables, percentiles, CPU timing, process monitoring,
and a fake Anthropic upstream that stamps each token with the moment it was written.

The stamping upstream is the stream-path bench's clock. Each token of its reply is
`<index>@<microseconds since the epoch>;`, the stamp taken right before the bytes go on
the wire, so a client on the same machine computes a token's added latency as its own
receive time minus the stamp, and lost or duplicated tokens from the indices. Run it as
its own process (beside Daphne and the Celery worker):

    python bench/_common.py upstream --tokens 100 --rate 20

It prints its base URL as the first line of stdout, like `python -m tests.fakes`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import heapq
import itertools
import json
import math
import re
import secrets
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from openworker import compact_json  # noqa: E402
from tests.fakes.anthropic_messages import AnthropicMessagesFake, MessagesRenderer  # noqa: E402
from tests.fakes.script import Pause, Reply, Script, Step, Text  # noqa: E402
from tests.fakes.server import Event, RecordedRequest  # noqa: E402

T = TypeVar("T")

# Replaced by the emit time when a token is rendered: never appears on the wire.
STAMP = "{t}"
TOKEN_RE = re.compile(r"(\d+)@(\d+);")
# A cold interpreter importing the fakes and binding a port.
UPSTREAM_START_SECONDS = 15


def distributed_without_database(redis_url: str) -> None:
    """Django set up with the distributed settings (the Redis replay buffer and channel
    layer) on `redis_url`, for a bench that uses no database: one is named (the settings
    ask for it) and never connected to."""
    import os

    os.environ["REDIS_URL"] = redis_url
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/openworker_bench")
    os.environ.setdefault("DEBUG", "0")
    os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-not-for-production")
    os.environ.setdefault(
        "OPENWORKER_ENCRYPTION_KEYS", "dGVzdC1vbmx5LWtleS1ub3QtZm9yLXByb2R1Y3Rpb24="
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "openworker.settings")
    import django

    django.setup()


def now_us() -> int:
    """Wall clock in microseconds: the one clock every process on this machine shares."""
    return time.time_ns() // 1000


# -- tables and statistics ------------------------------------------------------------


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (no interpolation: every figure was really observed)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(pct / 100 * len(ordered))))
    return ordered[rank - 1]


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A Markdown table (pastes straight into docs/PERFORMANCE.md)."""
    cells = [[str(h) for h in headers], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    line = "| " + " | ".join(c.ljust(w) for c, w in zip(cells[0], widths, strict=True)) + " |"
    print(line)
    print("| " + " | ".join("-" * w for w in widths) + " |")
    for row in cells[1:]:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) + " |")
    sys.stdout.flush()


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def best_cpu_of(fn: Callable[[], object], repeats: int, *, budget: float = float("inf")) -> float:
    """Best `time.process_time` of `repeats` runs (this process's CPU, every thread), with
    the collector off as timeit does: a collection landing in one contender's run but
    not the other's would skew the ratio. Stops early (after at least one run) once the
    runs have used `budget` CPU seconds, so one slow contender cannot stall the bench."""
    best = float("inf")
    spent = 0.0
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            start = time.process_time()
            fn()
            took = time.process_time() - start
            best = min(best, took)
            spent += took
            if spent >= budget:
                break
    finally:
        gc.enable()
    return best


# -- process monitoring ---------------------------------------------------------------

# Often enough to catch a transient RSS peak of a multi-second run, cheap enough to not
# show up in the CPU figures of a 2-core machine.
SAMPLE_SECONDS = 0.1


@dataclass
class ProcStats:
    name: str
    cpu_start: float = 0.0
    cpu_end: float = 0.0
    rss_idle: int = 0
    rss_peak: int = 0

    @property
    def cpu_seconds(self) -> float:
        return self.cpu_end - self.cpu_start


@dataclass
class Monitor:
    """Samples the RSS of some processes in a thread; CPU seconds between start and stop.

    `rss_idle` is the RSS when monitoring starts (processes up, nothing running yet), so
    the growth under load divided by the number of concurrent turns is the memory a turn
    costs.
    """

    pids: dict[str, int]
    stats: dict[str, ProcStats] = field(default_factory=dict)
    # Every sample: (`now_us()`, each process's CPU seconds so far, and the box's: busy,
    # and stolen by the hypervisor), for CPU by the second of a run (`cpu_by_second`).
    samples: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Monitor:
        import psutil

        self._procs = {name: psutil.Process(pid) for name, pid in self.pids.items()}
        for name, proc in self._procs.items():
            rss = proc.memory_info().rss
            self.stats[name] = ProcStats(name, _cpu(proc), rss_idle=rss, rss_peak=rss)
        self._thread = threading.Thread(target=self._run, name="bench-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, ProcStats]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for name, proc in self._procs.items():
            with contextlib.suppress(Exception):
                self.stats[name].cpu_end = _cpu(proc)
                self._sample(name, proc)
        return self.stats

    def _run(self) -> None:
        import psutil

        while not self._stop.wait(SAMPLE_SECONDS):
            cpu: dict[str, float] = {}
            for name, proc in self._procs.items():
                with contextlib.suppress(Exception):
                    self._sample(name, proc)
                    cpu[name] = _cpu(proc)
            box = psutil.cpu_times()
            cpu["box"] = box.user + box.nice + box.system + box.irq + box.softirq
            cpu["steal"] = getattr(box, "steal", 0.0)
            self.samples.append((now_us(), cpu))

    def cpu_by_second(self, start_us: int) -> dict[int, dict[str, float]]:
        """Cores busy in each whole second from `start_us`: per process, the box's
        ("box": every process on it) and the hypervisor's ("steal": taken from this
        machine's cores by its host's other guests)."""
        by_second: dict[int, dict[str, float]] = {}
        for (t0, cpu0), (t1, cpu1) in itertools.pairwise(self.samples):
            if t0 < start_us:
                continue
            slot = by_second.setdefault((t0 - start_us) // 1_000_000, {})
            for name, used in cpu1.items():
                if name in cpu0:
                    slot[name] = slot.get(name, 0.0) + (used - cpu0[name])
            slot["_seconds"] = slot.get("_seconds", 0.0) + (t1 - t0) / 1e6
        for slot in by_second.values():
            seconds = slot.pop("_seconds")
            for name in slot:
                slot[name] /= max(seconds, 1e-9)
        return by_second

    def _sample(self, name: str, proc: Any) -> None:
        stats = self.stats[name]
        stats.rss_peak = max(stats.rss_peak, proc.memory_info().rss)


def _cpu(proc: Any) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


# The kinds of process a run's box holds besides the servers, in print order.
BOX_KINDS = ("client", "upstream", "redis", "postgres", "other")


@dataclass
class BoxCPU:
    """Every process's CPU on the box between `start` and `stop`, by kind: the servers
    (`servers`: pid to name, "daphne-0" counting as "daphne"), the bench itself (its
    sockets: "client"), the stamping upstream, Redis, PostgreSQL and the rest. On a box
    that runs the clients and the upstream too, this says where its cores went.

    A process that ended during the run (a PostgreSQL backend, say) is not counted: the
    figures are a floor."""

    servers: dict[int, str]
    upstream_marker: str = "_common.py upstream"
    _start: dict[int, tuple[str, float]] = field(default_factory=dict)
    _started_at: float = 0.0
    seconds: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)

    def start(self) -> BoxCPU:
        self._started_at = time.monotonic()
        self._start = self._snapshot()
        return self

    def stop(self) -> dict[str, float]:
        end = self._snapshot()
        self.seconds = time.monotonic() - self._started_at
        self.cpu = {}
        for pid, (kind, cpu) in end.items():
            before = self._start.get(pid)
            spent = cpu - before[1] if before is not None and before[0] == kind else cpu
            self.cpu[kind] = self.cpu.get(kind, 0.0) + spent
        return self.cpu

    def busy_cores(self) -> float:
        """The box's mean number of busy cores over the run."""
        return sum(self.cpu.values()) / max(self.seconds, 1e-9)

    def _snapshot(self) -> dict[int, tuple[str, float]]:
        import psutil

        taken: dict[int, tuple[str, float]] = {}
        for proc in psutil.process_iter(["name", "cmdline"]):
            with contextlib.suppress(psutil.Error):
                taken[proc.pid] = (self._kind(proc), _cpu(proc))
        return taken

    def _kind(self, proc: Any) -> str:
        import os

        if proc.pid in self.servers:
            return self.servers[proc.pid].split("-")[0]
        if proc.pid == os.getpid():
            return "client"
        name = proc.info["name"] or ""
        if name.startswith("redis-server"):
            return "redis"
        if name.startswith("postgres"):
            return "postgres"
        if self.upstream_marker in " ".join(proc.info["cmdline"] or ()):
            return "upstream"
        return "other"


# -- the stamping upstream --------------------------------------------------------------


def stamped_reply(tokens: int, rate: float) -> Reply:
    """`tokens` text tokens at `rate` per second, each `<index>@{t};`.

    The pacing is a `Pause` before each token with no per-event delay, so the stamp is
    taken just before the token's event is written (a per-event delay would sleep
    between rendering and writing, and the stamp would be a whole interval early).
    """
    interval = 1.0 / rate
    steps: list[Step] = []
    for index in range(tokens):
        steps += [Pause(interval), Text(f"{index}@{STAMP};")]
    return Reply(*steps, delay=0.0)


class _StampingRenderer:
    """Wraps a fake's renderer: a text step's `{t}` becomes the time it is rendered."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def start_events(self) -> list[Event]:
        return self._inner.start_events()

    def step_events(self, step: Step) -> list[Event]:
        if isinstance(step, Text) and STAMP in step.text:
            step = Text(step.text.replace(STAMP, str(now_us())))
        return self._inner.step_events(step)

    def error_events(self, step: Any) -> list[Event]:
        return self._inner.error_events(step)

    def finish_events(self) -> list[Event]:
        return self._inner.finish_events()

    def message(self) -> dict[str, Any]:
        return self._inner.message()


class StampingUpstream:
    """The stamping Anthropic upstream: the Messages fake's own renderer (so the same
    event sequence, SSE framing and usage fields), served from one asyncio loop.

    The threaded fake spends a thread per stream; at 200 streams those threads cost the
    bench machine a quarter of a core, charged to the system under test, and their GIL
    hand-offs delayed writes after the stamp. A real provider is another machine: its
    cost should not be measured here.
    """

    def __init__(self, reply: Reply, *, port: int = 0, tls: Any = None) -> None:
        """`tls`: an `ssl.SSLContext` to serve HTTPS with (bench/http_requests.py)."""
        self.reply = reply
        self.port = port
        self.tls = tls
        # Validation, usage estimates and rendering; never started as a server itself.
        self.fake = AnthropicMessagesFake(script=Script(default=reply))
        self.base_url = ""
        self.pacer = _Pacer()

    async def serve(self, ready: Callable[[str], None]) -> None:
        server = await asyncio.start_server(
            self._connection, "127.0.0.1", self.port, backlog=1024, ssl=self.tls
        )
        port = server.sockets[0].getsockname()[1]
        self.base_url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
        ready(self.base_url)
        async with server:
            await server.serve_forever()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._exchange(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """One request and its reply; False when the client closed the connection."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, path, _ = request_line.split(" ", 2)
        headers = {}
        for line in header_lines:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        body = json.loads(raw) if raw else None
        request = RecordedRequest(method, path, headers, body, raw)
        reply = _within_max_tokens(self.reply, body)
        renderer = MessagesRenderer(self.fake, request, reply)
        if not (isinstance(body, dict) and body.get("stream")):
            stamping = _StampingRenderer(renderer)
            for step in reply.steps:
                if isinstance(step, Pause):
                    await asyncio.sleep(step.seconds)
                else:
                    stamping.step_events(step)
            payload = json.dumps(stamping.message()).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                + f"content-length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
            return True
        head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n"
            + f"request-id: req_{secrets.token_hex(12)}\r\n\r\n".encode()
        )
        stream = _Stream(writer.transport, _rendered_ticks(renderer, reply, head))
        self.pacer.start(stream)
        await stream.done
        return not writer.transport.is_closing()


def _within_max_tokens(reply: Reply, body: Any) -> Reply:
    """The reply cut at the request's `max_tokens` (one stamped token is one token), as
    the API does, `stop_reason` "max_tokens": a session title asks for a few words, not
    the whole 100-token reply."""
    limit = body.get("max_tokens") if isinstance(body, dict) else None
    texts = sum(isinstance(step, Text) for step in reply.steps)
    if not isinstance(limit, int) or limit >= texts:
        return reply
    steps: list[Step] = []
    for step in reply.steps:
        if isinstance(step, Text):
            if limit == 0:
                break
            limit -= 1
        steps.append(step)
    return Reply(*steps, delay=reply.delay, stop="max_tokens")


# A tick: the pause before it, then its events' SSE frames, each split at the stamp
# (`(before, after)`, or `(frame, None)` for a frame without one).
Tick = tuple[float, list[tuple[bytes, bytes | None]]]


def _rendered_ticks(renderer: MessagesRenderer, reply: Reply, head: bytes) -> list[Tick]:
    """The whole streamed reply rendered once, up front, by the fake's own renderer: what
    is left per token is the stamp and a write. The stamp's placeholder goes through the
    renderer untouched (one token is one delta piece) and is filled at write time."""
    ticks: list[Tick] = [(0.0, [(head, None)])]
    ticks[0][1].extend(_frames(renderer.start_events()))
    for step in reply.steps:
        if isinstance(step, Pause):
            ticks.append((step.seconds, []))
        else:
            ticks[-1][1].extend(_frames(renderer.step_events(step)))
    ticks[-1][1].extend(_frames(renderer.finish_events()))
    ticks[-1][1].append((b"0\r\n\r\n", None))
    return ticks


def _frames(events: list[Event]) -> list[tuple[bytes, bytes | None]]:
    """One chunk per event, like the threaded fake (and the real API); the chunk's size
    line is written with the stamp (`_Stream.write_tick`)."""
    frames: list[tuple[bytes, bytes | None]] = []
    for name, data in events:
        payload = data if isinstance(data, str) else compact_json.dumps(data)
        frame = ((f"event: {name}\n" if name else "") + f"data: {payload}\n\n").encode()
        before, stamp, after = frame.partition(STAMP.encode())
        frames.append((before, after) if stamp else (_chunk(frame), None))
    return frames


def _chunk(frame: bytes) -> bytes:
    return f"{len(frame):x}\r\n".encode() + frame + b"\r\n"


@dataclass(eq=False)
class _Stream:
    """One streamed reply being written: its transport, its ticks, the next one due."""

    transport: asyncio.BaseTransport
    ticks: list[Tick]
    next: int = 0
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def write_tick(self) -> None:
        """Write the next tick, each stamp taken right before its bytes go out."""
        out: list[bytes] = []
        for before, after in self.ticks[self.next][1]:
            if after is None:
                out.append(before)
            else:
                frame = before + str(now_us()).encode() + after
                out.append(_chunk(frame))
        self.transport.write(b"".join(out))  # type: ignore[attr-defined]
        self.next += 1

    def finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


class _Pacer:
    """Every reply's next tick on one timer, not a sleeping task per stream: at 500
    streams of 20 tokens a second, a task's wake-up, sleep and drain per token were most
    of this process's CPU, which the box under test paid. A wake-up writes every tick due
    within `GRAIN` of it (each stamped when written); a stream's next tick is due its
    pause after the later of this write and its own due time, so no stream runs fast."""

    GRAIN = 0.002
    # A stream whose client reads slower than this much buffered waits (back-pressure).
    HIGH_WATER = 256 * 1024
    RETRY = 0.01

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Stream]] = []
        self._order = 0
        self._handle: asyncio.TimerHandle | None = None
        self._wake_at = math.inf

    def start(self, stream: _Stream) -> None:
        self._push(asyncio.get_running_loop().time(), stream)
        self._wake(self._heap[0][0])

    def _push(self, due: float, stream: _Stream) -> None:
        self._order += 1
        heapq.heappush(self._heap, (due, self._order, stream))

    def _wake(self, at: float) -> None:
        """Wake at `at` unless already due to wake before."""
        if at < self._wake_at:
            if self._handle is not None:
                self._handle.cancel()
            self._wake_at = at
            self._handle = asyncio.get_running_loop().call_at(at, self._run)

    def _run(self) -> None:
        loop = asyncio.get_running_loop()
        self._handle, self._wake_at = None, math.inf
        horizon = loop.time() + self.GRAIN
        again: list[tuple[float, _Stream]] = []
        while self._heap and self._heap[0][0] <= horizon:
            due, _, stream = heapq.heappop(self._heap)
            transport = stream.transport
            if transport.is_closing():
                stream.finish()
                continue
            if transport.get_write_buffer_size() > self.HIGH_WATER:  # type: ignore[attr-defined]
                again.append((loop.time() + self.RETRY, stream))
                continue
            stream.write_tick()
            if stream.next == len(stream.ticks):
                stream.finish()
                continue
            again.append((max(due, loop.time()) + stream.ticks[stream.next][0], stream))
        for due, stream in again:
            self._push(due, stream)
        if self._heap:
            self._wake(self._heap[0][0])


def run_on_serving_loop(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)` on the loop the servers run on (uvloop where installed,
    `openworker/event_loop.py`). The bench's clients and upstream share the box with
    the system they measure: on asyncio's own loop they took about a third of its CPU
    (`BoxCPU`), which a deployment's clients and providers, on other machines, do not."""
    from openworker.event_loop import new_event_loop

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)


def parse_tokens(text: str) -> list[tuple[int, int]]:
    """(index, emit time in µs) of every stamped token in `text`."""
    return [(int(i), int(t)) for i, t in TOKEN_RE.findall(text)]


@contextlib.contextmanager
def upstream_process(
    tokens: int, rate: float, *, tls: tuple[Path, Path] | None = None
) -> Iterator[str]:
    """Run the stamping upstream as a subprocess; yields its base URL, stops it after.
    `tls`: (certificate, key) PEM files to serve HTTPS with."""
    command = [sys.executable, str(Path(__file__).resolve()), "upstream"]
    command += ["--tokens", str(tokens), "--rate", str(rate)]
    if tls is not None:
        command += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert process.stdout is not None
        base_url = process.stdout.readline().strip()
        if not base_url.startswith(("http://", "https://")):
            raise RuntimeError("the stamping upstream did not start")
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _upstream_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench/_common.py upstream")
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--rate", type=float, default=20.0, help="tokens per second")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-key", help="and this key (PEM)")
    args = parser.parse_args(argv)
    tls = None
    if args.tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.tls_cert, args.tls_key)
    reply = stamped_reply(args.tokens, args.rate)
    upstream = StampingUpstream(reply, port=args.port, tls=tls)

    def ready(base_url: str) -> None:
        sys.stdout.write(base_url + "\n")
        sys.stdout.flush()

    with contextlib.suppress(KeyboardInterrupt):
        run_on_serving_loop(upstream.serve(ready))


if __name__ == "__main__":
    if sys.argv[1:2] != ["upstream"]:
        sys.exit("usage: python bench/_common.py upstream [--tokens N] [--rate R]")
    _upstream_main(sys.argv[2:])
