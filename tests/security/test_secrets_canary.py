"""Keys go only where they belong, and nowhere else.

1. A custom base URL only ever receives the key of the profile it belongs to; a user
   profile without a key fails closed (never the organisation's or an env key for the
   user's URL). Through the real `UserSecretStore` + `ProviderRouter` + `Transport`
   against fakes that record every header.
2. The canary (distributed, real Daphne + Celery + Redis + PostgreSQL): a known fake key
   is stored for a user and a full tool-using turn is run; then the key must appear in
   none of: the processes' logs, Redis (every key and value of the test db, scanned
   during and after the turn), channel-layer frames, websocket frames, HTTP responses of
   every page (user and admin), exports, and a `pg_dump` of the test database.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import subprocess
import threading
import time
import zipfile
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.contrib.auth import get_user_model

from providers.edge.models import ProviderProfile
from providers.edge.secret_store import UserSecretStore
from providers.errors import ProviderError
from providers.router import ProviderRouter
from tests.fakes import AnthropicMessagesFake, OpenAIChatFake, Reply, drip, text, tool_call
from tests.security.figures import record

ORG_KEY = "sk-org-0rg0rg0rg0rg0rg0rg"
ALICE_KEY = "sk-alice-a11ce-a11ce-a11ce"
BOB_KEY = "sk-bob-b0b-b0b-b0b-b0b-b0b"
ENV_KEY = "sk-env-3nv3nv3nv3nv3nv"
CANARY = "sk-canary-7f3e9b1c5d2a48e6b0c4f1a9d8e7c6b5"
MESSAGES = [{"role": "user", "content": "hi"}]


def profile(owner: Any, provider: str, base_url: str = "", key: str = "") -> ProviderProfile:
    row = ProviderProfile(owner=owner, provider=provider, base_url=base_url)
    row.set_api_key(key)
    row.save()
    return row


def router(user: Any) -> ProviderRouter:
    # Embedded policy: the fakes listen on loopback.
    return ProviderRouter(UserSecretStore(user.pk if user else None), embedded=True)


def sent_keys(fake: Any) -> list[str]:
    out = []
    for request in fake.requests:
        out.append(request.headers.get("authorization") or request.headers.get("x-api-key") or "")
    return out


def every_byte_sent(fakes: list[Any]) -> str:
    return "\n".join(
        json.dumps(r.headers) + r.raw.decode("utf-8", "replace") for f in fakes for r in f.requests
    )


@pytest.fixture
def fakes() -> Iterator[dict[str, Any]]:
    with (
        OpenAIChatFake(api_key=None) as org,
        OpenAIChatFake(api_key=None) as alices,
        OpenAIChatFake(api_key=None) as bobs,
        AnthropicMessagesFake(api_key=None) as anthropic_custom,
    ):
        for fake in (org, alices, bobs):
            for _ in range(3):
                fake.push(Reply(text("ok")))
        yield {"org": org, "alice": alices, "bob": bobs, "anthropic": anthropic_custom}


@pytest.mark.django_db
def test_a_custom_base_url_receives_only_its_own_profiles_key(
    fakes: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    monkeypatch.setenv("GROQ_API_KEY", ENV_KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ENV_KEY)
    users = get_user_model().objects
    alice, bob, carol, dave = (users.create_user(n, password="x-pass-12345") for n in "abcd")
    profile(None, "groq", fakes["org"].base_url, ORG_KEY)
    profile(None, "anthropic", "", ORG_KEY)
    profile(alice, "groq", fakes["alice"].base_url, ALICE_KEY)
    profile(bob, "groq", fakes["bob"].base_url, BOB_KEY)
    # Carol set her own URL but no key; Dave set his own Anthropic URL but no key.
    profile(carol, "groq", fakes["alice"].base_url)
    profile(dave, "anthropic", fakes["anthropic"].base_url)

    tried = 0
    for user in (alice, bob, dave, None):
        # dave has no groq profile: the organisation's, with its own URL and key.
        router(user).complete(model="groq:llama-test", messages=MESSAGES)
        tried += 1
    assert sent_keys(fakes["alice"]) == [f"Bearer {ALICE_KEY}"]
    assert sent_keys(fakes["bob"]) == [f"Bearer {BOB_KEY}"]
    assert sent_keys(fakes["org"]) == [f"Bearer {ORG_KEY}", f"Bearer {ORG_KEY}"]

    before = len(fakes["alice"].requests)
    for user, model in ((carol, "groq:llama-test"), (dave, "anthropic:claude-test")):
        with pytest.raises(ProviderError) as caught:
            router(user).complete(model=model, messages=MESSAGES)
        tried += 1
        assert "key" in str(caught.value).lower()
    # Failed closed: the user-set URLs received nothing at all, let alone a borrowed key.
    assert len(fakes["alice"].requests) == before
    assert fakes["anthropic"].requests == []

    sent = every_byte_sent(list(fakes.values()))
    assert ENV_KEY not in sent
    assert ALICE_KEY not in every_byte_sent([fakes["org"], fakes["bob"], fakes["anthropic"]])
    assert BOB_KEY not in every_byte_sent([fakes["org"], fakes["alice"], fakes["anthropic"]])
    assert ORG_KEY not in every_byte_sent([fakes["alice"], fakes["bob"], fakes["anthropic"]])
    record("secrets.key_routing", tried, "routings checked: each URL got only its profile's key")


@pytest.mark.django_db
def test_the_key_is_ciphertext_in_the_database(db: Any) -> None:
    user = get_user_model().objects.create_user("eve", password="x-pass-12345")
    row = profile(user, "openai", "", CANARY)
    raw = ProviderProfile.objects.filter(pk=row.pk).values_list("api_key_encrypted", flat=True)[0]
    assert CANARY not in raw and CANARY[-12:] not in raw
    assert row.key_last4 == CANARY[-4:]


# --- the distributed canary -------------------------------------------------------------


def _scan_redis(url: str) -> tuple[int, list[str]]:
    """Every key and value of the Redis db at `url`; returns (values scanned, hits)."""
    import redis

    client = redis.Redis.from_url(url)
    scanned, hits = 0, []
    for key in client.scan_iter(count=500):
        kind = client.type(key).decode()
        if kind == "string":
            values = [client.get(key)]
        elif kind == "list":
            values = client.lrange(key, 0, -1)
        elif kind == "hash":
            values = [b"%s=%s" % kv for kv in client.hgetall(key).items()]
        elif kind == "set":
            values = list(client.smembers(key))
        elif kind == "zset":
            values = [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
        elif kind == "stream":
            values = [
                json.dumps(
                    {k.decode(): v.decode("utf-8", "replace") for k, v in f.items()}
                ).encode()
                for _, f in client.xrange(key)
            ]
        else:
            values = []
        for value in [key, *values]:
            scanned += 1
            if value is not None and CANARY.encode() in value:
                hits.append(key.decode("utf-8", "replace"))
    client.close()
    return scanned, hits


class LayerTap:
    """Listens on the session's and the user's channel-layer groups from this process,
    keeping every frame the Redis channel layer carried."""

    def __init__(self, groups: list[str]) -> None:
        self.groups = groups
        self.frames: list[str] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        channel = await layer.new_channel()
        for group in self.groups:
            await layer.group_add(group, channel)
        self._ready.set()
        while not self._stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                message = await asyncio.wait_for(layer.receive(channel), timeout=0.5)
                self.frames.append(json.dumps(message))
        for group in self.groups:
            await layer.group_discard(group, channel)

    def __enter__(self) -> LayerTap:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _pages(base: str, cookie: str, paths: list[str]) -> tuple[int, list[str]]:
    """GET each path (following nothing); zip bodies are opened and their files scanned."""
    hits, fetched = [], 0
    with httpx.Client(base_url=base, headers={"Cookie": cookie}, timeout=20) as client:
        for path in paths:
            response = client.get(path)
            fetched += 1
            assert response.status_code < 500, (path, response.status_code)
            blobs = [response.content, json.dumps(dict(response.headers)).encode()]
            if response.headers.get("content-type", "").startswith("application/zip"):
                with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
                    blobs += [archive.read(name) for name in archive.namelist()]
            if any(CANARY.encode() in blob for blob in blobs):
                hits.append(path)
    return fetched, hits


def _admin_paths(base: str, cookie: str) -> list[str]:
    """The admin index and every model's changelist and first change page."""
    from django.contrib import admin

    paths = ["/admin/"]
    for model in admin.site._registry:
        meta = model._meta
        changelist = f"/admin/{meta.app_label}/{meta.model_name}/"
        paths.append(changelist)
        first = model._default_manager.order_by("pk").values_list("pk", flat=True).first()
        if first is not None:
            paths.append(f"{changelist}{first}/change/")
    return paths


@pytest.mark.distributed
@pytest.mark.django_db(transaction=True)
def test_the_canary_key_appears_nowhere_but_the_upstream(
    distributed_env: dict[str, str], settings: Any, tmp_path: Any
) -> None:
    from django.db import connection

    from openworker.runtime.live import events
    from sessions.models import Session
    from tests.support import procs
    from tests.support.chat import (
        open_ws,
        point_provider_at,
        session_cookie,
    )

    users = get_user_model().objects
    owner = users.create_user("canary-owner", password="canary-pass-123")
    admin_user = users.create_superuser("canary-admin", password="admin-pass-123")
    env = {**distributed_env, "LOG_LEVEL": "DEBUG"}
    received: list[str] = []
    with (
        AnthropicMessagesFake(api_key=CANARY) as fake,
        _daphne_with_log(env) as (base, daphne),
        procs.celery_worker(env) as worker,
    ):
        # The fake only answers the right key: a completed turn proves the key was used.
        fake.push(
            Reply(text("Looking. "), tool_call("list_files", {})),
            Reply(drip(0.02), *[text(f"w{i} ") for i in range(40)]),
        )
        point_provider_at(owner, "anthropic", fake.base_url, api_key=CANARY)
        session = Session.objects.create(owner=owner, model="anthropic:claude-test-1")
        groups = [events.session_group(str(session.pk)), events.user_group(owner.pk)]
        with LayerTap(groups) as tap, open_ws(base, owner, session) as ws:
            ws.send(json.dumps({"type": "send", "text": "what files?"}))
            mid_scan = (0, [])
            while True:
                frame = ws.recv(timeout=30)
                received.append(frame)
                event = json.loads(frame)
                if event.get("type") == "delta" and not mid_scan[0]:
                    mid_scan = _scan_redis(settings.REDIS_URL)
                if event.get("type") == "turn.status" and event.get("status") in {
                    "completed",
                    "failed",
                    "cancelled",
                    "interrupted",
                }:
                    break
            assert event["status"] == "completed", json.dumps(event)
            time.sleep(0.5)  # let the tap drain
        after_scan = _scan_redis(settings.REDIS_URL)

        owner_cookie = session_cookie(owner)
        user_paths = [
            "/",
            f"/sessions/{session.pk}/",
            f"/sessions/{session.pk}/messages",
            f"/sessions/{session.pk}/export.json",
            f"/sessions/{session.pk}/export.md",
            "/sessions/export.zip",
            "/accounts/password/",
            "/settings/",
            "/settings/providers/anthropic/",
        ]
        user_pages = _pages(base, owner_cookie, user_paths)
        admin_pages = _pages(base, session_cookie(admin_user), _admin_paths(base, ""))
        logs = daphne.output() + worker.output()

    dump = subprocess.run(
        ["pg_dump", procs.database_url_for(connection.settings_dict)],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    ciphertext = ProviderProfile.objects.get(owner=owner).api_key_encrypted

    # Two turn steps and the session-title call: all with the canary, to the fake only.
    assert len(fake.requests) >= 2 and all(r.headers["x-api-key"] == CANARY for r in fake.requests)
    assert CANARY not in logs, "the key is in a process log"
    assert "turn" in logs.lower() or logs, "the processes logged nothing at all"
    assert mid_scan[1] == [] and after_scan[1] == [], (mid_scan[1], after_scan[1])
    assert tap.frames and not any(CANARY in f for f in tap.frames)
    assert received and not any(CANARY in f for f in received)
    assert user_pages[1] == [] and admin_pages[1] == [], (user_pages, admin_pages)
    assert CANARY.encode() not in dump
    assert ciphertext.encode() in dump, "the dump should hold the ciphertext"

    record("canary.log_bytes", len(logs), "bytes of Daphne + Celery DEBUG logs: 0 canary hits")
    record("canary.redis_values", mid_scan[0] + after_scan[0], "Redis keys+values scanned: 0 hits")
    record("canary.layer_frames", len(tap.frames), "channel-layer frames tapped: 0 hits")
    record("canary.ws_frames", len(received), "websocket frames received: 0 hits")
    record(
        "canary.http_pages",
        user_pages[0] + admin_pages[0],
        "HTTP pages/exports/admin pages fetched: 0 hits",
    )
    record("canary.pg_dump_bytes", len(dump), "bytes of pg_dump: ciphertext only, 0 hits")


@contextlib.contextmanager
def _daphne_with_log(env: dict[str, str]) -> Iterator[tuple[str, Any]]:
    """`procs.daphne`, but handing back the process too (its log is scanned)."""
    from tests.support import procs

    port = procs.free_port()
    proc = procs.Proc(
        "daphne",
        [
            *procs.WEB_SERVER,
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "openworker.asgi:application",
        ],
        procs.process_env(env),
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + procs.START_TIMEOUT_SECONDS
    while True:
        if proc.popen.poll() is not None:
            proc.fail("exited during start-up")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                break
        if time.monotonic() > deadline:
            proc.fail("did not become healthy")
        time.sleep(0.2)
    try:
        yield base, proc
    finally:
        proc.stop()
