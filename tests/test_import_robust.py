"""Import is schema-checked with limits, all or nothing; attachments travel in the JSON
export and come back; and no stored session, however crafted, breaks its owner's chat
page, message list or any export."""

from __future__ import annotations

import io
import json
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from openworker.runtime.turns import commands
from sessions import importing, services
from sessions.attachments import attachment_create
from sessions.models import Attachment, Message, Session
from tests.test_attachments import PNG

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path


def doc(messages, **extra) -> bytes:
    body = {"format": "openworker.session", "version": 1, "session": {"title": "T"}}
    body.update(messages=messages, **extra)
    return json.dumps(body).encode()


def post_import(client, data: bytes):
    upload = SimpleUploadedFile("x.json", data, content_type="application/json")
    return client.post(reverse("session_import"), {"file": upload})


def nested(depth: int):
    value: object = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


MALFORMED = [
    (b"[" * 100_000, "nests deeper"),
    (doc([{"role": "user", "content": "x", "extras": nested(40)}]), "nests deeper"),
    (doc([42]), "messages[0] must be of type object"),
    (doc([{"role": "user", "content": 7}]), "messages[0].content must be text or a list"),
    (doc([{"role": "user", "content": [{"type": "text"}]}]), "lacks 'text'"),
    (doc([{"seq": 1, "role": "user"}, {"role": "assistant"}]), "every message has a seq"),
    (doc([{"seq": None, "role": "user"}]), "messages[0].seq must be of type integer"),
    (doc([{"seq": 1, "role": "user"}, {"seq": 1, "role": "user"}]), "the same seq"),
    (b'{"format": "openworker.session", "version": 1, "messages": '
     b'[{"role": "user", "content": "a\\ud800b"}]}', "unpaired surrogate"),
    (b'{"format": "openworker.session", "version": 1, "session": {"title": "a\\u0000"}, '
     b'"messages": []}', "session.title contains a NUL"),
    (doc([{"role": "assistant", "model": "m" * 10_000}]), "model is longer than 200"),
    (doc([{"role": "tool", "tool_call_id": "t" * 10_000}]), "tool_call_id is longer than 200"),
    (doc([{"role": "user"}] * (importing.MAX_MESSAGES + 1)), "more than 10,000 entries"),
    (doc([], attachments=[{"id": "0" * 8 + "-0000-0000-0000-" + "0" * 12, "data": "@@"}]),
     "attachments[0].data is not base64"),
    (doc([], attachments=[{"id": "0" * 8 + "-0000-0000-0000-" + "0" * 12,
                           "data": "aGVsbG8="}]), "not a PNG"),
    (doc([{"role": "user", "tool_calls": [{"id": "t1"}]}]), "lacks 'name'"),
    (doc([{"role": "user", "usage": {"input": "lots"}}]), "usage.input must be of type"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "reason"), MALFORMED)
def test_a_malformed_import_is_a_400_naming_what_is_wrong_and_saves_nothing(
    client, owner, data, reason
):
    client.force_login(owner)
    response = post_import(client, data)
    assert response.status_code == 400
    assert reason in response.content.decode().replace("&#x27;", "'")
    assert not Session.objects.filter(owner=owner).exists()
    assert not Message.objects.exists() and not Attachment.objects.exists()


def exported(client, session) -> bytes:
    response = client.get(reverse("export_json", args=[session.pk]))
    return b"".join(response.streaming_content)


def session_with_png(owner) -> tuple[Session, Attachment]:
    picture = attachment_create(
        owner=owner, session=None, upload=SimpleUploadedFile("cat.png", PNG, "image/png")
    )
    session = services.session_create(owner=owner, model="anthropic:claude-sonnet-5")
    content = [
        {"type": "text", "text": "What is this?"},
        *commands.attachment_parts(user=owner, attachment_ids=[str(picture.pk)]),
    ]
    services.message_append(session_id=session.pk, role="user", content=content)
    return session, picture


def test_attachments_travel_in_the_json_export_and_come_back_for_another_user(
    client, owner, teammate
):
    session, picture = session_with_png(owner)
    client.force_login(owner)
    data = exported(client, session)
    assert json.loads(data)["attachments"][0]["sha256"] == picture.sha256

    client.force_login(teammate)
    response = post_import(client, data)
    assert response.status_code == 302
    imported = Session.objects.get(owner=teammate)
    theirs = Attachment.objects.get(owner=teammate)
    assert theirs.pk != picture.pk and theirs.sha256 == picture.sha256
    part = Message.objects.get(session=imported).content[1]
    assert part["attachment"]["id"] == str(theirs.pk)
    assert part["image_url"]["url"] == f"attachment:{theirs.pk}"
    download = client.get(reverse("attachment_download", args=[imported.pk, theirs.pk]))
    assert download.status_code == 200
    assert b"".join(download.streaming_content) == PNG
    # The chat page shows it as the image it is, not a broken link.
    page = client.get(reverse("chat", args=[imported.pk])).content.decode()
    assert reverse("attachment_download", args=[imported.pk, theirs.pk]) in page


def test_a_part_naming_an_attachment_the_file_lacks_imports_as_a_note(client, owner):
    client.force_login(owner)
    data = doc(
        [{"role": "user", "content": [{"type": "image_url", "attachment": {"id": "abc",
                                                                          "name": "p.png"}}]}]
    )  # fmt: skip
    assert post_import(client, data).status_code == 302
    part = Message.objects.get().content[0]
    assert part == {"type": "text", "text": "[attachment not in the export: p.png]"}


def test_an_import_whose_second_attachment_is_bad_leaves_no_file_behind(client, owner, settings):
    good = {"id": "11111111-1111-1111-1111-111111111111", "data": _b64(PNG)}
    bad = {"id": "22222222-2222-2222-2222-222222222222", "data": _b64(b"not an image")}
    client.force_login(owner)
    response = post_import(client, doc([], attachments=[good, bad]))
    assert response.status_code == 400
    assert "attachments[1]" in response.content.decode()
    assert not Attachment.objects.exists()
    assert not list(settings.MEDIA_ROOT.rglob("*"))


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


# --- no stored session breaks a page -------------------------------------------------------

CRAFTED_CONTENT = [
    [{"type": "image_url", "attachment": "not-a-dict"}],
    [{"type": "image_url", "attachment": {"id": "not-a-uuid", "name": 5}}],
    [{"type": "file", "file": "x", "attachment": {"id": None}}],
    [42, None, "text", {"type": "text"}, {"no": "type"}],
    {"type": "text", "text": "a dict, not a list"},
    12345,
    [{"type": "text", "text": {"nested": ["not", "text"]}}],
]


def crafted_session(owner) -> Session:
    session = services.session_create(owner=owner, model="m")
    seq = 0
    for content in CRAFTED_CONTENT:
        seq += 1
        Message.objects.create(session=session, seq=seq, role="user", content=content)
    rows = [
        dict(role="assistant", content="ok", tool_calls={"not": "a list"}, extras=["x"]),
        dict(role="assistant", content="ok", tool_calls=["a", 1, {"name": 2}], usage="many"),
        dict(role="tool", content=[{"type": "text", "text": 3}], extras=["not", "a", "dict"]),
    ]
    for row in rows:
        seq += 1
        Message.objects.create(session=session, seq=seq, **row)
    Session.objects.filter(pk=session.pk).update(next_seq=seq + 1)
    return session


def test_no_crafted_stored_session_breaks_the_chat_page_message_list_or_exports(client, owner):
    session = crafted_session(owner)
    client.force_login(owner)
    assert client.get(reverse("chat", args=[session.pk])).status_code == 200
    listing = client.get(reverse("session_messages", args=[session.pk]), {"after": 0})
    assert listing.status_code == 200 and len(listing.json()["messages"]) == 10
    older = client.get(reverse("session_messages", args=[session.pk]), {"before": 11})
    assert older.status_code == 200
    data = json.loads(exported(client, session))
    assert len(data["messages"]) == 10 and data["attachments"] == []
    markdown = b"".join(
        client.get(reverse("export_markdown", args=[session.pk])).streaming_content
    ).decode()
    assert markdown.count("## User") == len(CRAFTED_CONTENT)
    archive = b"".join(client.get(reverse("export_all")).streaming_content)
    with zipfile.ZipFile(io.BytesIO(archive)) as opened:
        names = opened.namelist()
        assert len(names) == 2
        assert json.loads(opened.read(next(n for n in names if n.endswith(".json"))))
    # And its JSON export imports again (the crafted parts are refused or kept as data).
    response = post_import(client, json.dumps(data).encode())
    assert response.status_code in (302, 400)
