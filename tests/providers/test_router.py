from __future__ import annotations

import json
import sys
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from providers import registry
from providers.base import ProviderClient
from providers.capabilities import CuratedModel, Prices
from providers.errors import OutboundBlockedError
from providers.factory import build_provider_client
from providers.registry import (
    ProviderDescriptor,
    get_descriptor,
)
from providers.router import ProviderRouter
from providers.types import AssistantTurn, ModelCapabilities, StreamChunk


class FakeClient(ProviderClient):
    """Records what the router hands it; answers with the bare model it was asked for."""

    def __init__(self, name: str, profile: dict[str, Any], transport: Any, capabilities: Any):
        self.name = name
        self.profile = profile
        self.transport = transport
        self.capabilities_of = capabilities
        self.calls: list[dict[str, Any]] = []
        self.closed = 0

    def complete(self, *, model, messages, tools=None, **settings):
        self.calls.append({"model": model, "messages": messages, "tools": tools, **settings})
        return AssistantTurn(text=f"{self.name}/{model}")

    def stream(self, *, model, messages, tools=None, **settings):
        self.calls.append({"model": model, "stream": True, **settings})
        yield StreamChunk(text="a")
        yield StreamChunk(text="b")
        yield StreamChunk(turn=AssistantTurn(text=f"{self.name}/{model}"))

    def capabilities(self, model):
        return self.capabilities_of(model)

    def close(self):
        self.closed += 1
        self.transport.close()


class FakeTransport:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class Factory:
    """A client_factory that counts builds per provider."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.built: list[FakeClient] = []
        self.secrets_seen: list[Any] = []
        self._lock = threading.Lock()

    def __call__(self, name, profile, secrets, *, transport, capabilities):
        if self.delay:
            time.sleep(self.delay)
        client = FakeClient(name, profile, transport, capabilities)
        with self._lock:
            self.built.append(client)
            self.secrets_seen.append(secrets)
        return client

    def names(self) -> list[str]:
        return [c.name for c in self.built]


class Secrets:
    def __init__(self, profiles: dict[str, dict[str, Any]]) -> None:
        self.profiles = profiles
        self.asked: list[str] = []

    def get(self, key: str) -> dict[str, Any] | None:
        self.asked.append(key)
        return self.profiles.get(key)


def make_router(secrets: Any = None, **kwargs: Any) -> tuple[ProviderRouter, Factory]:
    factory = kwargs.pop("client_factory", None) or Factory()
    router = ProviderRouter(
        secrets, client_factory=factory, transport_factory=FakeTransport, **kwargs
    )
    return router, factory


def ask(router: ProviderRouter, model: str) -> str:
    return router.complete(model=model, messages=[{"role": "user", "content": "hi"}]).text


# --- prefix rules ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "answer"),
    [
        ("anthropic:claude-sonnet-4-5", "anthropic/claude-sonnet-4-5"),
        ("ollama:llama3.3", "ollama/llama3.3"),
        ("gpt-5.5", "openai/gpt-5.5"),
        ("openai:gpt-5.5", "openai/gpt-5.5"),
        ("qwen2.5-coder:32b", "openai/qwen2.5-coder:32b"),
        ("ollama:qwen2.5-coder:32b", "ollama/qwen2.5-coder:32b"),
        ("together:zai-org/GLM-5.2", "together/zai-org/GLM-5.2"),
        ("nosuch:model-x", "openai/nosuch:model-x"),
    ],
)
def test_model_routes_to_its_registered_prefix_and_the_prefix_is_stripped(model, answer):
    router, _ = make_router()

    assert ask(router, model) == answer


def test_bare_model_goes_to_the_configured_default_provider():
    router, factory = make_router(default_provider="ollama")

    assert ask(router, "llama3.3") == "ollama/llama3.3"
    assert factory.names() == ["ollama"]


def test_unregistered_default_provider_is_refused_at_construction():
    with pytest.raises(ValueError, match="registered providers"):
        ProviderRouter(None, default_provider="nosuch")


def test_prefixed_and_bare_default_model_share_one_cached_client():
    router, factory = make_router()

    ask(router, "openai:gpt-x")
    ask(router, "gpt-x")
    ask(router, "nosuch:gpt-x")

    assert factory.names() == ["openai"]
    assert [c["model"] for c in factory.built[0].calls] == ["gpt-x", "gpt-x", "nosuch:gpt-x"]


def test_settings_tools_and_messages_pass_through_untouched():
    router, factory = make_router()
    messages = [{"role": "user", "content": "hi"}]
    tools = [{"name": "t", "description": "d", "parameters": {"type": "object"}}]
    cancel = object()

    router.complete(model="ollama:llama3.3", messages=messages, tools=tools, cancel=cancel)

    call = factory.built[0].calls[0]
    assert call["messages"] is messages
    assert call["tools"] is tools
    assert call["cancel"] is cancel


def test_stream_routes_and_yields_the_clients_chunks_in_order():
    router, factory = make_router()

    chunks = list(router.stream(model="anthropic:claude-x", messages=[], max_tokens=5))

    assert [c.text for c in chunks[:-1]] == ["a", "b"]
    assert chunks[-1].turn.text == "anthropic/claude-x"
    assert factory.built[0].calls == [{"model": "claude-x", "stream": True, "max_tokens": 5}]


# --- lazy build and secrets ------------------------------------------------------------


def test_client_is_built_from_its_secret_profile_on_first_use_only():
    secrets = Secrets({"provider:anthropic": {"api_key": "sk-ant", "base_url": None}})
    router, factory = make_router(secrets)

    assert factory.built == []
    ask(router, "anthropic:claude-x")
    ask(router, "anthropic:claude-y")

    assert secrets.asked == ["provider:anthropic"]
    assert factory.built[0].profile == {"api_key": "sk-ant", "base_url": None}
    assert factory.secrets_seen == [secrets]


def test_missing_profile_and_no_secrets_build_with_an_empty_profile():
    router, factory = make_router(Secrets({}))
    ask(router, "ollama:llama3.3")
    assert factory.built[0].profile == {}

    router, factory = make_router(None)
    ask(router, "ollama:llama3.3")
    assert factory.built[0].profile == {}
    assert factory.secrets_seen == [None]


def test_each_provider_is_built_once_under_eight_concurrent_threads():
    factory = Factory(delay=0.05)
    router, _ = make_router(client_factory=factory)
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            barrier.wait()
            ask(router, "anthropic:claude-x" if i % 2 else "gpt-x")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    assert sorted(factory.names()) == ["anthropic", "openai"]


def test_a_failed_build_is_not_cached_and_its_transport_is_closed():
    transports: list[FakeTransport] = []

    def transport_factory() -> FakeTransport:
        transports.append(FakeTransport())
        return transports[-1]

    attempts = []

    def failing_factory(name, profile, secrets, *, transport, capabilities):
        attempts.append(name)
        raise NotImplementedError("later")

    router = ProviderRouter(
        None, client_factory=failing_factory, transport_factory=transport_factory
    )
    for _ in range(2):
        with pytest.raises(NotImplementedError):
            ask(router, "gpt-x")

    assert attempts == ["openai", "openai"]
    assert [t.closed for t in transports] == [1, 1]


def test_each_client_gets_its_own_transport_from_the_factory():
    router, factory = make_router()
    ask(router, "gpt-x")
    ask(router, "ollama:llama3.3")

    first, second = factory.built
    assert isinstance(first.transport, FakeTransport)
    assert first.transport is not second.transport


# --- invalidate --------------------------------------------------------------------------


def test_invalidate_one_provider_closes_and_rebuilds_only_that_client():
    secrets = Secrets({"provider:openai": {"api_key": "old"}})
    router, factory = make_router(secrets)
    ask(router, "gpt-x")
    ask(router, "ollama:llama3.3")
    old_openai, ollama = factory.built

    secrets.profiles["provider:openai"] = {"api_key": "new"}
    router.invalidate("openai")
    ask(router, "gpt-x")
    ask(router, "ollama:llama3.3")

    assert (old_openai.closed, old_openai.transport.closed) == (1, 1)
    assert ollama.closed == 0
    assert factory.names() == ["openai", "ollama", "openai"]
    assert factory.built[-1].profile == {"api_key": "new"}


def test_invalidate_all_closes_every_cached_client():
    router, factory = make_router()
    ask(router, "gpt-x")
    ask(router, "anthropic:claude-x")

    router.invalidate()

    assert [c.closed for c in factory.built] == [1, 1]
    ask(router, "gpt-x")
    assert factory.names() == ["openai", "anthropic", "openai"]


def test_invalidate_of_an_unbuilt_provider_is_a_no_op():
    router, factory = make_router()
    router.invalidate("anthropic")
    router.invalidate()
    assert factory.built == []


def test_a_client_dropped_mid_stream_is_closed_when_the_stream_ends():
    router, factory = make_router()
    stream = router.stream(model="gpt-x", messages=[])
    first = next(stream)

    router.invalidate("openai")
    client = factory.built[0]
    assert client.closed == 0
    rest = list(stream)

    assert first.text == "a"
    assert rest[-1].turn.text == "openai/gpt-x"
    assert client.closed == 1


def test_a_stream_abandoned_after_invalidate_still_closes_its_client():
    router, factory = make_router()
    stream = router.stream(model="gpt-x", messages=[])
    next(stream)
    router.invalidate()

    stream.close()

    assert factory.built[0].closed == 1


def test_close_drops_every_client():
    router, factory = make_router()
    ask(router, "gpt-x")
    router.close()
    assert factory.built[0].closed == 1


# --- capabilities ------------------------------------------------------------------------

GLM = CuratedModel(
    id="together:zai-org/GLM-5.2",
    label="GLM 5.2",
    provider="together",
    caps=ModelCapabilities(vision=True, tools=True, context_window=200_000),
    prices=Prices(input="0.6", output="2.2"),
)


def test_capabilities_answer_reseller_ids_from_the_matrix_by_exact_id():
    router, _ = make_router(matrix={GLM.id: GLM})

    caps = router.capabilities("together:zai-org/GLM-5.2")

    assert caps.curated is True
    assert caps.context_window == 200_000
    assert router.curated("together:zai-org/GLM-5.2") is GLM
    assert router.curated("together:zai-org/GLM-5.3") is None


def test_capabilities_of_custom_models_never_invent_a_window():
    router, _ = make_router(matrix={GLM.id: GLM})

    caps = router.capabilities("ollama:qwen2.5-coder:32b")

    assert caps.curated is False
    assert caps.context_window is None
    assert caps.max_output_tokens is None


def test_a_callable_matrix_is_re_read_so_admin_edits_show_up():
    table: dict[str, CuratedModel] = {}
    router, _ = make_router(matrix=lambda: table)

    assert router.capabilities(GLM.id).curated is False
    table[GLM.id] = GLM
    assert router.capabilities(GLM.id).curated is True


def test_clients_ask_capabilities_with_the_bare_model_and_get_the_full_id_answer():
    router, factory = make_router(matrix={GLM.id: GLM})
    ask(router, "together:zai-org/GLM-5.2")

    client = factory.built[0]

    assert client.capabilities("zai-org/GLM-5.2").context_window == 200_000


def test_default_provider_client_finds_a_bare_matrix_key():
    gpt = CuratedModel(
        id="gpt-5.5",
        label="GPT-5.5",
        provider="openai",
        caps=ModelCapabilities(tools=True, context_window=400_000),
    )
    router, factory = make_router(matrix={"gpt-5.5": gpt})
    ask(router, "gpt-5.5")

    assert factory.built[0].capabilities("gpt-5.5").context_window == 400_000
    assert router.capabilities("openai:gpt-5.5").curated is True


# --- factory -----------------------------------------------------------------------------


def _fake_wire_module(monkeypatch, module_name: str, class_name: str) -> list[dict[str, Any]]:
    made: list[dict[str, Any]] = []

    class Client:
        def __init__(self, descriptor, *, api_key, base_url, transport, capabilities):
            made.append(
                {
                    "descriptor": descriptor,
                    "api_key": api_key,
                    "base_url": base_url,
                    "transport": transport,
                    "capabilities": capabilities,
                }
            )

    module = types.ModuleType(module_name)
    setattr(module, class_name, Client)
    monkeypatch.setitem(sys.modules, module_name, module)
    return made


def test_factory_builds_the_client_class_of_the_descriptors_wire_api(monkeypatch):
    completions = _fake_wire_module(
        monkeypatch, "providers.wire.openai_completions", "OpenAICompletionsClient"
    )
    messages = _fake_wire_module(
        monkeypatch, "providers.wire.anthropic_messages", "AnthropicMessagesClient"
    )
    transport, caps = FakeTransport(), lambda model: ModelCapabilities()

    build_provider_client(
        "ollama",
        {"base_url": "http://10.0.0.5:11434/v1"},
        None,
        transport=transport,
        capabilities=caps,
    )
    build_provider_client(
        "anthropic",
        {"api_key": "sk-ant", "base_url": ""},
        None,
        transport=transport,
        capabilities=caps,
    )

    assert completions[0]["descriptor"] is get_descriptor("ollama")
    assert (completions[0]["api_key"], completions[0]["base_url"]) == (
        None,
        "http://10.0.0.5:11434/v1",
    )
    assert messages[0]["descriptor"] is get_descriptor("anthropic")
    assert (messages[0]["api_key"], messages[0]["base_url"]) == ("sk-ant", None)
    assert messages[0]["transport"] is transport
    assert messages[0]["capabilities"] is caps


def test_factory_accepts_a_missing_profile(monkeypatch):
    made = _fake_wire_module(
        monkeypatch, "providers.wire.openai_completions", "OpenAICompletionsClient"
    )
    build_provider_client(
        "deepseek", None, None, transport=FakeTransport(), capabilities=lambda m: None
    )
    assert (made[0]["api_key"], made[0]["base_url"]) == (None, None)


def test_factory_names_the_registered_providers_for_an_unknown_one():
    with pytest.raises(ValueError, match="nosuch") as info:
        build_provider_client(
            "nosuch", {}, None, transport=FakeTransport(), capabilities=lambda m: None
        )
    assert "anthropic" in str(info.value)
    assert "ollama" in str(info.value)


def test_factory_refuses_a_descriptor_with_an_unknown_wire_api(monkeypatch):
    descriptor = ProviderDescriptor(
        name="later", api="smoke-signals", default_base_url="https://x.test"
    )
    monkeypatch.setitem(registry._DESCRIPTORS, "later", descriptor)

    with pytest.raises(ValueError, match="smoke-signals"):
        build_provider_client(
            "later", {}, None, transport=FakeTransport(), capabilities=lambda m: None
        )


@pytest.mark.parametrize("name", ["openai", "anthropic", "gemini", "bedrock", "ollama"])
def test_every_registered_wire_api_has_a_client(name):
    from providers.factory import _CLIENT_CLASSES

    assert registry.get_descriptor(name).api in _CLIENT_CLASSES


# --- end to end through the real factory, wire clients and transport ---------------------

CHAT_COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "llama3.3",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hello from ollama"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
}
ANTHROPIC_MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [{"type": "text", "text": "hello from claude"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 5, "output_tokens": 3},
}


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "llama3.3",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class _Upstream(BaseHTTPRequestHandler):
    seen: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
        if self.path.endswith("/messages"):
            payload = json.dumps(ANTHROPIC_MESSAGE).encode()
            content_type = "application/json"
        elif body.get("stream"):
            payload = (
                _chunk({"role": "assistant", "content": "hel"})
                + _chunk({"content": "lo"})
                + _chunk({}, finish="stop")
                + b"data: [DONE]\n\n"
            )
            content_type = "text/event-stream"
        else:
            payload = json.dumps(CHAT_COMPLETION).encode()
            content_type = "application/json"
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def h4_upstream():
    seen: list[dict[str, Any]] = []
    handler = type("Handler", (_Upstream,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def no_allowlist(monkeypatch):
    monkeypatch.delenv("OPENWORKER_OUTBOUND_ALLOWLIST", raising=False)


@pytest.mark.usefixtures("no_allowlist")
def test_default_router_reaches_a_local_ollama_in_embedded_mode(h4_upstream):
    url, seen = h4_upstream
    secrets = Secrets({"provider:ollama": {"api_key": None, "base_url": f"{url}/v1"}})
    live = ProviderRouter(secrets, embedded=True)
    messages = [{"role": "user", "content": "hi"}]

    turn = live.complete(model="ollama:llama3.3", messages=messages)
    chunks = list(live.stream(model="ollama:llama3.3", messages=messages))
    live.close()

    assert turn.text == "hello from ollama"
    assert turn.usage.input == 5
    assert "".join(c.text for c in chunks if c.text) == "hello"
    assert chunks[-1].turn.text == "hello"
    assert [r["path"] for r in seen] == ["/v1/chat/completions"] * 2
    assert seen[0]["body"]["model"] == "llama3.3"
    assert "Authorization" not in seen[0]["headers"]


@pytest.mark.usefixtures("no_allowlist")
def test_default_router_speaks_anthropic_with_the_profiles_key(h4_upstream):
    url, seen = h4_upstream
    secrets = Secrets({"provider:anthropic": {"api_key": "sk-ant-test", "base_url": url}})
    live = ProviderRouter(secrets, embedded=True)

    turn = live.complete(
        model="anthropic:claude-sonnet-4-5", messages=[{"role": "user", "content": "hi"}]
    )
    live.close()

    assert turn.text == "hello from claude"
    assert seen[0]["path"] == "/v1/messages"
    assert seen[0]["headers"]["x-api-key"] == "sk-ant-test"
    assert seen[0]["body"]["model"] == "claude-sonnet-4-5"
    assert seen[0]["body"]["max_tokens"] > 0


@pytest.mark.usefixtures("no_allowlist")
def test_default_outbound_policy_refuses_loopback_outside_embedded_mode(h4_upstream):
    url, seen = h4_upstream
    secrets = Secrets({"provider:ollama": {"base_url": f"{url}/v1"}})
    guarded = ProviderRouter(secrets)

    with pytest.raises(OutboundBlockedError):
        guarded.complete(model="ollama:llama3.3", messages=[{"role": "user", "content": "hi"}])
    guarded.close()

    assert seen == []
