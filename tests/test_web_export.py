"""Export (JSON, Markdown, zip of all sessions) and import of our JSON export."""

from __future__ import annotations

import io
import json
import tracemalloc
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from openworker.runtime.turns import commands
from providers.edge.models import ProviderProfile
from sessions import export, selectors, services
from sessions.models import Message, Session, Turn

# Ends in letters no uuid, hash or timestamp in an export can contain (a digit tail like
# "0011" turned up by chance in a random session id).
CANARY_KEY = "sk-canary-7f3e9a1b2c4d5e6fQzXw"


def _png(owner):
    """A real upload: attachments travel in the JSON export and come back on import."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from sessions.attachments import attachment_create
    from tests.test_attachments import PNG

    return attachment_create(
        owner=owner, session=None, upload=SimpleUploadedFile("p.png", PNG, "image/png")
    )


@pytest.fixture
def session(owner):
    session = services.session_create(
        owner=owner, model="anthropic:claude-sonnet-4-5", title="Trip"
    )
    turn = Turn.objects.create(
        session=session, model=session.model, status="completed", cost="0.0042", steps=1,
        usage={"input": 10, "output": 5, "cache_read": 3, "cache_write": 0},
    )  # fmt: skip
    services.message_append(
        session_id=session.pk,
        role="user",
        turn_id=turn.pk,
        content=[
            {"type": "text", "text": "What is in this?"},
            *commands.attachment_parts(user=owner, attachment_ids=[str(_png(owner).pk)]),
        ],
    )
    services.message_append(
        session_id=session.pk,
        role="assistant",
        turn_id=turn.pk,
        content="A cat. ```code```",
        reasoning="Looks feline",
        extras={"_anthropic": {"signature": "sig-123"}},
        tool_calls=[{"id": "t1", "name": "fetch_url", "arguments": {"url": "https://x.test"}}],
        usage={"input": 10, "output": 5, "cache_read": 3, "cache_write": 0},
        model=session.model,
        finish_reason="tool_calls",
    )
    services.message_append(
        session_id=session.pk,
        role="tool",
        turn_id=turn.pk,
        content="page ``` text",
        tool_call_id="t1",
        extras={"tool": "fetch_url", "is_error": False},
    )
    return session


@pytest.fixture
def canary_profiles(owner):
    own = ProviderProfile(owner=owner, provider="anthropic", base_url="https://proxy.canary.test")
    own.set_api_key(CANARY_KEY)
    own.save()
    org = ProviderProfile(owner=None, provider="openai")
    org.set_api_key(CANARY_KEY + "org")
    org.save()
    return own


def streamed(response) -> bytes:
    assert response.streaming
    return b"".join(response.streaming_content)


def test_json_export_is_the_lossless_canonical_transcript_with_usage(client, owner, session):
    client.force_login(owner)
    response = client.get(reverse("export_json", args=[session.pk]))
    assert response["Content-Disposition"].startswith("attachment;")
    data = json.loads(streamed(response))
    assert data["format"] == export.EXPORT_FORMAT
    exported = [
        {
            k: v
            for k, v in m.items()
            if k not in {"seq", "parent", "created_at", "model", "finish_reason", "turn"}
        }
        for m in data["messages"]
    ]
    assert exported == selectors.session_history(session_id=session.pk)
    assert data["turns"][0]["cost"] == "0.004200"
    assert data["usage"]["input"] == 10 and data["usage"]["cost"] == "0.004200"


def test_exports_contain_no_key_material(client, owner, session, canary_profiles):
    client.force_login(owner)
    documents = [
        streamed(client.get(reverse("export_json", args=[session.pk]))),
        streamed(client.get(reverse("export_markdown", args=[session.pk]))),
    ]
    archive = zipfile.ZipFile(io.BytesIO(streamed(client.get(reverse("export_all")))))
    documents += [archive.read(name) for name in archive.namelist()]
    encrypted = canary_profiles.api_key_encrypted.encode()
    for document in documents:
        assert CANARY_KEY.encode() not in document
        assert encrypted not in document
        assert b"proxy.canary.test" not in document
        assert CANARY_KEY[-4:].encode() not in document


def test_markdown_export_reads_as_a_conversation(client, owner, session):
    client.force_login(owner)
    text = streamed(client.get(reverse("export_markdown", args=[session.pk]))).decode()
    assert text.startswith("# Trip")
    assert "## User" in text and "*[image: p.png]*" in text
    assert "**Tool call:** `fetch_url`" in text
    # A fence longer than the backticks inside the tool output, so it cannot end early.
    assert "````\npage ``` text\n````" in text


def test_archive_holds_every_own_session_and_no_one_elses(client, owner, teammate, session):
    services.session_create(owner=owner, title="Second")
    services.session_create(owner=teammate, title="Theirs")
    client.force_login(owner)
    archive = zipfile.ZipFile(io.BytesIO(streamed(client.get(reverse("export_all")))))
    assert archive.testzip() is None
    names = archive.namelist()
    assert len(names) == 4 and any(n.startswith("trip-") for n in names)
    assert not any(n.startswith("theirs-") for n in names)
    data = json.loads(
        archive.read(next(n for n in names if n.startswith("trip-") and n.endswith(".json")))
    )
    assert len(data["messages"]) == 3


def test_json_export_streams_in_constant_memory(owner):
    session = services.session_create(owner=owner, title="Long")
    filler = "x" * 2_000
    Message.objects.bulk_create(
        Message(session=session, seq=i, role="user", content=filler) for i in range(1, 6001)
    )
    chunks = export.session_json_chunks(session)
    tracemalloc.start()
    total = 0
    for chunk in chunks:
        total += len(chunk)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert total > 12_000_000
    assert peak < total / 4  # bounded by a chunk of rows, not by the session


def test_import_round_trip_gives_the_same_canonical_messages(client, owner, session):
    # The session's custom model runs on the owner's own key (the model policy).
    ProviderProfile.objects.create(owner=owner, provider="anthropic")
    client.force_login(owner)
    exported = streamed(client.get(reverse("export_json", args=[session.pk])))
    upload = SimpleUploadedFile("trip.json", exported, content_type="application/json")
    response = client.post(reverse("session_import"), {"file": upload})
    imported = Session.objects.exclude(pk=session.pk).get(owner=owner)
    assert response["Location"] == reverse("chat", args=[imported.pk])
    before = selectors.session_history(session_id=session.pk)
    after = selectors.session_history(session_id=imported.pk)
    assert after == before  # the same upload: the owner's attachment is reused
    assert imported.title == "Trip" and imported.model == session.model
    # The new session continues where the transcript ends.
    message = services.message_append(session_id=imported.pk, role="user", content="more")
    assert message.seq == 4


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"not json", "not valid JSON"),
        (b'{"format": "other"}', "not an OpenWorker"),
        (b'{"format": "openworker.session", "version": 99, "messages": []}', "version"),
        (
            b'{"format": "openworker.session", "version": 1, "session": {}, '
            b'"messages": [{"role": "hacker", "content": "x"}]}',
            "messages[0].role must be one of",
        ),
    ],
)
def test_import_refuses_what_is_not_our_export(client, owner, payload, reason):
    client.force_login(owner)
    upload = SimpleUploadedFile("x.json", payload, content_type="application/json")
    response = client.post(reverse("session_import"), {"file": upload})
    assert response.status_code == 400
    assert reason in response.content.decode()
    assert not Session.objects.filter(owner=owner).exists()
