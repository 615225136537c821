"""A provider stream over TLS, as every real provider serves it: the asyncio backend's own
protocol under `loop.start_tls`, the chunked decoder and the pool, end to end against a
local HTTPS server with a certificate of a throwaway authority (nothing mocked but the
trust store)."""

from __future__ import annotations

import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from providers import blocking, outbound
from providers.outbound import OutboundPolicy
from providers.transport import Transport
from tests.support.tls import write_tls_files

EVENTS = [f'event: content_block_delta\ndata: {{"n":{n}}}\n\n'.encode() for n in range(30)]


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(authority's certificate, server certificate, server key) as PEM files."""
    return write_tls_files(tmp_path)


class TLSUpstream:
    """Streams EVENTS as chunked Server-Sent Events over HTTPS, one chunk per event, a
    little apart (each arrives in a read of its own)."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.peers: list[tuple[str, int]] = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                upstream.peers.append(self.client_address)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for data in EVENTS:
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                    time.sleep(0.002)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def log_message(self, *args):
                pass

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}/v1/messages"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_stream_over_tls_reads_every_event_and_reuses_the_connection(tls_files, monkeypatch):
    ca, cert, key = tls_files
    trusting = ssl.create_default_context(cafile=str(ca))
    monkeypatch.setattr(outbound, "default_ssl_context", lambda: trusting)
    upstream = TLSUpstream(cert, key)
    try:
        transport = Transport(policy=OutboundPolicy(allowlist=["127.0.0.1"]))
        for _ in range(2):
            events = blocking.iterate(
                transport.astream_sse(upstream.url, headers={}, body={}, model="m")
            )
            assert [event.data for event in events] == [f'{{"n":{n}}}' for n in range(30)]
        transport.close()
    finally:
        upstream.close()
    # The second stream went over the first one's TLS connection: the body was read to
    # its end (the last chunk through h11), so the pool kept it.
    assert len(upstream.peers) == 2 and len(set(upstream.peers)) == 1


def test_a_certificate_of_an_unknown_authority_is_refused(tls_files, monkeypatch):
    from providers.errors import ProviderError

    _, cert, key = tls_files
    monkeypatch.setattr(outbound, "default_ssl_context", ssl.create_default_context)
    upstream = TLSUpstream(cert, key)
    try:
        transport = Transport(policy=OutboundPolicy(allowlist=["127.0.0.1"]), max_retries=0)
        with pytest.raises(ProviderError):
            list(
                blocking.iterate(
                    transport.astream_sse(upstream.url, headers={}, body={}, model="m")
                )
            )
        transport.close()
    finally:
        upstream.close()
    assert upstream.peers == []
