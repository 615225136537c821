"""The engine enforces TURN_TIME_LIMIT_SECONDS itself (Celery's threads pool enforces no
task time limit): the turn fails with a clear message, the upstream request is cancelled
and nothing already streamed is lost."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from sessions.models import Message, Turn
from tests.fakes import Reply, pause, text
from tests.support.chat import read_until_status
from tests.test_engine_embedded import fake, make_session, open_socket  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_turn_past_its_time_limit_fails_keeps_its_text_and_cancels_upstream(
    owner,
    fake,  # noqa: F811
    settings,
):
    settings.TURN_TIME_LIMIT_SECONDS = 1
    fake.push(Reply(text("partial answer "), pause(30), text("never sent")))
    session = await make_session(owner, fake)
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": "a long one"})
    events = await read_until_status(ws, timeout=15)
    await ws.disconnect()

    final = events[-1]
    assert final["status"] == "failed" and final["error_kind"] == "time_limit"
    assert "ran longer than the 1 second a reply may take" in final["error"]
    assert "was stopped" in final["error"] and "kept" in final["error"]
    assert await sync_to_async(fake.wait_for_disconnect)(5)
    kept = await Message.objects.aget(session=session, role="assistant")
    assert kept.content == "partial answer "
    turn = await Turn.objects.aget(session=session)
    assert turn.status == "failed" and turn.error_kind == "time_limit"


async def test_a_turn_within_its_time_limit_is_untouched(owner, fake, settings):  # noqa: F811
    settings.TURN_TIME_LIMIT_SECONDS = 5
    fake.push(Reply(text("quick")))
    session = await make_session(owner, fake)
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": "hi"})
    events = await read_until_status(ws)
    await ws.disconnect()
    assert events[-1]["status"] == "completed"
