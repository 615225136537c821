from __future__ import annotations

import base64

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from sessions.models import Attachment, Session
from tests.test_degradation import make_pdf

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


@pytest.fixture
def session(owner):
    return Session.objects.create(owner=owner, model="anthropic:claude-test-1")


@pytest.fixture(autouse=True)
def _media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path


def upload(client, session, name, data, content_type="application/octet-stream"):
    url = reverse("attachment_upload", args=[session.pk])
    return client.post(url, {"file": SimpleUploadedFile(name, data, content_type=content_type)})


def test_an_image_upload_is_stored_with_its_sniffed_type_and_hash(client, owner, session):
    client.force_login(owner)
    response = upload(client, session, "pixel.png", PNG, "text/plain")
    assert response.status_code == 201
    data = response.json()
    assert data["mime"] == "image/png"  # the content decides, not the browser's header
    assert data["size"] == len(PNG)
    stored = Attachment.objects.get(pk=data["id"])
    assert stored.file.read() == PNG


def test_a_pdf_upload_is_accepted(client, owner, session):
    client.force_login(owner)
    response = upload(client, session, "report.pdf", make_pdf(["Quarterly numbers"]))
    assert response.status_code == 201
    assert response.json()["mime"] == "application/pdf"


def test_the_same_file_twice_is_stored_once(client, owner, session):
    client.force_login(owner)
    first = upload(client, session, "a.png", PNG).json()
    second = upload(client, session, "b.png", PNG).json()
    assert first["id"] == second["id"]
    assert Attachment.objects.count() == 1


def test_other_types_are_refused_with_a_clear_message(client, owner, session):
    client.force_login(owner)
    response = upload(client, session, "x.html", b"<script>alert(1)</script>", "image/png")
    assert response.status_code == 400
    assert "PDF" in response.json()["error"]
    assert Attachment.objects.count() == 0


def test_an_oversized_upload_is_refused_before_it_is_read(client, owner, session, settings):
    settings.MAX_ATTACHMENT_BYTES = 1024
    client.force_login(owner)
    response = upload(client, session, "big.png", PNG + b"\0" * 200_000)
    assert response.status_code == 413
    assert Attachment.objects.count() == 0


def test_another_users_session_is_a_404_for_upload_and_download(client, owner, teammate, session):
    client.force_login(owner)
    attachment_id = upload(client, session, "a.png", PNG).json()["id"]
    client.force_login(teammate)
    assert upload(client, session, "b.png", PNG).status_code == 404
    url = reverse("attachment_download", args=[session.pk, attachment_id])
    assert client.get(url).status_code == 404


def test_the_owner_downloads_an_attachment_sandboxed(client, owner, session):
    client.force_login(owner)
    attachment_id = upload(client, session, "a.png", PNG).json()["id"]
    response = client.get(reverse("attachment_download", args=[session.pk, attachment_id]))
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == PNG
    assert "sandbox" in response["Content-Security-Policy"]


def test_workspace_files_download_for_the_owner_only(client, owner, teammate, session, settings):
    root = settings.MEDIA_ROOT / "workspaces" / str(session.pk)
    root.mkdir(parents=True)
    (root / "notes.md").write_text("# notes")
    url = reverse("workspace_file", args=[session.pk, "notes.md"])
    client.force_login(owner)
    response = client.get(url)
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b"# notes"
    assert "attachment" in response["Content-Disposition"]
    assert (
        client.get(reverse("workspace_file", args=[session.pk, "../../etc/passwd"])).status_code
        == 404
    )
    client.force_login(teammate)
    assert client.get(url).status_code == 404


def test_a_request_of_text_alone_is_built_without_the_database_and_files_with_it(
    owner, session, django_assert_num_queries
):
    # The engine builds a request on its event loop unless the history has an image or a
    # file; a query there would raise (Django refuses sync queries on a loop).
    from openworker.runtime.agent.history import has_file_parts, outbound_messages
    from providers.types import ModelCapabilities
    from sessions.attachments import attachment_create

    caps = ModelCapabilities(vision=True)
    text = [
        {"role": "user", "content": "hello"},
        {"role": "user", "content": [{"type": "text", "text": "a part"}]},
    ]
    assert not has_file_parts(text)
    with django_assert_num_queries(0):
        built = outbound_messages(text, owner_id=owner.pk, caps=caps)
    assert [m["role"] for m in built] == ["system", "user", "user"]

    inline = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    assert has_file_parts([*text, {"role": "user", "content": [inline]}])

    image = attachment_create(
        owner=owner, session=session, upload=SimpleUploadedFile("chart.png", PNG)
    )
    stored = {"type": "image_url", "image_url": {"url": f"attachment:{image.pk}"}}
    referring = [*text, {"role": "user", "content": [stored]}]
    assert has_file_parts(referring)
    with django_assert_num_queries(1):
        built = outbound_messages(referring, owner_id=owner.pk, caps=caps)
    assert built[-1]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
