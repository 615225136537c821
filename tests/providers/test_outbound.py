from __future__ import annotations

import http.server
import threading

import httpcore
import httpx
import pytest

from providers.errors import OutboundBlockedError, UpstreamUnavailableError
from providers.outbound import ALLOWLIST_ENV, GuardedTransport, OutboundPolicy, ResolvedTarget

DNS = {
    "api.example.com": ["93.184.216.34"],
    "dual.example.com": ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"],
    "localhost": ["127.0.0.1", "::1"],
    "metadata.google.internal": ["169.254.169.254"],
    "internal.corp": ["10.1.2.3"],
    "mixed.example.com": ["93.184.216.34", "10.0.0.7"],
    "v6loop.example.com": ["::1"],
    "mapped.example.com": ["::ffff:127.0.0.1"],
    "cgnat.example.com": ["100.64.1.1"],
    "ula.example.com": ["fd12:3456::1"],
    "nat64.example.com": ["64:ff9b::a9fe:a9fe"],
    "scoped.example.com": ["fe80::1%eth0"],
    "ollama.lan": ["192.168.1.20"],
}


def resolver(host: str, port: int) -> list[str]:
    try:
        return DNS[host]
    except KeyError:
        raise OSError(f"no such host {host}") from None


def policy(**kwargs) -> OutboundPolicy:
    return OutboundPolicy(resolver=resolver, **kwargs)


HOSTILE = [
    # loopback, private, link-local, metadata, shared, special IPv4 literals
    "http://127.0.0.1/",
    "http://127.1.2.3:8080/",
    "http://10.0.0.1/",
    "http://172.16.0.1/",
    "http://172.31.255.255/",
    "http://192.168.1.1/",
    "http://169.254.169.254/latest/meta-data/",
    "http://169.254.1.1/",
    "http://100.64.0.1/",
    "http://100.100.100.200/",
    "http://0.0.0.0/",
    "http://224.0.0.1/",
    "http://255.255.255.255/",
    "http://240.0.0.1/",
    "http://192.0.0.1/",
    "http://198.18.0.1/",
    "http://127.0.0.1./",
    # IPv6 literals and IPv6 forms embedding forbidden IPv4
    "http://[::1]/",
    "http://[::]/",
    "http://[fe80::1]/",
    "http://[fc00::1]/",
    "http://[fd00:ec2::254]/",
    "http://[ff02::1]/",
    "http://[fec0::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:169.254.169.254]/",
    "http://[::ffff:10.0.0.1]/",
    "http://[::ffff:0:7f00:1]/",
    "http://[64:ff9b::7f00:1]/",
    "http://[64:ff9b::a9fe:a9fe]/",
    "http://[64:ff9b:1::1]/",
    "http://[2002:7f00:1::]/",
    "http://[2002:a9fe:a9fe::1]/",
    "http://[::127.0.0.1]/",
    "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",
    "http://[fe80::1%25eth0]/",
    # non-canonical IPv4 spellings
    "http://2130706433/",
    "http://0177.0.0.1/",
    "http://0x7f.1/",
    "http://0x7f000001/",
    "http://127.1/",
    "http://017700000001/",
    "http://0x7f.0.0.1/",
    "http://127.0.0.01/",
    "http://1.2.3.4.5/",
    "http://example.0x10/",
    "http://example.123/",
    # schemes, credentials, backslashes, junk
    "file:///etc/passwd",
    "gopher://127.0.0.1:6379/_INFO",
    "ftp://api.example.com/",
    "ws://api.example.com/",
    "http://user@api.example.com/",
    "http://user:pass@api.example.com/",
    "http://api.example.com@127.0.0.1/",
    "http://api.example.com\\@127.0.0.1/",
    "http://api.example.com\\.evil/",
    "http://api.exa mple.com/",
    "http://api.example.com/\r\nHost: evil",
    "http:///path-only",
    # DNS names whose answers are forbidden (every address is checked)
    "http://localhost:11434/v1",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://internal.corp/",
    "http://mixed.example.com/",
    "http://v6loop.example.com/",
    "http://mapped.example.com/",
    "http://cgnat.example.com/",
    "http://ula.example.com/",
    "http://nat64.example.com/",
    "http://scoped.example.com/",
    "http://ollama.lan/",
]


@pytest.mark.parametrize("url", HOSTILE)
def test_hostile_targets_are_refused(url):
    with pytest.raises(OutboundBlockedError) as caught:
        policy().check_url(url)
    assert caught.value.kind == "blocked"
    assert caught.value.raw_message


def test_there_are_at_least_forty_hostile_targets():
    assert len(HOSTILE) >= 40


def test_public_literal_passes():
    assert policy().check_url("https://93.184.216.34/v1") == ResolvedTarget(
        scheme="https", host="93.184.216.34", port=443, addresses=["93.184.216.34"]
    )


def test_public_name_passes_with_every_address():
    target = policy().check_url("https://dual.example.com:8443/v1/messages")
    assert target.host == "dual.example.com"
    assert target.port == 8443
    assert target.addresses == DNS["dual.example.com"]


def test_ipv6_forms_of_public_ipv4_pass():
    assert policy().check_url("http://[64:ff9b::808:808]/").addresses == ["64:ff9b::808:808"]
    assert policy().check_url("http://[::ffff:8.8.8.8]/").addresses == ["::ffff:808:808"]


def test_refusal_names_the_reason_and_the_setting():
    with pytest.raises(OutboundBlockedError) as caught:
        policy().check_url("http://metadata.google.internal/")
    assert "metadata" in caught.value.raw_message
    with pytest.raises(OutboundBlockedError) as caught:
        policy().check_url("http://internal.corp/")
    assert "private" in caught.value.raw_message
    assert ALLOWLIST_ENV in caught.value.raw_message


def test_unresolvable_host_is_unavailable_not_blocked():
    with pytest.raises(UpstreamUnavailableError):
        policy().check_url("https://nowhere.example.com/")


def test_allowlisted_host_name_admits_its_private_address():
    target = policy(allowlist=["ollama.lan"]).check_url("http://ollama.lan:11434/v1")
    assert target.addresses == ["192.168.1.20"]


def test_allowlisted_cidr_admits_private_addresses_inside_it_only():
    allowed = policy(allowlist=["10.0.0.0/8"])
    assert allowed.check_url("http://internal.corp/").addresses == ["10.1.2.3"]
    assert allowed.check_url("http://10.9.9.9/").addresses == ["10.9.9.9"]
    with pytest.raises(OutboundBlockedError):
        allowed.check_url("http://192.168.1.1/")


def test_allowlisted_ip_admits_that_ip():
    assert policy(allowlist=["192.168.1.20"]).check_url("http://ollama.lan/").addresses
    with pytest.raises(OutboundBlockedError):
        policy(allowlist=["192.168.1.21"]).check_url("http://ollama.lan/")


def test_allowlisted_host_name_does_not_admit_a_metadata_answer():
    with pytest.raises(OutboundBlockedError):
        policy(allowlist=["metadata.google.internal"]).check_url("http://metadata.google.internal/")


def test_allow_loopback_admits_loopback_and_nothing_else_private():
    local = policy(allow_loopback=True)
    assert local.check_url("http://localhost:11434/v1").addresses == ["127.0.0.1", "::1"]
    assert local.check_url("http://[::1]:11434/").addresses == ["::1"]
    for url in ("http://10.0.0.1/", "http://169.254.169.254/", "http://ollama.lan/"):
        with pytest.raises(OutboundBlockedError):
            local.check_url(url)
    with pytest.raises(OutboundBlockedError):
        local.check_url("http://2130706433/")


def test_from_env_embedded_allows_loopback_distributed_does_not():
    env = {ALLOWLIST_ENV: " ollama.lan , 10.0.0.0/8 ,"}
    embedded = OutboundPolicy.from_env(True, environ=env, resolver=resolver)
    distributed = OutboundPolicy.from_env(False, environ=env, resolver=resolver)
    assert embedded.check_url("http://localhost/").addresses
    with pytest.raises(OutboundBlockedError):
        distributed.check_url("http://localhost/")
    assert distributed.check_url("http://ollama.lan/").addresses
    assert distributed.check_url("http://10.2.3.4/").addresses
    nothing = OutboundPolicy.from_env(False, environ={}, resolver=resolver)
    with pytest.raises(OutboundBlockedError):
        nothing.check_url("http://ollama.lan/")


def test_malformed_allowlist_entries_fail_loudly():
    with pytest.raises(ValueError):
        OutboundPolicy(allowlist=["not a host!"])


# --- GuardedTransport: connect to the checked address --------------------------------


class RecordingBackend(httpcore.NetworkBackend):
    """Records where connections go and refuses them: no packet leaves the machine."""

    def __init__(self, *, refuse_first: bool = False) -> None:
        self.refuse_first = refuse_first
        self.connects: list[tuple[str, int]] = []
        self.tls_names: list[str | None] = []

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        self.connects.append((host, port))
        backend = self

        class Stream(httpcore.NetworkStream):
            def start_tls(self, ssl_context, server_hostname=None, timeout=None):
                backend.tls_names.append(server_hostname)
                raise httpcore.ConnectError("test stops at TLS")

            def close(self):
                pass

        if host == "93.184.216.34" and self.refuse_first:
            raise httpcore.ConnectError("refused")
        return Stream()


def test_dns_rebinding_cannot_move_the_connection(monkeypatch):
    answers = iter([["93.184.216.34"], ["127.0.0.1"]])
    rebinding = OutboundPolicy(resolver=lambda host, port: next(answers))

    def system_dns_must_not_be_used(*args, **kwargs):
        raise AssertionError("the connection resolved the name again")

    monkeypatch.setattr("socket.getaddrinfo", system_dns_must_not_be_used)
    backend = RecordingBackend()
    client = httpx.Client(transport=GuardedTransport(rebinding, network_backend=backend))
    with pytest.raises(httpx.ConnectError):
        client.get("https://rebind.example.com/v1/models")
    assert backend.connects == [("93.184.216.34", 443)]
    # The second answer is loopback: refused before any connection is made.
    with pytest.raises(OutboundBlockedError):
        client.get("https://rebind.example.com/v1/models")
    assert backend.connects == [("93.184.216.34", 443)]


def test_tls_keeps_the_original_name_for_sni_and_certificate_checks():
    backend = RecordingBackend()
    client = httpx.Client(transport=GuardedTransport(policy(), network_backend=backend))
    with pytest.raises(httpx.ConnectError):
        client.get("https://api.example.com/v1")
    assert backend.connects == [("93.184.216.34", 443)]
    assert backend.tls_names == ["api.example.com"]


def test_each_vetted_address_is_tried_when_one_refuses():
    backend = RecordingBackend(refuse_first=True)
    many = OutboundPolicy(resolver=lambda host, port: ["93.184.216.34", "93.184.216.35"])
    client = httpx.Client(transport=GuardedTransport(many, network_backend=backend))
    with pytest.raises(httpx.ConnectError):
        client.get("https://two.example.com/")
    assert [host for host, _ in backend.connects] == ["93.184.216.34", "93.184.216.35"]


def test_guarded_transport_refuses_before_connecting():
    backend = RecordingBackend()
    client = httpx.Client(transport=GuardedTransport(policy(), network_backend=backend))
    for url in ("http://169.254.169.254/", "http://localhost/", "http://user@api.example.com/"):
        with pytest.raises(OutboundBlockedError):
            client.get(url)
    assert backend.connects == []


class _HostEcho(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (self.headers.get("Host") or "").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_host_header_keeps_the_name_while_the_socket_goes_to_the_checked_ip():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HostEcho)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        local = OutboundPolicy(allowlist=["127.0.0.1"], resolver=lambda host, port: ["127.0.0.1"])
        with httpx.Client(transport=GuardedTransport(local)) as client:
            response = client.get(f"http://provider.test:{port}/v1")
        assert response.text == f"provider.test:{port}"
        assert response.request.url.host == "provider.test"
    finally:
        server.shutdown()
        server.server_close()


def test_transports_share_one_verifying_ssl_context():
    from providers.outbound import GuardedTransport, OutboundPolicy, default_ssl_context

    first = GuardedTransport(OutboundPolicy())
    second = GuardedTransport(OutboundPolicy())
    context = default_ssl_context()
    assert first._pool._ssl_context is context is second._pool._ssl_context
    assert context.verify_mode.name == "CERT_REQUIRED" and context.check_hostname
