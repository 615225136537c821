"""What the chat page shows for stored data: messages, checkpoints and turn footers as
plain dicts for the templates, with text rendered by `sessions.markdown`.

The same functions serve the first page load, "load earlier" and the live page's fetch
of a just-committed message, so a message looks the same however it arrived.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.safestring import mark_safe

from providers.edge.model_policy import custom_mode
from providers.types import ModelCapabilities
from sessions import selectors
from sessions.content import text_parts as _text_parts
from sessions.markdown import render_markdown
from sessions.mcp.selectors import mcp_server_labels
from sessions.models import CompactionCheckpoint, Message, Session, Turn

# Tool output can be a whole file or web page; the card shows the start of it (the JSON
# export has all of it).
TOOL_TEXT_DISPLAY_CHARS = 20_000
# Turn states after which the user can act on a turn (the page shows why and a button).
RETRYABLE = (Turn.Status.FAILED, Turn.Status.INTERRUPTED)
# Money is shown to the cent, or to four places for the sub-cent costs of small calls.
COST_PLACES = Decimal("0.0001")


def format_cost(cost: Any) -> str | None:
    if cost is None:
        return None
    value = Decimal(str(cost))
    if value >= 1:
        return f"${value.quantize(Decimal('0.01'))}"
    return f"${value.quantize(COST_PLACES)}"


def _attachments(session: Session, content: Any) -> list[dict[str, Any]]:
    out = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict) or part.get("type") not in ("image_url", "file"):
            continue
        # Stored content is data: a malformed part shows as a plain file, never raises.
        meta = part.get("attachment")
        meta = meta if isinstance(meta, dict) else {}
        attachment_id = _uuid_or_none(meta.get("id"))
        url = None
        if attachment_id:
            url = reverse("attachment_download", args=[session.pk, attachment_id])
        out.append(
            {
                "name": str(meta.get("name") or "")
                or ("image" if part["type"] == "image_url" else "file"),
                "mime": str(meta.get("mime", "")),
                "is_image": part["type"] == "image_url",
                "url": url,
            }
        )
    return out


def _uuid_or_none(value: Any) -> str | None:
    try:
        return str(uuid.UUID(str(value))) if value else None
    except ValueError:
        return None


# What a user reads when a turn ends badly, by failure class. Never the provider's raw
# text: that carries exception and errno strings ("[Errno 111] Connection refused").
ERROR_WORDS = {
    "auth": "The provider rejected the API key. Check the key in Settings.",
    "no_access": "Your API key has no access to this model. Pick another model, or ask an "
    "admin for access.",
    "no_quota": "The provider account behind this key is out of credit or quota.",
    "rate_limited": "The provider is limiting how often you can send.",
    "overloaded": "The provider is overloaded right now. Try again shortly.",
    "upstream": "The provider had an error on its side. Try again in a moment.",
    "unreachable": "The provider could not be reached. Check its address in Settings, or try "
    "again later.",
    "timed_out": "The provider took too long to answer.",
    "stream": "The reply broke off before it finished.",
    "context_too_long": "The conversation is too long for this model. Start a new session, "
    "or switch to a model with a larger context window.",
    "bad_request": "The provider refused this request.",
    "blocked": "This provider address is not allowed by the server's outbound policy.",
    "interrupted": "The reply was interrupted (the server restarted or lost its worker).",
    "step_limit": "The agent reached its step limit for one reply.",
    "time_limit": "This reply ran past the time one reply may take and was stopped; what it "
    "wrote so far is kept.",
    "model_refused": "Your team may not use this model.",
    "cancelled": "Stopped.",
    "internal": "Something went wrong on our side while writing this reply.",
}
GENERIC_ERROR = "This reply did not finish."
# Kinds whose `error` is our own sentence (never a provider's text): shown as written,
# since it says why (the model policy names the model and what to do).
OWN_WORDS = {"model_refused", "time_limit"}
# providers.errors.RateLimitError's words carry the provider's Retry-After ("in 12 s").
_RETRY_IN = re.compile(r"\bin (\d+(?:\.\d+)?) s\b")
# The transport's own failures (httpx/OS words) as opposed to an answer with a 5xx status,
# which also arrives as "unavailable" but carries the provider's message instead.
_TRANSPORT_WORDS = re.compile(
    r"errno|connect|connection|refused|resolve|resolved to no address|no route|unreachable"
    r"|network|reset by peer|ssl|certificate|eof",
    re.IGNORECASE,
)


def error_class(kind: str, error: str) -> str:
    """The failure class a user is told about: the turn's `error_kind`, with the
    transport's single "unavailable" split into upstream error, unreachable, timed out."""
    text = error or ""
    if kind == "unavailable":
        if "timed out" in text or "took too long" in text:
            return "timed_out"
        return "unreachable" if _TRANSPORT_WORDS.search(text) else "upstream"
    if kind == "stream" and "no data from the upstream" in text:
        return "timed_out"
    return kind if kind in ERROR_WORDS else ("internal" if kind else "")


def error_view(kind: str, error: str, status: str = "") -> dict[str, Any]:
    """{class, words, retry_in}: plain words for a failed or interrupted turn."""
    cls = error_class(kind or ("interrupted" if status == "interrupted" else ""), error)
    if status == "cancelled":
        cls = "cancelled"
    words = ERROR_WORDS.get(cls, GENERIC_ERROR) if cls else GENERIC_ERROR
    if cls in OWN_WORDS and error:
        words = error
    retry_in = None
    if cls == "rate_limited":
        match = _RETRY_IN.search(error or "")
        if match:
            retry_in = max(1, round(float(match.group(1))))
    return {"class": cls, "words": words, "retry_in": retry_in}


def message_view(session: Session, message: Message) -> dict[str, Any]:
    extras = message.extras if isinstance(message.extras, dict) else {}
    view: dict[str, Any] = {
        "seq": message.seq,
        "role": message.role,
        "turn": str(message.turn_id) if message.turn_id else "",
        "model": message.model,
        "cancelled": message.finish_reason == "cancelled",
        # The tree (docs/PROTOCOL.md "Branches"): what "< i / n >" needs, for the page.
        "parent": message.parent_seq,
        "siblings": getattr(message, "siblings", None) or [message.seq],
        "continues": message.parent_seq if message.continuation else None,
        # "prefill" rows are shown inside the reply they continue; "instruction" rows
        # are a reply of their own (docs/PROTOCOL.md "Continue").
        "continuation": message.continuation,
        "finish_reason": message.finish_reason,
    }
    siblings = view["siblings"]
    view["sibling_index"] = siblings.index(message.seq) + 1 if message.seq in siblings else 1
    if message.role == "tool":
        text = _text_parts(message.content)
        view.update(
            tool_name=extras.get("tool") or "tool",
            is_error=bool(extras.get("is_error")),
            tool_call_id=message.tool_call_id,
            tool_text=text[:TOOL_TEXT_DISPLAY_CHARS],
            tool_truncated=len(text) > TOOL_TEXT_DISPLAY_CHARS,
        )
        return view
    text = _text_parts(message.content)
    # The source travels with the server's HTML: the page renders it with the same
    # renderer as streamed text (static/js/renderer.js) and copies it as Markdown.
    view["markdown"] = text
    view["html"] = mark_safe(render_markdown(text))  # noqa: S308 - sanitised by nh3
    view["attachments"] = _attachments(session, message.content)
    if message.reasoning:
        view["reasoning"] = message.reasoning
        view["reasoning_html"] = mark_safe(render_markdown(message.reasoning))  # noqa: S308
    calls = [call for call in (message.tool_calls or []) if isinstance(call, dict)]
    servers = mcp_server_labels([str(call.get("name", "")) for call in calls])
    view["tool_calls"] = [
        {
            "id": call.get("id", ""),
            "name": call.get("name", ""),
            "server": servers.get(str(call.get("name", "")), ""),
            "arguments": json.dumps(call.get("arguments"), indent=2, ensure_ascii=False),
        }
        for call in calls
    ]
    return view


def checkpoint_view(checkpoint: CompactionCheckpoint) -> dict[str, Any]:
    return {
        "boundary_seq": checkpoint.boundary_seq,
        "summary": checkpoint.summary,
        "summary_html": mark_safe(render_markdown(checkpoint.summary)),  # noqa: S308
        "tokens_before": checkpoint.tokens_before,
        "tokens_after": checkpoint.tokens_after,
    }


def turn_view(turn: Turn) -> dict[str, Any]:
    return {
        "id": str(turn.pk),
        "status": turn.status,
        "error": turn.error,
        "error_kind": turn.error_kind,
        "failure": error_view(turn.error_kind, turn.error, turn.status),
        "cost": format_cost(turn.cost),
        "retryable": turn.status in RETRYABLE,
        "active": turn.status in Turn.ACTIVE,
        # A failed or interrupted step's streamed text lives on the turn, not in the
        # transcript (retry streams it again): shown apart, as plain text.
        "partial": turn.partial_text if turn.status in RETRYABLE else "",
    }


@dataclass
class Window:
    items: list[dict[str, Any]]
    first_seq: int
    last_seq: int
    has_more: bool


def build_items(
    session: Session,
    messages: list[Message],
    turns: dict[str, Turn],
    checkpoints: list[CompactionCheckpoint],
    *,
    closed_last_turn: bool,
) -> list[dict[str, Any]]:
    """Page items in order: checkpoints before their boundary message, messages, and a
    footer after each turn's last message in the window (the last turn's only when
    `closed_last_turn`: a live turn gets its footer from the socket)."""
    at: dict[int, list[CompactionCheckpoint]] = {}
    for checkpoint in checkpoints:
        at.setdefault(checkpoint.boundary_seq, []).append(checkpoint)
    items: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        for checkpoint in at.get(message.seq, ()):
            items.append({"kind": "checkpoint", "checkpoint": checkpoint_view(checkpoint)})
        items.append({"kind": "message", "message": message_view(session, message)})
        turn_id = str(message.turn_id) if message.turn_id else ""
        following = messages[index + 1] if index + 1 < len(messages) else None
        ends_turn = following is None or str(following.turn_id or "") != turn_id
        turn = turns.get(turn_id)
        closes = following is not None or closed_last_turn
        if turn is not None and ends_turn and closes and turn.status not in Turn.ACTIVE:
            items.append({"kind": "turn", "turn": turn_view(turn)})
    return items


def render_items(items: list[dict[str, Any]], *, request: Any = None) -> str:
    return render_to_string("sessions/_items.html", {"items": items}, request=request)


def render_message_html(session: Session, message: Message) -> str:
    return render_to_string(
        "sessions/_items.html",
        {"items": [{"kind": "message", "message": message_view(session, message)}]},
    )


def caps_payload(caps: ModelCapabilities) -> dict[str, Any]:
    return {
        "vision": caps.vision,
        "pdf": caps.pdf,
        "tools": caps.tools,
        "reasoning": caps.reasoning,
        "context_window": caps.context_window,
        "curated": caps.curated,
    }


def caps_label(caps: ModelCapabilities) -> str:
    """ "vision · PDF · tools · reasoning · 200k context" — what the model is known to do."""
    bits = [
        name
        for name, flag in (
            ("vision", caps.vision),
            ("PDF", caps.pdf),
            ("tools", caps.tools),
            ("reasoning", caps.reasoning),
        )
        if flag
    ]
    if caps.context_window:
        window = caps.context_window
        bits.append(
            f"{window // 1_000_000}M context"
            if window >= 1_000_000 and window % 1_000_000 == 0
            else f"{round(window / 1000)}k context"
        )
    return " · ".join(bits) or "text only"


def model_picker(user: Any, current: str) -> dict[str, Any]:
    """The model picker: curated models this user may pick, labelled with capabilities,
    and whether `current` is one of them (else it is a custom model: capabilities unknown)."""
    options = [
        {
            "id": entry.id,
            "label": entry.label or entry.id,
            "caps": caps_label(entry.caps),
            "caps_data": caps_payload(entry.caps),
        }
        for entry in selectors.model_choices(user=user)
    ]
    curated_ids = {option["id"] for option in options}
    mode = custom_mode(user=user)
    return {
        "options": options,
        "current": current,
        "custom": current not in curated_ids,
        # What the model policy says of ids outside the list (providers.edge.model_policy).
        "custom_allowed": mode != "off",
        "custom_own_key": mode == "own_key",
    }


def chosen_model(post: Any) -> str:
    """The model a picker form chose: the custom text when "custom" is selected."""
    choice = post.get("model", "").strip()
    if choice == "__custom__" or not choice:
        choice = post.get("custom_model", "").strip()
    return choice
