"""The web app's session pages: list, search, chat page, paging, management, ownership."""

from __future__ import annotations

import re
import uuid

import pytest
from django.test import Client
from django.urls import reverse

from providers.edge.models import ProviderProfile
from sessions import selectors, services
from sessions.models import CompactionCheckpoint, Message, Session, Turn, UserPreferences


@pytest.fixture
def session(owner):
    return services.session_create(owner=owner, model="anthropic:claude-sonnet-4-5", title="Plans")


def add(session, role="user", content="hello", **fields):
    return services.message_append(session_id=session.pk, role=role, content=content, **fields)


# Every URL that names a session, with the method that changes something where relevant.
def session_urls(session_id):
    attachment = uuid.uuid4()
    return [
        ("get", reverse("chat", args=[session_id])),
        ("get", reverse("session_messages", args=[session_id]) + "?after=0"),
        ("get", reverse("session_messages", args=[session_id]) + "?before=5"),
        ("post", reverse("session_model", args=[session_id])),
        ("get", reverse("session_rename", args=[session_id])),
        ("post", reverse("session_rename", args=[session_id])),
        ("post", reverse("session_archive", args=[session_id])),
        ("get", reverse("session_delete", args=[session_id])),
        ("post", reverse("session_delete", args=[session_id])),
        ("get", reverse("export_json", args=[session_id])),
        ("get", reverse("export_markdown", args=[session_id])),
        ("post", reverse("attachment_upload", args=[session_id])),
        ("get", reverse("attachment_download", args=[session_id, attachment])),
        ("get", reverse("workspace_file", args=[session_id, "notes.txt"])),
    ]


def test_it_answers_404_to_another_user_on_every_session_url(client, owner, teammate, session):
    add(session)
    client.force_login(teammate)
    for method, url in session_urls(session.pk):
        response = getattr(client, method)(url, {"title": "x", "model": "m"})
        assert response.status_code == 404, (method, url, response.status_code)
    session.refresh_from_db()
    assert session.title == "Plans" and not session.archived
    assert Session.objects.filter(pk=session.pk).exists()


def test_every_post_needs_a_csrf_token(owner, session):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    posts = [url for method, url in session_urls(session.pk) if method == "post"]
    posts += [reverse("session_new"), reverse("session_import")]
    for url in posts:
        assert client.post(url, {"title": "x"}).status_code == 403, url


def test_the_list_shows_own_sessions_newest_first_and_pages(client, owner, teammate):
    for i in range(30):
        services.session_create(owner=owner, title=f"Mine {i:02d}")
    services.session_create(owner=teammate, title="Not mine")
    client.force_login(owner)
    body = client.get(reverse("home")).content.decode()
    titles = re.findall(r'class="title" href="[^"]+">([^<]+)<', body)
    assert titles[0] == "Mine 29" and len(titles) == 25
    assert "Not mine" not in body
    second = client.get(reverse("home") + "?page=2").content.decode()
    assert "Mine 00" in second and "Mine 29" not in second


def test_search_matches_titles_and_message_text(client, owner, teammate):
    budget = services.session_create(owner=owner, title="Budget review")
    trip = services.session_create(owner=owner, title="Untitled")
    add(trip, content="Book the train to Lyon for Tuesday")
    other = services.session_create(owner=teammate, title="Lyon too")
    add(other, content="Lyon")
    client.force_login(owner)
    found = client.get(reverse("home") + "?q=lyon").context["sessions"]
    assert [s.pk for s in found] == [trip.pk]
    found = client.get(reverse("home") + "?q=budget").context["sessions"]
    assert [s.pk for s in found] == [budget.pk]


def test_search_finds_text_inside_multipart_messages_and_non_ascii(owner):
    session = services.session_create(owner=owner, title="x")
    add(session, content=[{"type": "text", "text": "Le café est prêt"}])
    hits = selectors.session_list_page(user=owner, query="café")
    assert list(hits) == [session]


def test_archived_sessions_leave_the_list_and_can_be_restored(client, owner, session):
    client.force_login(owner)
    client.post(reverse("session_archive", args=[session.pk]), {"archived": "1"})
    assert session not in client.get(reverse("home")).context["sessions"]
    assert session in client.get(reverse("home") + "?archived=1").context["sessions"]
    client.post(reverse("session_archive", args=[session.pk]), {"archived": "0"})
    assert session in client.get(reverse("home")).context["sessions"]


def test_rename_changes_the_title(client, owner, session):
    client.force_login(owner)
    response = client.post(reverse("session_rename", args=[session.pk]), {"title": "  New   name "})
    assert response.status_code == 302
    session.refresh_from_db()
    assert session.title == "New name"


def test_rename_refuses_an_empty_title(client, owner, session):
    client.force_login(owner)
    response = client.post(reverse("session_rename", args=[session.pk]), {"title": "  "})
    assert response.status_code == 400
    session.refresh_from_db()
    assert session.title == "Plans"


def test_rename_never_redirects_off_site(client, owner, session):
    client.force_login(owner)
    response = client.post(
        reverse("session_rename", args=[session.pk]), {"title": "x", "next": "https://evil.test/"}
    )
    assert response["Location"] == reverse("chat", args=[session.pk])


def test_delete_asks_for_confirmation_then_deletes(client, owner, session):
    add(session)
    client.force_login(owner)
    confirm = client.get(reverse("session_delete", args=[session.pk]))
    assert confirm.status_code == 200 and b"Delete session" in confirm.content
    assert Session.objects.filter(pk=session.pk).exists()
    client.post(reverse("session_delete", args=[session.pk]))
    assert not Session.objects.filter(pk=session.pk).exists()
    assert not Message.objects.filter(session_id=session.pk).exists()


def test_delete_is_refused_while_a_turn_runs(client, owner, session):
    Turn.objects.create(session=session, model="m", status=Turn.Status.RUNNING)
    client.force_login(owner)
    client.post(reverse("session_delete", args=[session.pk]))
    assert Session.objects.filter(pk=session.pk).exists()


def test_new_session_uses_the_picked_or_custom_model(client, owner):
    # A custom id runs on the user's own key (the default model policy): they have one.
    ProviderProfile.objects.create(owner=owner, provider="ollama", base_url="http://10.0.0.5")
    client.force_login(owner)
    client.post(reverse("session_new"), {"model": "__custom__", "custom_model": "ollama:qwen3:8b"})
    assert Session.objects.get(owner=owner).model == "ollama:qwen3:8b"


def test_new_session_defaults_to_the_users_default_model(client, owner):
    UserPreferences.objects.create(user=owner, default_model="openai:gpt-5.5")
    client.force_login(owner)
    client.post(reverse("session_new"), {})
    assert Session.objects.get(owner=owner).model == "openai:gpt-5.5"


# --- the chat page -----------------------------------------------------------------------------


def test_chat_page_renders_markdown_on_the_server_and_no_inline_script(client, owner, session):
    add(session, content="Hi")
    add(session, role="assistant", content="**bold** <script>alert(1)</script>")
    client.force_login(owner)
    response = client.get(reverse("chat", args=[session.pk]))
    body = response.content.decode()
    assert "<strong>bold</strong>" in body
    assert "<script>alert(1)" not in body
    scripts = re.findall(r"<script([^>]*)>", body)
    assert scripts and all('src="' in s or 'type="application/json"' in s for s in scripts)
    assert " style=" not in body
    assert "unsafe-inline" not in response["Content-Security-Policy"]


def test_chat_page_shows_reasoning_tool_cards_and_results(client, owner, session):
    add(session, content="read it")
    add(
        session,
        role="assistant",
        content="",
        reasoning="I should fetch",
        tool_calls=[{"id": "c1", "name": "fetch_url", "arguments": {"url": "https://a.test"}}],
    )
    add(session, role="tool", content="page text", tool_call_id="c1", extras={"tool": "fetch_url"})
    client.force_login(owner)
    body = client.get(reverse("chat", args=[session.pk])).content.decode()
    assert '<details class="reasoning">' in body and "I should fetch" in body
    assert 'class="tool-card" data-call-id="c1"' in body and "https://a.test" in body
    assert 'class="msg msg-tool' in body and "page text" in body


def test_chat_page_windows_a_long_session_with_constant_queries(
    client, owner, session, django_assert_max_num_queries
):
    turn = Turn.objects.create(session=session, model="m", status=Turn.Status.COMPLETED, cost="0.5")
    Message.objects.bulk_create(
        Message(
            session=session,
            seq=i,
            role="user" if i % 2 else "assistant",
            content=f"m{i}",
            turn=turn,
        )
        for i in range(1, 601)
    )
    Session.objects.filter(pk=session.pk).update(next_seq=601)
    CompactionCheckpoint.objects.create(
        session=session, boundary_seq=550, boundary_index=549, summary="Earlier: **plans**"
    )
    client.force_login(owner)
    client.get(reverse("chat", args=[session.pk]))  # warm caches (matrix, content types)
    # 14 for the transcript window, + 3 for the workspace around it (the sidebar's sessions,
    # the user's theme, which providers have a key): none grows with the session.
    with django_assert_max_num_queries(17):
        response = client.get(reverse("chat", args=[session.pk]))
    body = response.content.decode()
    seqs = [int(s) for s in re.findall(r'data-seq="(\d+)"', body)]
    assert seqs == list(range(501, 601))
    assert "Load earlier messages" in body
    assert "<strong>plans</strong>" in body  # the checkpoint summary, in <details>


def test_load_earlier_pages_by_seq(client, owner, session):
    Message.objects.bulk_create(
        Message(session=session, seq=i, role="user", content=f"m{i}") for i in range(1, 251)
    )
    client.force_login(owner)
    data = client.get(reverse("session_messages", args=[session.pk]) + "?before=151").json()
    seqs = [int(s) for s in re.findall(r'data-seq="(\d+)"', data["html"])]
    assert seqs == list(range(51, 151)) and data["first_seq"] == 51 and data["has_more"]
    data = client.get(reverse("session_messages", args=[session.pk]) + "?before=51").json()
    assert data["first_seq"] == 1 and not data["has_more"]


def test_messages_after_returns_each_message_rendered_by_seq(client, owner, session):
    add(session, content="one")
    add(session, role="assistant", content="# two")
    client.force_login(owner)
    data = client.get(reverse("session_messages", args=[session.pk]) + "?after=1").json()
    assert [m["seq"] for m in data["messages"]] == [2]
    assert "<h1>two</h1>" in data["messages"][0]["html"]


def test_failed_last_turn_shows_the_friendly_error_and_retry(client, owner, session):
    turn = Turn.objects.create(
        session=session,
        model="m",
        status=Turn.Status.FAILED,
        error_kind="no_quota",
        error="Your account has run out of credit.",
    )
    add(session, content="hi", turn_id=turn.pk)
    client.force_login(owner)
    body = client.get(reverse("chat", args=[session.pk])).content.decode()
    assert "Your account has run out of credit." in body
    assert f'data-action="retry" data-turn="{turn.pk}"' in body


def test_turn_and_session_cost_show_only_when_known(client, owner, session):
    priced = Turn.objects.create(
        session=session, model="m", status="completed", cost="0.0123", steps=1
    )
    add(session, content="q", turn_id=priced.pk)
    client.force_login(owner)
    body = client.get(reverse("chat", args=[session.pk])).content.decode()
    assert (
        "Reply cost $0.0123" in body
        and "Session cost <span data-session-cost-value>$0.0123" in body
    )
    unpriced = Turn.objects.create(session=session, model="m", status="completed", steps=1)
    add(session, content="q2", turn_id=unpriced.pk)
    body = client.get(reverse("chat", args=[session.pk])).content.decode()
    assert "data-session-cost hidden" in body


def test_context_meter_is_hidden_when_the_window_is_unknown(client, owner):
    session = services.session_create(owner=owner, model="ollama:mystery-model")
    Session.objects.filter(pk=session.pk).update(last_context_tokens=1234)
    client.force_login(owner)
    body = client.get(reverse("chat", args=[session.pk])).content.decode()
    assert "data-context-meter hidden" in body


def test_context_meter_shows_tokens_against_a_known_window(client, owner, session, monkeypatch):
    from providers.types import ModelCapabilities

    monkeypatch.setattr(
        "providers.router.ProviderRouter.capabilities",
        lambda self, model: ModelCapabilities(context_window=200_000, curated=True),
    )
    Session.objects.filter(pk=session.pk).update(last_context_tokens=50_000)
    client.force_login(owner)
    body = client.get(reverse("chat", args=[session.pk])).content.decode()
    assert "25% of 200000 tokens" in body


def test_switching_model_says_what_is_degraded(client, owner, session):
    # A custom id runs on the user's own key (the default model policy).
    ProviderProfile.objects.create(owner=owner, provider="ollama", base_url="http://10.0.0.5")
    add(
        session,
        content=[
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "attachment:x"}, "attachment": {"id": "x"}},
        ],
    )
    client.force_login(owner)
    response = client.post(
        reverse("session_model", args=[session.pk]),
        {"model": "__custom__", "custom_model": "ollama:llama3.3"},
    )
    data = response.json()
    session.refresh_from_db()
    assert session.model == "ollama:llama3.3"
    assert data["caps"]["curated"] is False
    assert "images" in data["note"]


def test_custom_model_shows_a_capabilities_unknown_warning(client, owner):
    session = services.session_create(owner=owner, model="ollama:llama3.3")
    client.force_login(owner)
    body = client.get(reverse("chat", args=[session.pk])).content.decode()
    assert "Capabilities unknown" in body
    assert 'value="__custom__" selected' in body


def test_an_interrupted_turns_partial_text_is_shown_escaped_with_retry(client, owner):
    from sessions.models import Turn

    session = services.session_create(owner=owner, model="anthropic:claude-test-1")
    add(session, content="Tell me a story")
    Turn.objects.create(
        session=session,
        model=session.model,
        status=Turn.Status.INTERRUPTED,
        error="The worker running this reply stopped. Retry to continue.",
        partial_text="Once upon a <b>time</b>",
    )
    client.force_login(owner)
    body = client.get(f"/sessions/{session.pk}/").content.decode()
    assert "Once upon a &lt;b&gt;time&lt;/b&gt;" in body
    assert 'data-action="retry"' in body


def test_switching_to_a_model_without_reasoning_says_so(client, owner, session):
    # A custom id runs on the user's own key (the default model policy).
    ProviderProfile.objects.create(owner=owner, provider="ollama", base_url="http://10.0.0.5")
    add(session, content="think hard")
    add(session, role="assistant", content="done", reasoning="step one, step two")
    client.force_login(owner)
    url = reverse("session_model", args=[session.pk])
    data = client.post(url, {"model": "__custom__", "custom_model": "ollama:llama3.3"}).json()
    assert "shows no reasoning" in data["note"]
