"""Embedded mode in-process: the engine runs turns as asyncio tasks on the server's loop,
streams over the in-memory channel layer to a real consumer, and talks to a fake
Anthropic upstream over real HTTP."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from openworker.asgi import application
from sessions.models import Message, Session, Turn
from tests.fakes import AnthropicMessagesFake, Reply, drip, pause, text, tool_call, usage
from tests.support.chat import (
    assert_gapless,
    point_provider_at,
    read_until_status,
    session_cookie,
    streamed_text,
)

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "anthropic:claude-test-1"


@pytest.fixture
def fake():
    with AnthropicMessagesFake() as server:
        yield server


async def open_socket(user, session, query: str = "") -> WebsocketCommunicator:
    cookie = await sync_to_async(session_cookie)(user)
    path = f"/ws/sessions/{session.pk}/" + (f"?{query}" if query else "")
    ws = WebsocketCommunicator(
        application,
        path,
        headers=[
            (b"origin", b"http://127.0.0.1:8000"),
            (b"host", b"127.0.0.1:8000"),
            (b"cookie", cookie.encode()),
        ],
    )
    connected, _ = await ws.connect(timeout=5)
    assert connected
    hello = await ws.receive_json_from(timeout=5)
    assert hello["type"] == "hello"
    return ws


async def make_session(owner, fake) -> Session:
    await sync_to_async(point_provider_at)(owner, "anthropic", fake.base_url)
    return await Session.objects.acreate(owner=owner, model=MODEL)


async def ask_and_read_title(owner, session, text: str) -> tuple[list[dict], dict]:
    """Send `text` in `session`, read the turn to its end and on to the session's title:
    (the turn's events, the `session.title` event)."""
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": text})
    events = await read_until_status(ws)
    event = await ws.receive_json_from(timeout=10)
    while event["type"] != "session.title":
        event = await ws.receive_json_from(timeout=10)
    await ws.disconnect()
    return events, event


async def test_a_two_step_tool_turn_streams_in_order_and_is_persisted(owner, fake):
    fake.push(
        Reply(text("Let me look. "), tool_call("list_files", {}), usage(input=100, output=20)),
        Reply(text("The workspace is empty."), usage(input=150, output=10, cache_read=100)),
    )
    session = await make_session(owner, fake)
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": "What files do I have?"})
    events = await read_until_status(ws)
    await ws.disconnect()

    assert events[-1]["status"] == "completed"
    assert_gapless(events)
    assert streamed_text(events) == "Let me look. The workspace is empty."
    roles = [
        m
        async for m in Message.objects.filter(session=session)
        .order_by("seq")
        .values_list("role", flat=True)
    ]
    assert roles == ["user", "assistant", "tool", "assistant"]
    first = await Message.objects.aget(session=session, seq=2)
    assert first.tool_calls[0]["name"] == "list_files"
    assert first.usage == {"input": 100, "output": 20, "cache_read": 0, "cache_write": 0}
    turn = await Turn.objects.aget(session=session)
    assert turn.steps == 2
    assert turn.usage == {"input": 250, "output": 30, "cache_read": 100, "cache_write": 0}
    # The second request carried the tool result back to the model.
    assert fake.requests[1].body["messages"][-1]["content"][0]["type"] == "tool_result"


async def test_reconnecting_mid_turn_replays_everything_once(owner, fake):
    fake.push(Reply(drip(0.03), *[text(f"w{i} ") for i in range(30)]))
    session = await make_session(owner, fake)
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": "count"})
    first = []
    while len([e for e in first if e["type"] == "delta"]) < 3:
        first.append(await ws.receive_json_from(timeout=10))
    await ws.disconnect()
    turn_id = first[-1]["turn"]
    last_seq = first[-1]["seq"]

    ws2 = await open_socket(owner, session, query=f"resume={turn_id}:{last_seq}")
    rest = await read_until_status(ws2)
    await ws2.disconnect()
    turn_events = [e for e in first if e.get("turn")] + rest
    assert_gapless(turn_events)
    assert streamed_text(turn_events) == "".join(f"w{i} " for i in range(30))


async def test_a_fresh_page_mid_turn_gets_the_whole_stream_so_far(owner, fake):
    fake.push(Reply(drip(0.03), *[text(f"t{i} ") for i in range(20)]))
    session = await make_session(owner, fake)
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": "go"})
    while (await ws.receive_json_from(timeout=10)).get("type") != "delta":
        pass
    ws2 = await open_socket(owner, session)  # a reload: knows nothing yet
    events = await read_until_status(ws2)
    await ws.disconnect()
    await ws2.disconnect()
    assert_gapless(events)
    assert events[0]["seq"] == 1
    assert streamed_text(events) == "".join(f"t{i} " for i in range(20))


async def test_stop_cancels_the_upstream_request_and_keeps_the_text(owner, fake):
    fake.push(Reply(text("partial answer "), pause(30), text("never sent")))
    session = await make_session(owner, fake)
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": "long one"})
    streamed = ""
    while streamed != "partial answer ":  # all of it, then the upstream stalls
        event = await ws.receive_json_from(timeout=10)
        streamed += event.get("text", "") if event.get("type") == "delta" else ""
    await ws.send_json_to({"type": "stop", "turn": event["turn"]})
    events = await read_until_status(ws)
    await ws.disconnect()

    assert events[-1]["status"] == "cancelled"
    assert await sync_to_async(fake.wait_for_disconnect)(5)
    kept = await Message.objects.aget(session=session, role="assistant")
    assert kept.content == "partial answer "
    assert kept.finish_reason == "cancelled"


async def test_an_ask_tool_waits_for_approval_and_resumes_when_approved(owner, fake):
    fake.push(
        Reply(tool_call("fetch_url", {"url": "http://127.0.0.1:9/x"})),
        Reply(text("I could not fetch it.")),
    )
    session = await make_session(owner, fake)
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": "read that page"})
    events = await read_until_status(ws)
    assert events[-1]["status"] == "awaiting_approval"
    approval = next(e for e in events if e["type"] == "tool.approval")
    call = approval["calls"][0]
    assert call["name"] == "fetch_url"
    await ws.disconnect()

    # The wait survives a closed tab: a new socket is told what is pending.
    cookie_ws = await open_socket(owner, session)
    await cookie_ws.send_json_to(
        {"type": "approve", "turn": approval["turn"], "call_id": call["id"]}
    )
    events = await read_until_status(cookie_ws, {"completed", "failed"})
    await cookie_ws.disconnect()
    assert events[-1]["status"] == "completed"
    tool_message = await Message.objects.aget(session=session, role="tool")
    assert tool_message.tool_call_id == call["id"]
    assert "I could not fetch it." in streamed_text(events)


async def test_a_denied_tool_call_is_reported_to_the_model(owner, fake):
    fake.push(
        Reply(tool_call("fetch_url", {"url": "https://example.com"})), Reply(text("OK, I won't."))
    )
    session = await make_session(owner, fake)
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": "read example.com"})
    events = await read_until_status(ws)
    approval = next(e for e in events if e["type"] == "tool.approval")
    await ws.send_json_to(
        {"type": "deny", "turn": approval["turn"], "call_id": approval["calls"][0]["id"]}
    )
    events = await read_until_status(ws, {"completed", "failed"})
    await ws.disconnect()
    assert events[-1]["status"] == "completed"
    result = fake.requests[-1].body["messages"][-1]["content"][0]
    assert result["type"] == "tool_result"
    assert "denied" in str(result["content"])


async def test_an_upstream_error_fails_the_turn_with_the_friendly_message(owner, fake):
    from tests.fakes import quota_exceeded

    fake.push(Reply(quota_exceeded()))
    session = await make_session(owner, fake)
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": "hi"})
    events = await read_until_status(ws)
    await ws.disconnect()
    assert events[-1]["status"] == "failed"
    assert events[-1]["error_kind"] == "no_quota"
    turn = await Turn.objects.aget(session=session)
    assert turn.status == "failed" and turn.error_kind == "no_quota"


async def test_a_text_only_model_gets_the_placeholder_and_pdf_text_while_storage_is_unchanged(
    owner, settings, tmp_path
):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from sessions.attachments import attachment_create
    from tests.fakes import OpenAIChatFake
    from tests.test_attachments import PNG
    from tests.test_degradation import make_pdf

    settings.MEDIA_ROOT = tmp_path
    with OpenAIChatFake(api_key=None) as ollama:
        ollama.push(Reply(text("I read the PDF.")))
        await sync_to_async(point_provider_at)(owner, "ollama", ollama.base_url, api_key="")
        session = await Session.objects.acreate(owner=owner, model="ollama:llama3.3")
        image = await sync_to_async(attachment_create)(
            owner=owner, session=session, upload=SimpleUploadedFile("chart.png", PNG)
        )
        pdf = await sync_to_async(attachment_create)(
            owner=owner,
            session=session,
            upload=SimpleUploadedFile("report.pdf", make_pdf(["Revenue grew 12 percent"])),
        )
        ws = await open_socket(owner, session)
        await ws.send_json_to(
            {"type": "send", "text": "Summarise", "attachments": [str(image.pk), str(pdf.pk)]}
        )
        events = await read_until_status(ws)
        await ws.disconnect()
        sent = ollama.requests[0].body["messages"][-1]["content"]

    assert events[-1]["status"] == "completed"
    notice = next(e for e in events if e["type"] == "notice")
    assert "images can't be read by this model" in notice["note"]
    texts = [part.get("text", "") for part in sent]
    assert "[image attachment — not viewable by this model]" in texts
    assert any("Revenue grew 12 percent" in t and "report.pdf" in t for t in texts)
    assert all(part["type"] == "text" for part in sent)
    stored = await Message.objects.aget(session=session, role="user")
    kinds = [part["type"] for part in stored.content]
    assert kinds == ["text", "image_url", "file"]  # the transcript keeps the originals
    assert stored.content[1]["image_url"]["url"] == f"attachment:{image.pk}"


async def test_the_per_user_cap_refuses_another_concurrent_turn(owner, fake, settings):
    settings.MAX_CONCURRENT_TURNS_PER_USER = 1
    fake.push(Reply(text("slow "), pause(5), text("done")))
    first = await make_session(owner, fake)
    second = await Session.objects.acreate(owner=owner, model=MODEL)
    ws1 = await open_socket(owner, first)
    await ws1.send_json_to({"type": "send", "text": "one"})
    while (await ws1.receive_json_from(timeout=10)).get("type") != "delta":
        pass
    ws2 = await open_socket(owner, second)
    await ws2.send_json_to({"type": "send", "text": "two"})
    refusal = await ws2.receive_json_from(timeout=5)
    assert refusal["type"] == "error" and "already have 1" in refusal["error"]
    assert not await Turn.objects.filter(session=second).aexists()
    await ws1.send_json_to(
        {"type": "stop", "turn": (await Turn.objects.aget(session=first)).pk.hex}
    )
    await ws1.disconnect()
    await ws2.disconnect()


async def test_shutdown_interrupts_running_turns_and_keeps_their_text(owner, fake):
    from openworker.runtime.turns.runner import embedded_runner

    fake.push(Reply(text("half an answer "), pause(30), text("rest")))
    session = await make_session(owner, fake)
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": "go"})
    streamed = ""
    while streamed != "half an answer ":  # everything before the upstream's long pause
        event = await ws.receive_json_from(timeout=10)
        streamed += event.get("text", "") if event.get("type") == "delta" else ""
    await embedded_runner.shutdown()
    turn = await Turn.objects.aget(session=session)
    assert turn.status == "interrupted"
    assert turn.partial_text == "half an answer "
    assert await sync_to_async(fake.wait_for_disconnect)(5)
    await ws.disconnect()


async def test_the_first_exchange_titles_the_session_and_the_page_is_told(owner, fake, settings):
    settings.AUTO_TITLE = True
    fake.push(Reply(text("Paris is the capital.")), Reply(text("Title: Capital of France.")))
    session = await make_session(owner, fake)
    _, event = await ask_and_read_title(owner, session, "What is the capital of France?")
    assert event["title"] == "Capital of France"
    await session.arefresh_from_db()
    assert session.title == "Capital of France"


async def test_a_titles_database_calls_queue_behind_every_turns_calls(
    owner, fake, settings, monkeypatch
):
    # The turn gave its place back before its title: the title's save must not go before
    # the claims of the turns that take the places (a wave's titles did, at K = 1000).
    from openworker.runtime.agent import engine
    from openworker.runtime.store import priority_pool

    settings.AUTO_TITLE = False
    asked_at: list[int] = []
    write_gathered = engine.dbretry.write_gathered

    async def recording(gatherer, ask, *, name):  # type: ignore[no-untyped-def]
        if name == "session_title_save":
            asked_at.append(priority_pool.call_priority.get())
        return await write_gathered(gatherer, ask, name=name)

    monkeypatch.setattr(engine.dbretry, "write_gathered", recording)
    fake.push(Reply(text("Paris is the capital.")))
    session = await make_session(owner, fake)
    await ask_and_read_title(owner, session, "What is the capital of France?")
    assert len(asked_at) == 1
    later_turn = priority_pool.next_arrival()
    assert asked_at[0] > priority_pool.AFTER_EVERY_TURN > later_turn


async def test_a_title_save_that_meets_a_locked_database_is_retried_not_a_crash(
    owner, fake, settings, monkeypatch, caplog
):
    from django.db import OperationalError

    from sessions import services

    settings.AUTO_TITLE = False
    save, calls = services.session_title_save, []

    def locked_once(**kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs)
        if len(calls) == 1:
            raise OperationalError("database table is locked")
        return save(**kwargs)

    monkeypatch.setattr(services, "session_title_save", locked_once)
    fake.push(Reply(text("Paris is the capital.")))
    session = await make_session(owner, fake)
    events, event = await ask_and_read_title(owner, session, "What is the capital of France?")
    assert events[-1]["status"] == "completed"
    assert event["title"] == "What is the capital of France?"
    assert len(calls) == 2
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    await session.arefresh_from_db()
    assert session.title == "What is the capital of France?"


async def test_a_dropped_final_event_is_recovered_from_the_replay_buffer(owner, fake, monkeypatch):
    """The channel layer may drop any event, the last one included: the socket notices the
    silence and reads the turn's buffer."""
    from openworker.runtime.live import events

    publish = events.apublish

    async def lossy(session_id, event):
        if event.get("type") in {"turn.status", "message"} and event.get("status") != "running":
            return  # dropped on the floor, like channels_redis over capacity
        await publish(session_id, event)

    monkeypatch.setattr(events, "apublish", lossy)
    fake.push(Reply(text("all of it")))
    session = await make_session(owner, fake)
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": "hi"})
    events_seen = await read_until_status(ws, timeout=10)
    await ws.disconnect()
    assert events_seen[-1]["status"] == "completed"
    assert any(e["type"] == "message" for e in events_seen)
    assert_gapless(events_seen)


async def test_a_failure_after_the_last_commit_keeps_the_turn_completed(owner, fake, monkeypatch):
    """The last model call's transaction ends the turn; if publishing its message fails
    afterwards, the turn stays completed and the sockets are told so."""
    from openworker.runtime.agent import engine

    real = engine.selectors.message_payload

    def payload(message):
        if message.role == "assistant":
            raise RuntimeError("publishing broke")
        return real(message)

    monkeypatch.setattr(engine.selectors, "message_payload", payload)
    fake.push(Reply(text("All done."), usage(input=10, output=3)))
    session = await make_session(owner, fake)
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": "Finish, please."})
    events = await read_until_status(ws)
    await ws.disconnect()

    assert events[-1]["status"] == "completed"
    turn = await Turn.objects.aget(session=session)
    assert (turn.status, turn.steps, turn.error_kind) == ("completed", 1, "")
    reply = await Message.objects.aget(session=session, role="assistant")
    assert reply.content == "All done."
