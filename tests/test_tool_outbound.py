"""Tools reach only what the outbound policy allows, in both run modes: `fetch_url` is
refused loopback and private addresses unless the admin allow-lists them, while provider
base URLs keep embedded mode's loopback rule (a local Ollama)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from asgiref.sync import sync_to_async

from openworker.runtime.agent.tools.fetch_url import tool_outbound_policy
from providers.errors import OutboundBlockedError
from providers.outbound import OutboundPolicy
from sessions.models import Message, Session, ToolPolicy
from tests.fakes import AnthropicMessagesFake, Reply, text, tool_call
from tests.support.chat import point_provider_at, read_until_status
from tests.test_engine_embedded import MODEL, open_socket

SECRET_PAGE = "internal-dashboard-canary"


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"<html><body><p>{SECRET_PAGE}</p></body></html>".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def loopback_site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("distributed", [False, True])
def test_tools_refuse_loopback_and_private_addresses_in_both_modes(settings, distributed):
    settings.DISTRIBUTED = distributed
    policy = tool_outbound_policy(environ={})
    for url in (
        "http://127.0.0.1:8000/",
        "http://[::1]/",
        "http://10.0.0.5/",
        "http://169.254.169.254/",
    ):
        with pytest.raises(OutboundBlockedError):
            policy.check_url(url)


def test_an_allow_listed_address_is_reachable_by_tools():
    policy = tool_outbound_policy(environ={"OPENWORKER_OUTBOUND_ALLOWLIST": "127.0.0.1"})
    assert policy.check_url("http://127.0.0.1:8000/").addresses == ["127.0.0.1"]


def test_provider_base_urls_keep_embedded_modes_loopback_rule():
    OutboundPolicy.from_env(embedded=True, environ={}).check_url("http://127.0.0.1:11434/")
    with pytest.raises(OutboundBlockedError):
        OutboundPolicy.from_env(embedded=False, environ={}).check_url("http://127.0.0.1:11434/")


@pytest.mark.django_db(transaction=True)
async def test_an_embedded_turn_cannot_read_a_loopback_page_through_fetch_url(
    owner, loopback_site, monkeypatch
):
    monkeypatch.delenv("OPENWORKER_OUTBOUND_ALLOWLIST", raising=False)
    await ToolPolicy.objects.acreate(tool="fetch_url", policy="allow")
    with AnthropicMessagesFake() as fake:
        fake.push(
            Reply(tool_call("fetch_url", {"url": loopback_site})),
            Reply(text("Done.")),
        )
        await sync_to_async(point_provider_at)(owner, "anthropic", fake.base_url)
        session = await Session.objects.acreate(owner=owner, model=MODEL)
        ws = await open_socket(owner, session)
        await ws.send_json_to({"type": "send", "text": "read the dashboard"})
        events = await read_until_status(ws)
        await ws.disconnect()
        assert events[-1]["status"] == "completed", str(events[-1])
        result = await Message.objects.aget(session=session, role="tool")
        assert "refused" in str(result.content)
        assert SECRET_PAGE not in str(result.content)
        # The provider on loopback (the fake) was reached: its rule is unchanged.
        assert len(fake.requests) == 2
        assert SECRET_PAGE not in str(fake.requests[-1].body)
