"""The web process's reactor: Twisted's writes flushed on the loop's next turn, epoll only
when a socket would block. Real TCP sockets on loopback: a Twisted server protocol on a
`FlushingReactor` (not installed: its own loop) and an asyncio client on the same loop."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from twisted.internet.protocol import Factory, Protocol

from openworker.web_reactor import FlushingReactor

LOOPS = ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") else [])


class _Server(Protocol):
    def __init__(self, on_connect: Callable[[Any], None], lost: list[Any]) -> None:
        self.on_connect = on_connect
        self.lost = lost

    def connectionMade(self) -> None:
        self.on_connect(self.transport)

    def connectionLost(self, reason: Any) -> None:
        self.lost.append(reason)


@pytest.fixture(params=LOOPS)
def reactor_on_loop(request) -> Iterator[tuple[FlushingReactor, asyncio.AbstractEventLoop]]:
    if request.param == "uvloop":
        import uvloop

        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    reactor = FlushingReactor(loop)
    yield reactor, loop
    loop.close()


def _serve(reactor: FlushingReactor, on_connect: Callable[[Any], None], lost: list[Any]) -> Any:
    factory = Factory.forProtocol(lambda: _Server(on_connect, lost))
    return reactor.listenTCP(0, factory, interface="127.0.0.1")


def _spy(loop: asyncio.AbstractEventLoop) -> list[int]:
    """The descriptors the reactor registers for writability, as they are registered."""
    registered: list[int] = []
    add_writer = loop.add_writer

    def spying(fd: Any, *args: Any) -> Any:
        registered.append(fd)
        return add_writer(fd, *args)

    loop.add_writer = spying  # type: ignore[method-assign]
    return registered


def _counting_sends(transport: Any) -> list[int]:
    sizes: list[int] = []
    write_some = transport.writeSomeData

    def counting(data: Any) -> Any:
        sent = write_some(data)
        if isinstance(sent, int):
            sizes.append(sent)
        return sent

    transport.writeSomeData = counting
    return sizes


def test_a_turns_writes_go_out_in_one_send_without_registering_the_socket(reactor_on_loop):
    reactor, loop = reactor_on_loop
    registered = _spy(loop)
    sends: list[int] = []

    def on_connect(transport: Any) -> None:
        transport_sends = _counting_sends(transport)
        for frame in (b"first ", b"second ", b"third"):
            transport.write(frame)
        loop.call_later(0.05, lambda: sends.extend(transport_sends))

    port = _serve(reactor, on_connect, [])

    async def read() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port.getHost().port)
        data = await reader.readexactly(len(b"first second third"))
        await asyncio.sleep(0.1)
        writer.close()
        return data

    assert loop.run_until_complete(read()) == b"first second third"
    assert sends == [len(b"first second third")]
    assert registered == []
    port.stopListening()


def test_a_write_larger_than_the_socket_takes_waits_for_epoll_and_arrives_whole(
    reactor_on_loop,
):
    reactor, loop = reactor_on_loop
    registered = _spy(loop)
    payload = bytes(range(256)) * (64 * 1024)  # 16 MiB: more than any socket buffer
    lost: list[Any] = []

    def on_connect(transport: Any) -> None:
        transport.write(payload)
        transport.loseConnection()

    port = _serve(reactor, on_connect, lost)

    async def read() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port.getHost().port)
        received = bytearray()
        while chunk := await reader.read(256 * 1024):
            received += chunk
            await asyncio.sleep(0)  # a slow reader: the server's socket fills up
        writer.close()
        return bytes(received)

    assert loop.run_until_complete(read()) == payload
    assert len(registered) >= 1  # the rest of the buffer waited for writability
    loop.run_until_complete(asyncio.sleep(0.05))
    assert len(lost) == 1 and reactor.getWriters() == []
    port.stopListening()


def test_write_then_lose_connection_delivers_the_bytes_then_closes(reactor_on_loop):
    reactor, loop = reactor_on_loop
    lost: list[Any] = []

    def on_connect(transport: Any) -> None:
        transport.write(b"goodbye")
        transport.loseConnection()

    port = _serve(reactor, on_connect, lost)

    async def read() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port.getHost().port)
        data = await reader.read()  # to EOF
        writer.close()
        return data

    assert loop.run_until_complete(read()) == b"goodbye"
    loop.run_until_complete(asyncio.sleep(0.05))
    assert len(lost) == 1
    port.stopListening()


def test_writing_to_a_peer_that_reset_loses_the_connection_without_raising(reactor_on_loop):
    reactor, loop = reactor_on_loop
    lost: list[Any] = []
    transports: list[Any] = []
    port = _serve(reactor, transports.append, lost)

    async def connect_and_reset() -> None:
        _reader, writer = await asyncio.open_connection("127.0.0.1", port.getHost().port)
        while not transports:
            await asyncio.sleep(0.01)
        sock = writer.get_extra_info("socket")
        # SO_LINGER 0: closing sends RST, so the server's next send fails.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.transport.abort()
        await asyncio.sleep(0.05)
        for _ in range(3):
            transports[0].write(b"x" * 1024)
            await asyncio.sleep(0.05)

    loop.run_until_complete(connect_and_reset())
    assert len(lost) == 1
    assert reactor.getWriters() == []
    port.stopListening()
