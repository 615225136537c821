"""Property-based fuzzing (hypothesis): websocket messages against the in-process
consumer, and HTTP forms and endpoints through the full Django stack.

Hypothesis generates at least `EXAMPLES` inputs per entry point (collected first, then
replayed through one live socket / client so the run stays bounded). The property:
nothing crashes. A socket stays open and keeps answering after every frame; no HTTP
request answers 5xx.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openworker.asgi import application
from sessions.models import Session
from tests.security.figures import record
from tests.support.chat import session_cookie

EXAMPLES = 1000
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=80)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
ids = st.one_of(st.uuids().map(str), st.text(max_size=40), st.integers(), st.none(), json_values)


def message(kind: str) -> st.SearchStrategy[Any]:
    return st.fixed_dictionaries(
        {"type": st.just(kind)},
        optional={
            "turn": ids,
            "text": st.text(max_size=200) | json_values,
            "attachments": st.lists(ids, max_size=3) | json_values,
            "model": st.text(max_size=60) | json_values,
            "call_id": ids,
            "after": st.integers() | json_values,
        },
    )


ENTRY_POINTS: dict[str, st.SearchStrategy[Any]] = {
    kind: message(kind).map(json.dumps)
    for kind in ("send", "stop", "approve", "deny", "resume", "retry")
}
ENTRY_POINTS["garbage"] = st.one_of(
    st.text(max_size=300),
    json_values.map(json.dumps),
    st.dictionaries(st.text(max_size=8), json_values, max_size=5).map(json.dumps),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
).filter(bool)  # the test communicator cannot send an empty text frame


def collect(strategy: st.SearchStrategy[Any]) -> list[Any]:
    drawn: list[Any] = []

    @FUZZ_SETTINGS
    @given(strategy)
    def gather(value: Any) -> None:
        drawn.append(value)

    gather()
    return drawn


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
async def test_generated_websocket_messages_never_crash_the_consumer(
    owner: Any, entry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Turns a fuzzed `send` starts stay queued: the property is about the consumer.
    monkeypatch.setattr("openworker.runtime.turns.runner.turn_enqueue", lambda turn_id: None)
    frames = await sync_to_async(collect)(ENTRY_POINTS[entry])
    assert len(frames) >= EXAMPLES
    session = await Session.objects.acreate(owner=owner, model="groq:llama")
    cookie = (await sync_to_async(session_cookie)(owner)).encode()
    ws = WebsocketCommunicator(
        application,
        f"/ws/sessions/{session.pk}/",
        headers=[
            (b"origin", b"http://127.0.0.1:8000"),
            (b"host", b"127.0.0.1:8000"),
            (b"cookie", cookie),
        ],
    )
    connected, _ = await ws.connect(timeout=5)
    assert connected
    await ws.receive_json_from(timeout=5)
    for frame in frames:
        await ws.send_to(text_data=frame)
        # Drain whatever it answered; a close or a crashed app fails here.
        while not await ws.receive_nothing(timeout=0.01, interval=0.002):
            output = await ws.receive_output(timeout=1)
            assert output["type"] == "websocket.send", (frame, output)
        assert not ws.future.done(), (frame, ws.future)
    # Still alive and answering.
    await ws.send_to(text_data='{"type": "nonsense"}')
    reply = await ws.receive_json_from(timeout=5)
    assert reply["type"] == "error"
    await ws.disconnect()
    record("fuzz.ws_frames", len(frames), "generated websocket frames: 0 crashed consumers")


field_values = st.one_of(
    st.text(max_size=300),
    st.sampled_from(["", " ", "0", "-1", "null", "groq:llama", "http://127.0.0.1/", "\x00"]),
    st.integers().map(str),
)
FORMS: dict[str, list[str]] = {
    "/sessions/{sid}/rename": ["title"],
    "/sessions/{sid}/model": ["model"],
    "/sessions/{sid}/archive": ["archived", "archive"],
    "/sessions/new": ["model", "title"],
    "/settings/providers/groq/": ["api_key", "base_url", "region", "clear_key"],
    "/settings/default-model": ["model"],
    "/settings/providers/groq/test": ["model"],
    "/sessions/{sid}/messages?after={v}&before={w}": [],
    "/accounts/login/": ["username", "password"],
}


def form_strategy(fields: list[str]) -> st.SearchStrategy[Any]:
    extra = st.dictionaries(st.text(min_size=1, max_size=10), field_values, max_size=3)
    named = st.fixed_dictionaries({}, optional={f: field_values for f in fields})
    return st.tuples(named, extra, field_values, field_values)


@pytest.mark.django_db
@pytest.mark.parametrize("path", list(FORMS))
def test_generated_form_inputs_never_answer_5xx(
    owner: Any, path: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.AXES_ENABLED = False  # the throttle answers 429 and would hide the form
    monkeypatch.setattr("openworker.runtime.turns.runner.turn_enqueue", lambda turn_id: None)
    # The connection test must not leave the machine: no provider answers, fast.
    monkeypatch.setattr("providers.edge.views.connection_test", lambda **kw: "no", raising=False)
    session = Session.objects.create(owner=owner, model="groq:llama")
    client = Client(raise_request_exception=False)
    if "login" not in path:
        client.force_login(owner)
    inputs = collect(form_strategy(FORMS[path]))
    assert len(inputs) >= EXAMPLES
    for named, extra, v, w in inputs:
        url = path.format(sid=session.pk, v=v, w=w)
        response = client.post(url, {**extra, **named}) if FORMS[path] else client.get(url, extra)
        assert response.status_code < 500, (url, named, extra, response.status_code)
    record("fuzz.http_inputs", len(inputs), "generated HTTP form/query inputs: 0 answers 5xx")
