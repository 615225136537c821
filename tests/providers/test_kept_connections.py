"""Provider connections kept across turns (`providers.kept_connections`): each turn has its
own `Transport`, and the next turn to the same address takes the connection the last one
finished with, unless the upstream closed it, its body was not read to the end, or it
was idle too long."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpcore

from providers.kept_connections import (
    KeptConnections,
    _target,
    aclose_loop_keeper,
    loop_keeper,
)
from providers.outbound import OutboundPolicy
from providers.transport import Transport

LOCAL = OutboundPolicy(allowlist=["127.0.0.1"])
HEADERS = {"x-api-key": "sk-test-kept-0123456789"}
EVENTS = b"event: ping\ndata: {}\n\nevent: done\ndata: {}\n\n"


@dataclass
class Upstream:
    """An HTTP/1.1 upstream on asyncio that counts its connections. `close_idle`: it
    closes a connection after each reply (as a server's idle timeout would, unannounced);
    `drop_second`: it drops a connection's second request unanswered (its idle timeout
    racing the request); `drip`: its stream sends one event, then waits to be hung up on."""

    close_idle: bool = False
    drop_second: bool = False
    drip: bool = False
    connections: int = 0
    requests: int = 0
    hangups: int = 0
    port: int = 0
    server: asyncio.AbstractServer | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/messages"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    self.hangups += 1
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                served += 1
                self.requests += 1
                if self.drop_second and served == 2:
                    return
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                )
                if self.drip:
                    writer.write(b"%x\r\n%s\r\n" % (len(EVENTS), EVENTS))
                    await writer.drain()
                    if await reader.read(1) == b"":
                        self.hangups += 1
                    return
                writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(EVENTS), EVENTS))
                await writer.drain()
                if self.close_idle:
                    return
        finally:
            writer.close()

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        # Connections still open would keep `wait_closed` waiting (Python 3.12+).
        self.server.close_clients() if hasattr(self.server, "close_clients") else None
        await self.server.wait_closed()


@contextlib.asynccontextmanager
async def upstream(**options: bool) -> AsyncIterator[Upstream]:
    server = Upstream(**options)
    await server.start()
    try:
        yield server
    finally:
        await aclose_loop_keeper()
        await server.close()


async def turn(url: str, *, events: int | None = None) -> list[str]:
    """What a turn does: its own Transport, one streamed request, then the Transport closed.
    `events`: stop reading after that many (the page's Stop, say)."""
    waits: list[float] = []
    transport = Transport(policy=LOCAL, sleep=waits.append)
    got = []
    stream = transport.astream_sse(url, headers=HEADERS, body={"n": 1}, model="m")
    try:
        async for event in stream:
            got.append(event.event)
            if events is not None and len(got) == events:
                break
    finally:
        await stream.aclose()
        await transport.aclose()
    assert waits == []  # never the transport's retry: the keeper took care of it
    return got


def test_turns_on_one_loop_take_the_connection_the_last_one_finished_with():
    async def main() -> None:
        async with upstream() as server:
            for _ in range(3):
                assert await turn(server.url) == ["ping", "done"]
            assert (server.connections, server.requests) == (1, 3)
            assert loop_keeper().idle_count() == 1

    asyncio.run(main())


def test_a_connection_the_upstream_closed_while_idle_is_not_reused():
    async def main() -> None:
        async with upstream(close_idle=True) as server:
            assert await turn(server.url) == ["ping", "done"]
            await asyncio.sleep(0.05)  # the upstream's close arrives
            assert await turn(server.url) == ["ping", "done"]
            assert (server.connections, server.requests) == (2, 2)

    asyncio.run(main())


def test_a_request_the_upstream_drops_on_a_kept_connection_goes_again_on_a_new_one():
    async def main() -> None:
        async with upstream(drop_second=True) as server:
            assert await turn(server.url) == ["ping", "done"]
            # The second request reaches the kept connection, which the upstream closes
            # unanswered: it is sent once more on a connection of its own, at once.
            assert await turn(server.url) == ["ping", "done"]
            assert server.connections == 2
            assert server.requests == 3

    asyncio.run(main())


def test_a_reply_left_before_its_end_does_not_leave_its_connection_kept():
    async def main() -> None:
        async with upstream(drip=True) as server:
            assert await turn(server.url, events=1) == ["ping"]
            for _ in range(50):
                if server.hangups:
                    break
                await asyncio.sleep(0.02)
            assert server.hangups == 1  # the upstream saw the disconnect
            assert loop_keeper().idle_count() == 0

    asyncio.run(main())


def test_closing_the_loops_keeper_closes_its_idle_connections():
    async def main() -> None:
        async with upstream() as server:
            await turn(server.url)
            assert loop_keeper().idle_count() == 1
            await aclose_loop_keeper()
            for _ in range(50):
                if server.hangups:
                    break
                await asyncio.sleep(0.02)
            assert server.hangups == 1
            await turn(server.url)  # a new keeper, a new connection
            assert server.connections == 2

    asyncio.run(main())


def test_a_connection_idle_past_its_keepalive_is_closed_not_reused():
    async def main() -> None:
        async with upstream() as server:
            keeper = KeptConnections(keepalive_seconds=0.05)
            for pause in (0.0, 0.2):
                await asyncio.sleep(pause)
                request = httpcore.Request(
                    "POST",
                    server.url,
                    headers={"Host": "127.0.0.1", "Content-Length": "2"},
                    content=b"{}",
                )
                response = await keeper.handle_async_request(request)
                async for _ in response.stream:
                    pass
                await response.stream.aclose()
            assert server.connections == 2
            assert keeper.idle_count() == 1
            await keeper.aclose()

    asyncio.run(main())


def test_a_connection_is_only_for_the_address_port_and_tls_name_it_was_opened_for():
    def target(url: str, sni: str | None = None, context: object = None) -> object:
        extensions = {"sni_hostname": sni} if sni else {}
        return _target(httpcore.Request("POST", url, extensions=extensions), context)

    plain = target("http://203.0.113.7:80/v1")
    assert plain == target("http://203.0.113.7:80/other/path")
    assert plain != target("http://203.0.113.8:80/v1")
    assert plain != target("http://203.0.113.7:8080/v1")
    tls = target("https://203.0.113.7/v1", "api.example.com", "ctx")
    assert tls == target("https://203.0.113.7/v2", "api.example.com", "ctx")
    assert tls != target("https://203.0.113.7/v1", "other.example.com", "ctx")
    assert tls != target("https://203.0.113.7/v1", "api.example.com", "another ctx")
