"""Access control matrix: every HTTP endpoint x {owner, another user, anonymous} x {GET, POST}.

Endpoints are enumerated from the URL resolver, so a new endpoint is covered as soon as
it is routed, and the matrix FAILS until the endpoint is classified below: public,
signed-in (acts on the requester's own data only), session-owned (an object of one
user, addressed by id), or staff (the admin). Objects: a session with messages and a
turn, an attachment, a workspace file, exports, and a provider profile. Every non-owner
cell must be 404/403/405 or a redirect to a login page, nothing may answer 5xx, and no
non-owner request may change the owner's objects or show their data.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.urls.exceptions import NoReverseMatch

from providers.edge.models import ProviderProfile
from sessions import selectors
from sessions.models import Message, Session, Turn
from tests.security.figures import record

# Signing in through a provider happens before there is a user.
PUBLIC = {
    "healthz",
    "favicon",
    "login",
    "account_set_password",
    "admin:login",
    "admin:logout",
    "sso:start",
    "sso:callback",
}
SIGNED_IN = {
    "home",
    "logout",
    "password_change",
    "password_change_done",
    "session_new",
    "session_import",
    "export_all",
    "provider_settings",
    "provider_default_model",
    "provider_edit",
    "provider_test",
    "provider_delete",
    "sidebar_search",
    "theme",
    # A shared MCP server's id: Connect / Disconnect act on the requester's own connection.
    "mcp_connect",
    "mcp_oauth_callback",
    "mcp_disconnect",
}
SESSION_OWNED = {
    "chat",
    "session_messages",
    "session_model",
    "session_rename",
    "session_mcp_servers",
    "session_archive",
    "session_delete",
    "export_json",
    "export_markdown",
    "attachment_upload",
    "attachment_download",
    "workspace_file",
    "workspace_files",
    "session_pin",
    "session_title",
    "session_archive_json",
    "session_delete_json",
    "turn_footer",
}
STAFF_NAMESPACE = "admin"
SECRET_URL = "http://alice-private-llm.example:8080/v1"
SECRET_KEY = "sk-alice-matrix-key-9f8e7d6c"
DENIED = {403, 404, 405}
# A 1x1 PNG (the upload sniffer accepts images and PDFs only), with a marker appended.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6300010000050001"
    "0d0a2db40000000049454e44ae426082"
)


def endpoints() -> list[tuple[str, str, Any]]:
    """(qualified name, route, pattern) of every routed endpoint."""

    def walk(patterns: list[Any], prefix: str, namespace: str) -> Iterator[tuple[str, str, Any]]:
        for p in patterns:
            if isinstance(p, URLResolver):
                ns = p.namespace or namespace
                yield from walk(p.url_patterns, prefix + str(p.pattern), ns)
            elif isinstance(p, URLPattern):
                # An unnamed admin route (the catch-all) is still the admin's.
                label = p.name or ("<unnamed>" if namespace else "")
                name = f"{namespace}:{label}" if namespace and label else label
                yield name, prefix + str(p.pattern), p

    return list(walk(get_resolver().url_patterns, "", ""))


def classify(name: str) -> str | None:
    if name in PUBLIC:
        return "public"
    if name.startswith(f"{STAFF_NAMESPACE}:"):
        return "staff"
    for label, names in (("public", PUBLIC), ("signed_in", SIGNED_IN), ("session", SESSION_OWNED)):
        if name in names:
            return label
    return None


def test_every_endpoint_is_classified() -> None:
    unnamed = [route for name, route, _ in endpoints() if not name]
    unclassified = [name for name, _, _ in endpoints() if name and classify(name) is None]
    assert not unnamed, f"name these routes so the matrix can classify them: {unnamed}"
    assert not unclassified, f"classify these endpoints in test_access_matrix.py: {unclassified}"


SAMPLES = ["auth", "chat_sessions", "providers", "1", "groq", "x", str(uuid.UUID(int=1))]


def url_for(name: str, pattern: Any, objects: dict[str, Any]) -> str:
    """A concrete URL for `name`, aimed at the owner's objects where it takes an id."""
    if name.endswith(":<unnamed>"):
        return "/admin/no-such-page/"
    groups = list(getattr(pattern.pattern, "converters", {}) or {}) or list(
        pattern.pattern.regex.groupindex
    )
    known = {
        "session_id": objects["session"].pk,
        "attachment_id": objects["attachment"].pk,
        "turn_id": objects["turn"].pk,
        "path": "notes.txt",
        "provider": "groq",
        "uidb64": "MQ",
        "token": "bad-token",
        "object_id": str(objects["profile"].pk),
    }
    kwargs = {g: known[g] for g in groups if g in known}
    rest = [g for g in groups if g not in known]
    if not rest:
        return reverse(name, kwargs=kwargs)
    for sample in SAMPLES:
        try:
            return reverse(name, kwargs={**kwargs, **dict.fromkeys(rest, sample)})
        except NoReverseMatch:
            continue
    raise AssertionError(f"cannot build a URL for {name} ({groups})")


@pytest.fixture
def world(owner: Any, teammate: Any, tmp_path: Any, settings: Any) -> dict[str, Any]:
    settings.MEDIA_ROOT = tmp_path / "media"
    session = Session.objects.create(owner=owner, title="Alice's plans", model="groq:llama")
    turn = Turn.objects.create(session=session, model="groq:llama", status="completed")
    Message.objects.create(
        session=session, turn=turn, seq=1, role="user", content="alice secret plan"
    )
    client = Client()
    client.force_login(owner)
    upload = SimpleUploadedFile(
        "plan.png", PNG + b"alice attachment body", content_type="image/png"
    )
    response = client.post(f"/sessions/{session.pk}/attachments/", {"file": upload})
    assert response.status_code == 201, response.content
    from sessions.models import Attachment

    attachment = Attachment.objects.get(pk=response.json()["id"])
    root = selectors.workspace_root(session.pk)
    root.mkdir(parents=True, exist_ok=True)
    (root / "notes.txt").write_text("alice workspace notes")
    profile = ProviderProfile(owner=owner, provider="groq", base_url=SECRET_URL)
    profile.set_api_key(SECRET_KEY)
    profile.save()
    return {
        "session": session,
        "turn": turn,
        "attachment": attachment,
        "profile": profile,
        "owner": owner,
        "teammate": teammate,
    }


def snapshot(world: dict[str, Any]) -> dict[str, Any]:
    session = Session.objects.filter(pk=world["session"].pk).values().first()
    return {
        "session": session,
        "messages": list(Message.objects.filter(session_id=world["session"].pk).values()),
        "turns": list(Turn.objects.filter(session_id=world["session"].pk).values()),
        "attachment": world["attachment"]
        .__class__.objects.filter(pk=world["attachment"].pk)
        .exists(),
        "profile": ProviderProfile.objects.filter(pk=world["profile"].pk).values().first(),
        "notes": (selectors.workspace_root(world["session"].pk) / "notes.txt").read_text(),
    }


def to_login(response: Any) -> bool:
    return response.status_code == 302 and "/login/" in response.get("Location", "")


def leaks(response: Any) -> bool:
    body = b"".join(response.streaming_content) if response.streaming else response.content
    markers = (b"alice secret plan", b"alice workspace notes", b"alice attachment body")
    return any(m in body for m in (*markers, SECRET_URL.encode(), SECRET_KEY.encode()))


@pytest.mark.django_db(transaction=True)
def test_no_one_but_the_owner_reaches_an_owned_object(world: dict[str, Any]) -> None:
    before = snapshot(world)
    anonymous = Client()
    other = Client()
    other.force_login(world["teammate"])
    cells = 0
    failures: list[str] = []
    for name, _route, pattern in endpoints():
        kind = classify(name)
        url = url_for(name, pattern, world)
        for method in ("get", "post"):
            for who, client in (("anonymous", anonymous), ("other", other)):
                if kind == "public" or (kind == "signed_in" and who == "other"):
                    continue  # public, or the other user acting on their own data
                if name == "logout":
                    continue  # signing out is everyone's own business (checked below)
                response = getattr(client, method)(url)
                cells += 1
                status = response.status_code
                if status >= 500:
                    failures.append(f"{who} {method.upper()} {url}: {status}")
                elif kind == "staff":
                    if not (to_login(response) or status in DENIED):
                        failures.append(f"{who} {method.upper()} {url}: {status} (staff only)")
                elif who == "anonymous":
                    if not (to_login(response) or status in DENIED):
                        failures.append(f"{who} {method.upper()} {url}: {status}")
                elif status not in DENIED:
                    failures.append(f"{who} {method.upper()} {url}: {status}")
                if leaks(response):
                    failures.append(f"{who} {method.upper()} {url}: shows the owner's data")
    assert not failures, "\n".join(failures)
    assert snapshot(world) == before, "a non-owner request changed the owner's objects"
    record("access.denied_cells", cells, "non-owner HTTP cells (endpoint x method x who) denied")


@pytest.mark.django_db(transaction=True)
def test_the_owner_reaches_every_owned_endpoint(world: dict[str, Any]) -> None:
    # Control for the matrix: the 404s above are about who asks, not broken routes.
    owner = Client()
    owner.force_login(world["owner"])
    for name, _route, pattern in endpoints():
        if classify(name) != "session" or name in {"session_delete", "attachment_upload"}:
            continue
        response = owner.get(url_for(name, pattern, world))
        assert response.status_code in {200, 302, 400, 405}, (name, response.status_code)


@pytest.mark.django_db(transaction=True)
def test_signed_in_pages_show_only_the_requesters_own_data(world: dict[str, Any]) -> None:
    other = Client()
    other.force_login(world["teammate"])
    pages = 0
    for name, _route, pattern in endpoints():
        if classify(name) != "signed_in" or name == "logout":
            continue
        for method in ("get", "post"):
            response = getattr(other, method)(url_for(name, pattern, world))
            pages += 1
            assert response.status_code < 500, (name, method, response.status_code)
            assert not leaks(response), (name, method)
    assert ProviderProfile.objects.filter(pk=world["profile"].pk).exists()
    assert Session.objects.filter(pk=world["session"].pk).exists()
    record("access.own_data_cells", pages, "signed-in cells of another user: own data only")


@pytest.mark.django_db(transaction=True)
def test_unknown_and_malformed_ids_are_404_not_errors(world: dict[str, Any]) -> None:
    owner = Client()
    owner.force_login(world["owner"])
    for path in (
        f"/sessions/{uuid.uuid4()}/",
        f"/sessions/{uuid.uuid4()}/export.json",
        f"/sessions/{world['session'].pk}/attachments/{uuid.uuid4()}",
        f"/sessions/{world['session'].pk}/files/../../etc/passwd",
        f"/sessions/{world['session'].pk}/files/%2e%2e/%2e%2e/etc/passwd",
        "/sessions/not-a-uuid/",
    ):
        assert owner.get(path).status_code == 404, path
