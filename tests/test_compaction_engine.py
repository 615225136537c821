"""Auto-compaction through the real engine (embedded, in-process) against the fake
Anthropic upstream: summarizer request, compacted outbound view, folding on a second
compaction, and an untouched transcript."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async

from openworker.runtime.agent.compaction import CONTINUATION_CONTRACT
from sessions.models import CompactionCheckpoint, CompactionSettings, Message, Session
from tests.fakes import Reply, text, usage
from tests.support.chat import point_provider_at, read_until_status
from tests.test_engine_embedded import MODEL, open_socket

pytestmark = pytest.mark.django_db(transaction=True)


def body_text(request) -> str:
    return json.dumps(request.body, ensure_ascii=False)


async def send(ws, message: str) -> list[dict]:
    await ws.send_json_to({"type": "send", "text": message})
    events = await read_until_status(ws)
    assert events[-1]["status"] == "completed", events[-1]
    return events


async def test_a_long_session_compacts_outbound_only_and_folds_the_prior_summary(
    owner, anthropic_fake
):
    await sync_to_async(CompactionSettings.objects.update_or_create)(
        pk=1, defaults={"cap_tokens": 4_000, "keep_recent_fraction": 0.25}
    )
    # ~500 tokens each by the chars/4 estimate: the keep budget (1,000) holds one of them.
    users = [f"U{i}:" + ("lorem ipsum " * 170).strip() for i in range(4)]
    anthropic_fake.push(
        Reply(text("A0"), usage(input=1_000, output=5)),
        Reply(text("A1"), usage(input=5_000, output=5)),  # past the 4,000 trigger
        Reply(text("SUMMARY-ONE")),  # the summarizer's reply
        Reply(text("A2"), usage(input=5_000, output=5)),
        Reply(text("SUMMARY-TWO")),
        Reply(text("A3"), usage(input=1_500, output=5)),
    )
    await sync_to_async(point_provider_at)(owner, "anthropic", anthropic_fake.base_url)
    session = await Session.objects.acreate(owner=owner, model=MODEL)
    ws = await open_socket(owner, session)
    await send(ws, users[0])
    await send(ws, users[1])
    third = await send(ws, users[2])
    fourth = await send(ws, users[3])
    await ws.disconnect()

    requests = anthropic_fake.requests
    assert len(requests) == 6
    # 1. The summarizer request carries the rendered span (turns 0 and 1), not the tail.
    first_summary = body_text(requests[2])
    assert requests[2].body.get("stream") in (None, False)
    assert "U0:" in first_summary and "U1:" in first_summary and "A1" in first_summary
    assert "U2:" not in first_summary
    # 2. The next request is system + compacted block + verbatim tail.
    turn3 = requests[3].body
    assert "OpenWorker" in json.dumps(turn3["system"])
    sent = json.dumps(turn3["messages"], ensure_ascii=False)
    assert "SUMMARY-ONE" in sent and CONTINUATION_CONTRACT[:40] in sent
    assert "U2:" in sent
    assert "A0" not in sent and "lorem ipsum lorem ipsum" in sent  # U0's bulk is trimmed...
    assert sent.count("lorem ipsum") < users[0].count("lorem ipsum") * 2  # ...not resent whole
    # 3. A second compaction folds the first summary into the new one.
    second_summary = body_text(requests[4])
    assert "SUMMARY-ONE" in second_summary and "previous compaction summary" in second_summary
    assert "U2:" in second_summary
    turn4 = json.dumps(requests[5].body["messages"], ensure_ascii=False)
    assert "SUMMARY-TWO" in turn4 and "SUMMARY-ONE" not in turn4 and "U3:" in turn4
    # The user sees where it happened.
    assert any(e["type"] == "compaction" for e in third)
    assert any(e["type"] == "compaction" for e in fourth)
    checkpoints = [c async for c in CompactionCheckpoint.objects.filter(session=session)]
    assert [c.summary for c in checkpoints] == ["SUMMARY-ONE", "SUMMARY-TWO"]
    assert checkpoints[0].tokens_after < checkpoints[0].tokens_before
    # 4. The stored transcript is unchanged: every message, verbatim, in order.
    stored = [m async for m in Message.objects.filter(session=session).order_by("seq")]
    assert [m.role for m in stored] == ["user", "assistant"] * 4
    assert [m.content for m in stored if m.role == "user"] == users
    assert [m.content for m in stored if m.role == "assistant"] == ["A0", "A1", "A2", "A3"]


async def test_disabled_compaction_never_summarizes(owner, anthropic_fake):
    await sync_to_async(CompactionSettings.objects.update_or_create)(
        pk=1, defaults={"enabled": False, "cap_tokens": 4_000}
    )
    anthropic_fake.push(
        Reply(text("A0"), usage(input=9_000, output=5)),
        Reply(text("A1"), usage(input=9_500, output=5)),
    )
    await sync_to_async(point_provider_at)(owner, "anthropic", anthropic_fake.base_url)
    session = await Session.objects.acreate(owner=owner, model=MODEL)
    ws = await open_socket(owner, session)
    await send(ws, "one")
    await send(ws, "two")
    await ws.disconnect()
    assert len(anthropic_fake.requests) == 2
    assert not await CompactionCheckpoint.objects.filter(session=session).aexists()


async def test_a_failed_summary_leaves_the_turn_running_uncompacted(owner, anthropic_fake):
    from tests.fakes import overloaded

    await sync_to_async(CompactionSettings.objects.update_or_create)(
        pk=1, defaults={"cap_tokens": 4_000}
    )
    big = "x" * 8_000
    anthropic_fake.push(
        Reply(text("A0"), usage(input=6_000, output=5)),
        Reply(overloaded()),
        Reply(overloaded()),
        Reply(overloaded()),  # the summarizer gives up after the transport's retries
        Reply(text("A1"), usage(input=6_500, output=5)),
    )
    await sync_to_async(point_provider_at)(owner, "anthropic", anthropic_fake.base_url)
    session = await Session.objects.acreate(owner=owner, model=MODEL)
    ws = await open_socket(owner, session)
    await send(ws, big)
    await send(ws, "next")
    await ws.disconnect()
    assert not await CompactionCheckpoint.objects.filter(session=session).aexists()
    assert (await Message.objects.filter(session=session).order_by("-seq").afirst()).content == "A1"
