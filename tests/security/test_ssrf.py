"""SSRF through the real outbound path: `Transport.post_json`, `Transport.astream_sse` (read
as the blocking `stream()` reads it) and the `fetch_url` tool, each over the guard
(`AsyncGuardedTransport`; `GuardedTransport` for the tool), against hostile targets.

A recording HTTP server listens on loopback; every hostile URL names its port, so a
guard that let a loopback-bound request through would show up as a recorded request.
The policy is the distributed one (no loopback, no private range) unless a test sets
an allow-list. Host names resolve through an injected resolver (no real DNS): the
resolver is the "DNS answer" an attacker controls.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from openworker.runtime.agent.tools import ToolContext
from openworker.runtime.agent.tools.fetch_url import FetchUrlTool
from providers import blocking
from providers.errors import OutboundBlockedError, ProviderError
from providers.outbound import OutboundPolicy
from providers.transport import Transport
from tests.security.figures import record

KEY = "sk-ssrf-canary-1a2b3c4d5e6f"
# Short: a refused request never connects, and a leak to a private address must fail
# fast instead of hanging the suite.
CONNECT_TIMEOUT = 0.5


class Sink(BaseHTTPRequestHandler):
    """Records every request; `/redirect` answers 302 to the metadata address."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.server.hits.append((self.command, self.path, dict(self.headers)))  # type: ignore[attr-defined]
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _answer
    do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def sink() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    httpd.daemon_threads = True
    httpd.hits = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def port(sink: ThreadingHTTPServer) -> int:
    sink.hits.clear()  # type: ignore[attr-defined]
    return int(sink.server_address[1])


class Resolver:
    """The attacker's DNS: fixed answers, counting lookups."""

    ANSWERS: dict[str, list[str]] = {
        "localhost": ["127.0.0.1", "::1"],
        "loop.attacker.example": ["127.0.0.1"],
        "loop6.attacker.example": ["::1"],
        "mapped.attacker.example": ["::ffff:127.0.0.1"],
        "metadata.google.internal": ["169.254.169.254"],
        "meta.attacker.example": ["169.254.169.254"],
        "private.attacker.example": ["10.0.0.5"],
        "lan.attacker.example": ["192.168.0.10"],
        "cgnat.attacker.example": ["100.64.0.9"],
        "ula.attacker.example": ["fd00::5"],
        "linklocal6.attacker.example": ["fe80::1"],
        "nat64.attacker.example": ["64:ff9b::7f00:1"],
        "sixtofour.attacker.example": ["2002:7f00:1::1"],
        "zero.attacker.example": ["0.0.0.0"],
        "multicast.attacker.example": ["239.1.1.1"],
        # One public answer hiding one private one: every answer must pass.
        "mixed.attacker.example": ["93.184.216.34", "127.0.0.1"],
        "ollama.lan": ["127.0.0.1"],
    }

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        try:
            return list(self.ANSWERS[host])
        except KeyError:
            raise OSError(f"NXDOMAIN {host}") from None


def hostile_urls(port: int) -> list[str]:
    """At least forty spellings of "somewhere the server must not go"."""
    p = port
    return [
        # loopback, private, link-local, metadata, shared, unspecified, multicast literals
        f"http://127.0.0.1:{p}/v1",
        f"http://127.9.9.9:{p}/v1",
        f"http://10.0.0.1:{p}/v1",
        f"http://172.16.0.1:{p}/v1",
        f"http://192.168.1.1:{p}/v1",
        f"http://169.254.169.254:{p}/latest/meta-data/",
        f"http://169.254.10.10:{p}/v1",
        f"http://100.64.0.1:{p}/v1",
        f"http://100.100.100.200:{p}/v1",
        f"http://168.63.129.16:{p}/v1",
        f"http://0.0.0.0:{p}/v1",
        f"http://224.0.0.1:{p}/v1",
        f"http://239.255.255.250:{p}/v1",
        f"http://255.255.255.255:{p}/v1",
        f"http://240.0.0.1:{p}/v1",
        f"http://127.0.0.1.:{p}/v1",
        # IPv6 literals, mapped / translated / 6to4 / compatible forms of forbidden IPv4
        f"http://[::1]:{p}/v1",
        f"http://[::]:{p}/v1",
        f"http://[fe80::1]:{p}/v1",
        f"http://[fc00::1]:{p}/v1",
        f"http://[fd00:ec2::254]:{p}/v1",
        f"http://[ff02::1]:{p}/v1",
        f"http://[::ffff:127.0.0.1]:{p}/v1",
        f"http://[::ffff:7f00:1]:{p}/v1",
        f"http://[::ffff:169.254.169.254]:{p}/v1",
        f"http://[::ffff:0:7f00:1]:{p}/v1",
        f"http://[64:ff9b::7f00:1]:{p}/v1",
        f"http://[64:ff9b::a9fe:a9fe]:{p}/v1",
        f"http://[2002:7f00:1::]:{p}/v1",
        f"http://[::127.0.0.1]:{p}/v1",
        f"http://[fe80::1%25lo]:{p}/v1",
        # decimal, octal, hex and short IPv4 spellings
        f"http://2130706433:{p}/v1",
        f"http://017700000001:{p}/v1",
        f"http://0x7f000001:{p}/v1",
        f"http://0177.0.0.1:{p}/v1",
        f"http://0x7f.0.0.1:{p}/v1",
        f"http://0x7f.1:{p}/v1",
        f"http://127.1:{p}/v1",
        f"http://127.0.1:{p}/v1",
        f"http://127.000.000.001:{p}/v1",
        f"http://2852039166:{p}/latest/meta-data/",
        # userinfo and backslash parser tricks
        f"http://user@127.0.0.1:{p}/v1",
        f"http://api.openai.com@127.0.0.1:{p}/v1",
        f"http://user:pass@api.openai.com:{p}/v1",
        f"http://api.openai.com\\@127.0.0.1:{p}/v1",
        f"http://127.0.0.1:{p}\\@api.openai.com/v1",
        f"http://api.openai.com\\.127.0.0.1:{p}/v1",
        # schemes that are not http(s)
        f"file:///etc/passwd?{p}",
        f"gopher://127.0.0.1:{p}/_POST",
        f"ftp://127.0.0.1:{p}/",
        f"dict://127.0.0.1:{p}/info",
        f"ws://127.0.0.1:{p}/v1",
        # names whose (attacker-controlled) DNS answers are internal
        f"http://localhost:{p}/v1",
        f"http://loop.attacker.example:{p}/v1",
        f"http://loop6.attacker.example:{p}/v1",
        f"http://mapped.attacker.example:{p}/v1",
        f"http://metadata.google.internal:{p}/computeMetadata/v1/",
        f"http://meta.attacker.example:{p}/v1",
        f"http://private.attacker.example:{p}/v1",
        f"http://lan.attacker.example:{p}/v1",
        f"http://cgnat.attacker.example:{p}/v1",
        f"http://ula.attacker.example:{p}/v1",
        f"http://linklocal6.attacker.example:{p}/v1",
        f"http://nat64.attacker.example:{p}/v1",
        f"http://sixtofour.attacker.example:{p}/v1",
        f"http://zero.attacker.example:{p}/v1",
        f"http://multicast.attacker.example:{p}/v1",
        f"http://mixed.attacker.example:{p}/v1",
        f"http://ollama.lan:{p}/v1",
    ]


def distributed_policy(resolver: Resolver, allowlist: tuple[str, ...] = ()) -> OutboundPolicy:
    return OutboundPolicy(allowlist, allow_loopback=False, resolver=resolver)


def transport(policy: OutboundPolicy) -> Transport:
    return Transport(policy=policy, connect_timeout=CONNECT_TIMEOUT, max_retries=0)


HEADERS = {"Authorization": f"Bearer {KEY}"}
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def refused(call: Any) -> OutboundBlockedError:
    """Run `call`; it must be refused by the guard (a typed, friendly ProviderError)."""
    with pytest.raises(OutboundBlockedError) as caught:
        call()
    assert KEY not in str(caught.value) and KEY not in caught.value.raw_message
    return caught.value


def test_there_are_at_least_forty_distinct_hostile_targets() -> None:
    urls = hostile_urls(1234)
    assert len(set(urls)) == len(urls) >= 40


def test_post_json_refuses_every_hostile_target(sink: ThreadingHTTPServer, port: int) -> None:
    client = transport(distributed_policy(Resolver()))
    urls = hostile_urls(port)
    try:
        for url in urls:
            refused(lambda url=url: client.post_json(url, headers=HEADERS, body=BODY, model="m"))
    finally:
        client.close()
    assert sink.hits == []  # type: ignore[attr-defined]
    record("ssrf.post_json", len(urls), "hostile targets refused through Transport.post_json")


def test_stream_sse_refuses_every_hostile_target(sink: ThreadingHTTPServer, port: int) -> None:
    client = transport(distributed_policy(Resolver()))
    urls = hostile_urls(port)
    try:
        for url in urls:
            refused(
                lambda url=url: list(
                    blocking.iterate(client.astream_sse(url, headers=HEADERS, body=BODY, model="m"))
                )
            )
    finally:
        client.close()
    assert sink.hits == []  # type: ignore[attr-defined]
    record("ssrf.stream_sse", len(urls), "hostile targets refused through Transport.astream_sse")


def test_fetch_url_refuses_every_hostile_target(sink: ThreadingHTTPServer, port: int) -> None:
    ctx = ToolContext("s1", Path("/nonexistent"), distributed_policy(Resolver()))
    urls = hostile_urls(port)
    for url in urls:
        result = FetchUrlTool().run({"url": url}, ctx)
        assert result.is_error, url
        assert "refused" in result.content, (url, result.content)
    assert sink.hits == []  # type: ignore[attr-defined]
    record("ssrf.fetch_url", len(urls), "hostile targets refused by the fetch_url tool")


def test_the_same_targets_reach_the_sink_without_the_guard_proving_the_sink_listens(
    sink: ThreadingHTTPServer, port: int
) -> None:
    # Control: an allow-listed loopback request does arrive, so "no hits" above means
    # "refused", not "the sink was deaf".
    policy = OutboundPolicy(["127.0.0.1"], resolver=Resolver())
    client = transport(policy)
    try:
        assert client.post_json(
            f"http://127.0.0.1:{port}/v1", headers=HEADERS, body=BODY, model="m"
        )
    finally:
        client.close()
    assert len(sink.hits) == 1  # type: ignore[attr-defined]


class Rebinding(Resolver):
    """First answer public, every later answer loopback: the classic DNS rebinding."""

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        return ["93.184.216.34"] if len(self.calls) == 1 else ["127.0.0.1"]


def test_a_dns_answer_that_changes_after_the_check_is_never_connected_to(
    sink: ThreadingHTTPServer, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    looked_up: list[Any] = []
    real = socket.getaddrinfo

    def spy(host: Any, *args: Any, **kwargs: Any) -> Any:
        looked_up.append(host)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", spy)
    resolver = Rebinding()
    client = transport(distributed_policy(resolver))
    try:
        with pytest.raises(ProviderError):
            client.post_json(
                f"http://rebind.attacker.example:{port}/v1", headers=HEADERS, body=BODY, model="m"
            )
    finally:
        client.close()
    # One lookup, by the guard; the connection went to the checked public address (which
    # is unreachable here), never to a second answer, and the system resolver was never
    # asked for the name.
    assert resolver.calls == ["rebind.attacker.example"]
    assert "rebind.attacker.example" not in looked_up
    assert sink.hits == []  # type: ignore[attr-defined]
    record("ssrf.rebinding", 1, "DNS-rebinding attempt connected only to the checked address")


def test_the_connection_goes_to_the_checked_address_with_the_original_host_header(
    sink: ThreadingHTTPServer, port: int
) -> None:
    class Flip(Resolver):
        def __call__(self, host: str, port: int) -> list[str]:
            self.calls.append(host)
            return ["127.0.0.1"] if len(self.calls) == 1 else ["10.9.9.9"]

    resolver = Flip()
    client = transport(OutboundPolicy(["127.0.0.1"], resolver=resolver))
    try:
        client.post_json(f"http://flip.example:{port}/v1", headers=HEADERS, body=BODY, model="m")
    finally:
        client.close()
    assert resolver.calls == ["flip.example"]
    (_method, _path, headers) = sink.hits[0]  # type: ignore[attr-defined]
    assert headers["Host"] == f"flip.example:{port}"


def test_redirects_are_not_followed_by_the_transport(sink: ThreadingHTTPServer, port: int) -> None:
    client = transport(OutboundPolicy(["127.0.0.1"], resolver=Resolver()))
    try:
        with pytest.raises(ProviderError) as caught:
            client.post_json(
                f"http://127.0.0.1:{port}/redirect", headers=HEADERS, body=BODY, model="m"
            )
    finally:
        client.close()
    assert caught.value.status == 302
    assert KEY not in str(caught.value)
    assert [hit[1] for hit in sink.hits] == ["/redirect"]  # type: ignore[attr-defined]
    record("ssrf.redirects", 2, "redirects to metadata not followed (transport, fetch_url)")


def test_redirects_are_not_followed_by_fetch_url(sink: ThreadingHTTPServer, port: int) -> None:
    ctx = ToolContext(
        "s1", Path("/nonexistent"), OutboundPolicy(["127.0.0.1"], resolver=Resolver())
    )
    result = FetchUrlTool().run({"url": f"http://127.0.0.1:{port}/redirect"}, ctx)
    assert "169.254.169.254" in result.content
    assert [hit[1] for hit in sink.hits] == ["/redirect"]  # type: ignore[attr-defined]


def test_the_allow_list_is_the_only_way_to_a_private_host(
    sink: ThreadingHTTPServer, port: int
) -> None:
    url = f"http://ollama.lan:{port}/v1"
    closed = transport(distributed_policy(Resolver()))
    opened = transport(distributed_policy(Resolver(), allowlist=("ollama.lan",)))
    cidr = transport(distributed_policy(Resolver(), allowlist=("127.0.0.0/8",)))
    try:
        refused(lambda: closed.post_json(url, headers=HEADERS, body=BODY, model="m"))
        assert sink.hits == []  # type: ignore[attr-defined]
        opened.post_json(url, headers=HEADERS, body=BODY, model="m")
        cidr.post_json(url, headers=HEADERS, body=BODY, model="m")
        # Allow-listing one name admits neither other names nor the metadata address.
        refused(
            lambda: opened.post_json(
                f"http://private.attacker.example:{port}/v1", headers=HEADERS, body=BODY, model="m"
            )
        )
    finally:
        for client in (closed, opened, cidr):
            client.close()
    meta = distributed_policy(Resolver(), allowlist=("metadata.google.internal",))
    with pytest.raises(OutboundBlockedError):
        meta.check_url("http://metadata.google.internal/")
    assert len(sink.hits) == 2  # type: ignore[attr-defined]
    record("ssrf.allowlist", 4, "allow-list cases (only the listed host or CIDR gets through)")
