"""The tree over the real path (embedded, in-process): a websocket client sends edit,
regenerate, switch and continue; the engine runs each turn on its own path against fake
upstreams that speak the real wire protocols and check what they are sent.

The replay test holds every outbound request of a branched session to the provider
tests' request-body checks (the SDKs' request types and the fakes' own rules: strict
role alternation, no orphan tool result), for the API that ran it and, translated from
the same outbound history, for the other wire APIs."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from openworker.asgi import application
from openworker.runtime.agent import history as outbound_history
from providers.context import build_context
from providers.registry import get_descriptor
from providers.types import ModelCapabilities
from providers.wire import bedrock_converse, gemini, openai_completions
from sessions import selectors
from sessions.models import Message, Session, Turn
from tests.fakes import AnthropicMessagesFake, OpenAIChatFake, Reply, drip, text, tool_call
from tests.fakes.validate import (
    gemini_request_problem,
    validate_anthropic_request,
    validate_openai_chat_request,
)
from tests.support.chat import point_provider_at, read_until_status, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "anthropic:claude-test-1"
OPENAI_MODEL = "deepseek:deepseek-test"  # a Chat Completions provider


async def open_socket(user, session) -> WebsocketCommunicator:  # type: ignore[no-untyped-def]
    cookie = await sync_to_async(session_cookie)(user)
    ws = WebsocketCommunicator(
        application,
        f"/ws/sessions/{session.pk}/",
        headers=[
            (b"origin", b"http://127.0.0.1:8000"),
            (b"host", b"127.0.0.1:8000"),
            (b"cookie", cookie.encode()),
        ],
    )
    connected, _ = await ws.connect(timeout=5)
    assert connected
    assert (await ws.receive_json_from(timeout=5))["type"] == "hello"
    return ws


async def until(ws, kind: str, timeout: float = 10) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    while True:
        event = await ws.receive_json_from(timeout=timeout)
        if event.get("type") == kind:
            return event


async def turn_of(ws, frame: dict[str, Any]) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    await ws.send_json_to(frame)
    return await read_until_status(ws)


def _plain(body: dict[str, Any]) -> dict[str, Any]:
    """The body without cache marks: they move to the newest block on every request (as
    in any linear session); what must not move is the prefix under them."""
    out = copy.deepcopy(body)

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            value.pop("cache_control", None)
            for item in value.values():
                strip(item)
        elif isinstance(value, list):
            for item in value:
                strip(item)
        return value

    return strip(out)


def _bedrock_alternation_problem(body: dict[str, Any]) -> str | None:
    """Converse's rules: roles alternate starting with the user, and a user turn's
    toolResult blocks answer the toolUse blocks of the assistant turn right before it."""
    previous = None
    uses: set[str] = set()
    for position, message in enumerate(body["messages"]):
        role = message["role"]
        if role == previous or (position == 0 and role != "user"):
            return f"messages.{position}: roles must alternate, starting with user"
        blocks = message.get("content") or []
        if not blocks:
            return f"messages.{position}: content is empty"
        results = {b["toolResult"]["toolUseId"] for b in blocks if "toolResult" in b}
        if results - uses:
            return f"messages.{position}: toolResult without a toolUse before it"
        uses = {b["toolUse"]["toolUseId"] for b in blocks if "toolUse" in b}
        previous = role
    return None


def _other_api_problems(turn: Turn) -> list[str]:
    """The turn's outbound history as the engine builds it, translated for the other wire
    APIs and held to their checks."""
    rows = selectors.turn_path(turn=turn)
    messages = outbound_history.outbound_messages(
        [row.to_canonical() for row in rows],
        owner_id=turn.session.owner_id,
        caps=ModelCapabilities(vision=True, pdf=True, tools=True),
    )
    tools = [{"name": "list_files", "description": "List files", "parameters": {"type": "object"}}]
    ctx = build_context(messages, tools)
    problems = []
    openai = openai_completions.build_request(
        ctx, model="gpt-test", descriptor=get_descriptor("openai"), stream=True, settings={}
    )
    validate_openai_chat_request(openai)
    found = OpenAIChatFake().check_request(openai)
    if found is not None:
        problems.append(f"openai: {found}")
    body = gemini.build_request(build_context(messages, tools), model="gemini-test", settings={})
    found = gemini_request_problem(body)
    if found is not None:
        problems.append(f"gemini: {found}")
    body = bedrock_converse.build_request(build_context(messages, tools), model="m", settings={})
    found = _bedrock_alternation_problem(body)
    if found is not None:
        problems.append(f"bedrock: {found}")
    return problems


@pytest.fixture
def fake():
    with AnthropicMessagesFake(strict_roles=True) as server:
        yield server


async def _session(owner, fake, model: str = MODEL) -> Session:  # type: ignore[no-untyped-def]
    provider = model.split(":", 1)[0]
    await sync_to_async(point_provider_at)(owner, provider, fake.base_url)
    return await Session.objects.acreate(owner=owner, model=model)


async def _active(session: Session) -> int | None:
    return (await Session.objects.aget(pk=session.pk)).active_seq


async def test_a_branched_session_sends_only_its_path_and_every_request_is_valid(owner, fake):
    fake.push(
        Reply(text("Let me look. "), tool_call("list_files", {})),
        Reply(text("The workspace is empty.")),
        Reply(text("Hi.")),
        Reply(text("Hello there.")),
        Reply(text("You're welcome.")),
    )
    session = await _session(owner, fake)
    ws = await open_socket(owner, session)
    assert (await turn_of(ws, {"type": "send", "text": "What files do I have?"}))[-1][
        "status"
    ] == "completed"
    # Edit the first message: a second root, and a turn that never sees the first branch.
    events = await turn_of(ws, {"type": "edit", "message": 1, "text": "Say hi", "leaf": 4})
    branch = next(e for e in events if e["type"] == "session.branch")
    user = next(e for e in events if e["type"] == "message.user")["message"]
    assert branch["cause"] == "edit" and branch["path"] == [user["seq"]]
    assert (user["parent"], user["siblings"]) == (None, [1, user["seq"]])
    assert "What files" not in json.dumps(fake.requests[2].body["messages"])
    hi = await Message.objects.aget(session=session, content="Hi.")
    # Regenerate that reply: a sibling answering the same user message.
    events = await turn_of(ws, {"type": "regenerate", "message": hi.seq})
    again = await Message.objects.aget(session=session, content="Hello there.")
    assert again.parent_seq == hi.parent_seq == user["seq"]
    reply = next(e for e in events if e["type"] == "message")["message"]
    assert (reply["seq"], reply["siblings"]) == (again.seq, [hi.seq, again.seq])
    assert _plain(fake.requests[3].body)["messages"] == _plain(fake.requests[2].body)["messages"]
    # Back to the first branch, and on from there.
    await ws.send_json_to({"type": "switch", "message": 1})
    switched = await until(ws, "session.branch")
    assert switched["leaf"] == 4 and switched["path"] == [1, 2, 3, 4]
    await turn_of(ws, {"type": "send", "text": "Thanks"})
    await ws.disconnect()

    # Cache stability: the request after switching back starts with exactly the bytes
    # (cache marks aside) the first branch sent last, system prompt and tools included.
    before, after = _plain(fake.requests[1].body), _plain(fake.requests[4].body)
    assert after["system"] == before["system"] and after["tools"] == before["tools"]
    prefix = before["messages"]
    assert json.dumps(after["messages"][: len(prefix)]) == json.dumps(prefix)
    assert "Say hi" not in json.dumps(after["messages"])
    # Every request: a valid linear history for the API that ran it ...
    assert len(fake.requests) == 5
    for request in fake.requests:
        validate_anthropic_request(request.body)
        assert fake.check_request(request.body) is None
    # ... and for the other wire APIs, from the same outbound history of each turn.
    turns = [t async for t in Turn.objects.filter(session=session).select_related("session")]
    assert len(turns) == 4
    for turn in turns:
        assert await sync_to_async(_other_api_problems)(turn) == []


async def test_continue_on_anthropic_extends_the_cut_reply_with_a_prefill(owner, fake):
    fake.push(
        Reply(text("Once upon a time "), stop="max_tokens"),
        Reply(text("there was a fox.")),
        Reply(text("The end.")),
    )
    session = await _session(owner, fake)
    ws = await open_socket(owner, session)
    events = await turn_of(ws, {"type": "send", "text": "Tell me a story"})
    cut = await Message.objects.aget(session=session, seq=2)
    assert cut.finish_reason == "max_tokens"
    events = await turn_of(ws, {"type": "continue", "turn": events[-1]["turn"]})
    assert events[-1]["status"] == "completed"
    last = fake.requests[1].body["messages"][-1]
    assert last["role"] == "assistant"
    assert json.dumps(last["content"]).count("Once upon a time") == 1
    assert 'Once upon a time "' not in json.dumps(last["content"])  # no trailing space
    rest = await Message.objects.aget(session=session, seq=3)
    assert (rest.parent_seq, rest.continuation, rest.content) == (2, "prefill", "there was a fox.")
    committed = next(e for e in events if e["type"] == "message")["message"]
    assert committed["continues"] == 2
    await turn_of(ws, {"type": "send", "text": "Lovely"})
    await ws.disconnect()
    sent = fake.requests[2].body["messages"]
    assistants = [m for m in sent if m["role"] == "assistant"]
    assert len(assistants) == 1
    assert "Once upon a time there was a fox." in json.dumps(assistants[0]["content"])
    for request in fake.requests:
        validate_anthropic_request(request.body)
        assert fake.check_request(request.body) is None


async def test_continue_elsewhere_asks_for_the_rest_in_a_new_message(owner):
    with OpenAIChatFake() as openai:
        openai.push(Reply(text("Part one, "), stop="max_tokens"), Reply(text("part two.")))
        session = await _session(owner, openai, model=OPENAI_MODEL)
        ws = await open_socket(owner, session)
        events = await turn_of(ws, {"type": "send", "text": "Write two parts"})
        assert (await Message.objects.aget(session=session, seq=2)).finish_reason == "length"
        events = await turn_of(ws, {"type": "continue", "turn": events[-1]["turn"]})
        await ws.disconnect()
        assert events[-1]["status"] == "completed"
        sent = openai.requests[1].body["messages"]
        assert sent[-2] == {"role": "assistant", "content": "Part one, "}
        assert sent[-1] == {"role": "user", "content": outbound_history.CONTINUE_INSTRUCTION}
        validate_openai_chat_request(openai.requests[1].body)
    rest = await Message.objects.aget(session=session, seq=3)
    assert (rest.parent_seq, rest.continuation, rest.content) == (2, "instruction", "part two.")
    rows = await sync_to_async(selectors.session_path)(session_id=session.pk)
    assert [m.seq for m in rows] == [1, 2, 3]


async def test_branching_while_a_reply_streams_is_refused_and_every_tab_hears_a_switch(owner, fake):
    fake.push(Reply(text("One.")), Reply(drip(0.2), text("a b c d e f g h")))
    session = await _session(owner, fake)
    ws = await open_socket(owner, session)
    other = await open_socket(owner, session)
    await turn_of(ws, {"type": "send", "text": "first"})
    await ws.send_json_to({"type": "send", "text": "second"})
    await until(ws, "delta")
    leaf = await _active(session)
    for frame in (
        {"type": "edit", "message": 1, "text": "x", "leaf": leaf},
        {"type": "regenerate", "message": 2},
        {"type": "switch", "message": 1, "leaf": leaf},
    ):
        await ws.send_json_to(frame)
        assert (await until(ws, "error"))[
            "error"
        ] == "Wait for the reply to finish, or stop it first."
    await read_until_status(ws)
    assert await Message.objects.filter(session=session).acount() == 4
    await ws.send_json_to({"type": "switch", "message": 2})
    for socket in (ws, other):
        event = await until(socket, "session.branch")
        assert (event["leaf"], event["cause"]) == (4, "switch")
    await ws.send_json_to({"type": "edit", "message": "1", "text": "x"})
    assert "edit takes message" in (await until(ws, "error"))["error"]
    await ws.disconnect()
    await other.disconnect()
