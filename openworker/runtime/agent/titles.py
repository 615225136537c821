"""A new session's title, asked of a model from the first exchange the engine has in
memory (no query, no thread): a few words, or the first words of the user's message when
the call fails. Saving it never overwrites a title the user set
(`sessions.services.session_title_save`); the titles of a wave of new sessions, whose
turns end together, are saved together (`title_saver`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from openworker.runtime.store.gather import Gatherer, PerLoop
from sessions.content import text_parts
from sessions.models import Message, Session
from sessions.services import TITLE_MAX_CHARS, session_titles_save

logger = logging.getLogger(__name__)

# Titles per save: one UPDATE's CASE list.
MAX_SAVE_BATCH = 100

# The running event loop's gatherer of title saves, (session id, title) each: answers
# are the titles the sessions then have.
title_saver: PerLoop[tuple[Any, str], str] = PerLoop(
    lambda: Gatherer(session_titles_save, max_batch=MAX_SAVE_BATCH)
)

# The exchange a title is asked for: the first user message and the first reply.
ROLES = ("user", "assistant")

# The fallback title: the first words of the user's first message.
TITLE_FALLBACK_WORDS = 8


# The titling call is tiny on purpose: a few words out, a clipped exchange in.
TITLE_MAX_TOKENS = 40


TITLE_EXCHANGE_CHARS = 2_000


# Quotes (straight and curly) and Markdown emphasis models like to wrap a title in.
TITLE_STRIP_CHARS = "\"'\u201c\u201d\u2018\u2019*#"


TITLE_PROMPT = (
    "Write a short title (at most 8 words) for the conversation below. "
    "Reply with the title only: no quotes, no punctuation at the end."
)


def title_fallback(text: str) -> str:
    words = text.split()
    title = " ".join(words[:TITLE_FALLBACK_WORDS])
    if len(words) > TITLE_FALLBACK_WORDS:
        title += "…"
    return title[:TITLE_MAX_CHARS]


def _clean_title(raw: str) -> str:
    lines = [line.strip() for line in (raw or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    title = lines[0].strip().strip(TITLE_STRIP_CHARS).strip()
    if title.lower().startswith("title:"):
        title = title[len("title:") :].strip()
    return title.rstrip(".").strip()[:TITLE_MAX_CHARS]


@dataclass(frozen=True)
class TitleRequest:
    """What titling needs, read from the database up front so the model call can run
    on a thread that never touches the database."""

    session_id: str
    owner_id: int
    model: str
    messages: list[dict[str, Any]]
    fallback: str


def title_request_for(session: Session, messages: list[Message]) -> TitleRequest | None:
    """What titling needs from the session's first messages (in order), without a query:
    the engine has them in memory when a turn completes."""
    if session.title:
        return None
    first = {role: next((m for m in messages if m.role == role), None) for role in ROLES}
    user_text, reply_text = (
        text_parts(m.content).strip() if m is not None else "" for m in first.values()
    )
    if not user_text and not reply_text:
        return None
    exchange = f"User: {user_text}\n\nAssistant: {reply_text}"[:TITLE_EXCHANGE_CHARS]
    return TitleRequest(
        session_id=str(session.pk),
        owner_id=session.owner_id,
        model=settings.TITLE_MODEL or session.model or settings.DEFAULT_MODEL,
        messages=[
            {"role": "system", "content": TITLE_PROMPT},
            {"role": "user", "content": exchange},
        ],
        fallback=title_fallback(user_text or reply_text),
    )


async def atitle_from_model(request: TitleRequest, provider: Any) -> str:
    """A few words from the model, or "" (any failure only costs the nicer title).

    Asked on the engine's loop, not streamed: nobody watches a title arrive, and a
    streamed one was an event per token beside the replies still streaming (40 of them
    per titled session; 15% of Daphne's event loop with 200 replies ending at once,
    bench/stream_path.py --mode embedded). `acomplete` reads the whole reply at once; a
    provider without it is streamed as before. Never a blocking call: a thread per
    titled session put hundreds of threads back beside the streams."""
    try:
        acomplete = getattr(provider, "acomplete", None)
        kwargs = {"model": request.model, "messages": request.messages}
        if acomplete is not None:
            final = await acomplete(**kwargs, max_tokens=TITLE_MAX_TOKENS)
        else:
            final = None
            async for chunk in provider.astream(**kwargs, max_tokens=TITLE_MAX_TOKENS):
                if chunk.turn is not None:
                    final = chunk.turn
    except Exception:
        logger.info("titling session %s failed", request.session_id, exc_info=True)
        return ""
    return _clean_title(final.text or "") if final is not None else ""
