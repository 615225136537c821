"""fetch_url against a real HTTP server on loopback, through the real SSRF guard."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from openworker.runtime.agent.tools import ToolContext, ToolResult
from openworker.runtime.agent.tools import fetch_url as fetch_module
from openworker.runtime.agent.tools.fetch_url import FetchUrlTool, html_to_text
from providers.outbound import OutboundPolicy

PAGE = b"""<!doctype html>
<html><head><title>Quarterly notes</title>
<style>body { color: red }</style>
<script>alert("steal")</script></head>
<body>
<nav><a href="/">Home</a> | <a href="/about">About</a></nav>
<h1>Results</h1>
<p>Revenue grew <b>12%</b> this quarter.</p>
<noscript>Enable JavaScript</noscript>
<ul><li>North</li><li>South</li></ul>
</body></html>"""

ROUTES: dict[str, tuple[int, dict[str, str], bytes]] = {
    "/page.html": (200, {"Content-Type": "text/html; charset=utf-8"}, PAGE),
    "/plain.txt": (200, {"Content-Type": "text/plain"}, b"just text\n"),
    "/data.json": (200, {"Content-Type": "application/json"}, b'{"answer": 42}'),
    "/feed.xml": (200, {"Content-Type": "application/rss+xml"}, b"<rss><item/></rss>"),
    "/latin.html": (
        200,
        {"Content-Type": "text/html"},
        '<meta charset="iso-8859-1"><p>Café crème</p>'.encode("latin-1"),
    ),
    "/image.png": (200, {"Content-Type": "image/png"}, b"\x89PNG\r\n\x1a\n"),
    "/no-type": (200, {}, b"mystery"),
    "/moved": (302, {"Location": "/page.html"}, b""),
    "/missing": (404, {"Content-Type": "text/plain"}, b"not here"),
    "/long.txt": (200, {"Content-Type": "text/plain"}, b"a" * 5000),
}


class Handler(BaseHTTPRequestHandler):
    requests: list[str]

    def do_GET(self) -> None:
        self.server.requests.append(self.path)  # type: ignore[attr-defined]
        if self.path == "/endless":
            return self._endless()
        if self.path == "/declared-huge":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(50 * 1024 * 1024))
            self.end_headers()
            return None
        if self.path == "/drip":
            return self._drip()
        status, headers, body = ROUTES.get(self.path, (404, {}, b""))
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        return None

    def _endless(self) -> None:
        """A body with no length that never ends: only a reader that stops can finish."""
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        chunk = b"z" * 65536
        try:
            while True:
                self.wfile.write(chunk)
        except OSError:
            return

    def _drip(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        try:
            for _ in range(100):
                self.wfile.write(b"drip\n")
                self.wfile.flush()
                time.sleep(0.1)
        except OSError:
            return

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.requests = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def base(server: ThreadingHTTPServer) -> str:
    server.requests.clear()  # type: ignore[attr-defined]
    return f"http://127.0.0.1:{server.server_address[1]}"


def fetch(url: str, *, loopback: bool = True, **extra: Any) -> ToolResult:
    ctx = ToolContext("s1", Path("/nonexistent"), OutboundPolicy(allow_loopback=loopback))
    return FetchUrlTool().run({"url": url, **extra}, ctx)


def test_html_is_reduced_to_readable_text(base: str) -> None:
    result = fetch(f"{base}/page.html")
    assert not result.is_error
    header, text = result.content.split("\n\n", 1)
    assert header == f"URL: {base}/page.html\nContent-Type: text/html"
    assert text == "Quarterly notes\n\nResults\n\nRevenue grew 12% this quarter.\n\nNorth\n\nSouth"
    for dropped in ("alert", "color: red", "Home", "Enable JavaScript"):
        assert dropped not in result.content


def test_html_charset_from_a_meta_tag_is_honoured(base: str) -> None:
    assert fetch(f"{base}/latin.html").content.endswith("\n\nCafé crème")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/plain.txt", "just text\n"),
        ("/data.json", '{"answer": 42}'),
        ("/feed.xml", "<rss><item/></rss>"),
    ],
)
def test_text_types_are_returned_as_they_are(base: str, path: str, expected: str) -> None:
    result = fetch(base + path)
    assert not result.is_error
    assert result.content.split("\n\n", 1)[1] == expected


def test_loopback_is_refused_without_the_allowance_and_nothing_is_sent(
    base: str, server: ThreadingHTTPServer
) -> None:
    result = fetch(f"{base}/page.html", loopback=False)
    assert result.is_error
    assert result.content.startswith("refused: 127.0.0.1 is a loopback address")
    assert server.requests == []  # type: ignore[attr-defined]


def test_a_name_resolving_to_a_private_address_is_refused() -> None:
    policy = OutboundPolicy(resolver=lambda host, port: ["10.1.2.3"])
    ctx = ToolContext("s1", Path("/nonexistent"), policy)
    result = FetchUrlTool().run({"url": "http://intranet.example/"}, ctx)
    assert result.is_error
    assert result.content.startswith("refused: 'intranet.example' (10.1.2.3) is a private address")


@pytest.mark.parametrize("url", ["file:///etc/passwd", "http://user:pw@example.com/", "nonsense"])
def test_urls_that_are_not_plain_http_are_refused(url: str) -> None:
    result = fetch(url)
    assert result.is_error
    assert result.content.startswith("refused: ")


def test_a_redirect_is_reported_not_followed(base: str, server: ThreadingHTTPServer) -> None:
    result = fetch(f"{base}/moved")
    assert not result.is_error
    assert result.content.startswith(f"HTTP 302 redirect to {base}/page.html\n")
    assert server.requests == ["/moved"]  # type: ignore[attr-defined]


def test_an_http_error_status_is_an_error_result(base: str) -> None:
    result = fetch(f"{base}/missing")
    assert result.is_error
    assert result.content == f"HTTP 404 Not Found for {base}/missing"


@pytest.mark.parametrize("path", ["/image.png", "/no-type"])
def test_content_types_other_than_text_are_refused(base: str, path: str) -> None:
    result = fetch(base + path)
    assert result.is_error
    assert result.content.startswith("unsupported content type (")


def test_a_declared_oversized_body_is_refused_before_reading(base: str) -> None:
    result = fetch(f"{base}/declared-huge")
    assert result.is_error
    assert result.content == "the response (52,428,800 bytes) is larger than the 2 MB limit"


def test_an_undeclared_body_is_read_only_up_to_the_limit(base: str) -> None:
    started = time.monotonic()
    result = fetch(f"{base}/endless")
    assert result.is_error
    assert result.content == "the response is larger than the 2 MB limit"
    assert time.monotonic() - started < 10


def test_a_slow_body_is_cut_off_at_the_total_deadline(
    base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fetch_module, "TOTAL_TIMEOUT_SECONDS", 0.5)
    started = time.monotonic()
    result = fetch(f"{base}/drip")
    assert result.is_error
    assert result.content.startswith("timed out")
    assert time.monotonic() - started < 3


def test_output_is_capped_at_max_chars_with_a_note(base: str) -> None:
    result = fetch(f"{base}/long.txt", max_chars=100)
    assert not result.is_error
    assert result.content.endswith("\n[truncated: the first 100 of 5,000 characters are shown]")
    assert "a" * 100 + "\n" in result.content
    assert "a" * 101 not in result.content


def test_max_chars_above_the_ceiling_is_a_bad_argument() -> None:
    result = fetch("http://example.com/", max_chars=10_000_000)
    assert result.is_error
    assert result.content.startswith("Invalid arguments for fetch_url at arguments.max_chars")


def test_fetch_url_asks_before_running_by_default() -> None:
    assert FetchUrlTool.default_policy == "ask"


def test_html_to_text_keeps_inline_text_on_one_line() -> None:
    html = "<div>Hello <em>big</em>&nbsp;world<br>next</div><p>  spaced   out  </p>"
    assert html_to_text(html) == "Hello big world\nnext\n\nspaced out"
