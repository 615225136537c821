"""A new session's title: a few words from a cheap model call over the exchange the engine
has in memory, the first words of the user's message when that call fails, and never over
a title the user set."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from openworker.runtime.agent import titles
from openworker.runtime.agent.llm import router_for_user
from sessions import services
from sessions.models import Message
from tests.fakes import Reply, text

pytestmark = pytest.mark.django_db


def add(session, role="user", content="hello"):
    return services.message_append(session_id=session.pk, role=role, content=content)


def first_messages(session) -> list[Message]:
    return list(Message.objects.filter(session=session).order_by("seq"))


def test_title_comes_from_a_cheap_model_call(owner, openai_fake):
    from tests.support.chat import point_provider_at

    point_provider_at(owner, "deepseek", openai_fake.base_url)
    session = services.session_create(owner=owner, model="deepseek:deepseek-chat")
    add(session, content="How do I rotate our database credentials?")
    add(session, role="assistant", content="Here is how...")
    openai_fake.push(Reply(text('"Rotating database credentials"')))
    request = titles.title_request_for(session, first_messages(session))
    assert request is not None
    router = router_for_user(owner.pk)
    try:
        title = async_to_sync(titles.atitle_from_model)(request, router)
    finally:
        router.close()
    assert title == "Rotating database credentials"
    assert services.session_title_save(session_id=session.pk, title=title) == title
    session.refresh_from_db()
    assert session.title == title
    body = openai_fake.requests[-1].body
    assert body["max_tokens"] == titles.TITLE_MAX_TOKENS
    # One read of the whole reply: a streamed title is an event per token on the loop
    # that streams every other reply.
    assert not body.get("stream")
    assert "How do I rotate" in body["messages"][-1]["content"]


def test_title_falls_back_to_the_first_words_when_the_call_fails(owner):
    session = services.session_create(owner=owner, model="openai:gpt-5.5")
    add(session, content="please summarise the quarterly numbers for the board meeting next week")

    class Broken:
        async def astream(self, **kwargs):
            raise RuntimeError("no network")
            yield  # pragma: no cover - an async generator that fails at once

    request = titles.title_request_for(session, first_messages(session))
    assert request is not None
    assert async_to_sync(titles.atitle_from_model)(request, Broken()) == ""
    assert request.fallback == "please summarise the quarterly numbers for the board…"


def test_title_never_overwrites_a_users_title(owner):
    session = services.session_create(owner=owner, title="Plans")
    add(session, content="anything")
    assert titles.title_request_for(session, first_messages(session)) is None
    assert services.session_title_save(session_id=session.pk, title="Other") == "Plans"


def test_titles_saved_together_keep_the_users_and_answer_each_sessions_title(owner):
    fresh = services.session_create(owner=owner)
    named = services.session_create(owner=owner, title="Plans")
    twice = services.session_create(owner=owner)
    gone = services.session_create(owner=owner)
    gone_id = gone.pk
    gone.delete()
    saved = services.session_titles_save(
        [
            (fresh.pk, "Rotating keys"),
            (named.pk, "Other"),
            (twice.pk, "First"),
            (str(twice.pk), "Second"),
            (gone_id, "Nobody"),
        ]
    )
    assert saved == ["Rotating keys", "Plans", "First", "First", ""]
    for session, title in ((fresh, "Rotating keys"), (named, "Plans"), (twice, "First")):
        session.refresh_from_db()
        assert session.title == title
