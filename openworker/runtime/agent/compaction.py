"""Auto-compaction of long session histories: the policy, with no side effects.

When the outbound history approaches the model's context limit, its older part is replaced
by (a) a structured summary written by an LLM and (b) state extracted mechanically: the
recent turns stay verbatim and the user's own messages survive (trimmed). The persisted
transcript is never modified; only the copy sent to the model is.

Pure functions plus one dataclass. The engine owns *when* (its run loop calls
`should_compact`) and *with what* (its provider and model run `summarizer_messages`), and
persists the `CompactionState`; everything here is testable without a provider or Django.

The engine's footprint, in order::

    keep = keep_tokens(window)
    boundary = pick_boundary(history, keep_tokens=keep, after=prior_boundary)
    span = span_to_summarize(history, boundary=boundary, prior=prior)
    summary = provider.complete(model=..., messages=summarizer_messages(
        span, prior_summary=prior.summary if prior else ""), max_tokens=SUMMARY_MAX_TOKENS)
    state = compact(history, summary=summary.text, boundary=boundary, prior=prior)
    outbound = apply_to_outbound(history, state)  # every request from now on
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Compact at 80 % of the window: the rest holds the tool schemas, the reply's max_tokens
# and the error of a chars/4 estimate.
DEFAULT_THRESHOLD_PCT = 0.8
# Models with huge windows (1M) still compact by here: answer quality and latency degrade
# well before the nominal limit, and every uncached turn is billed for the whole prefix.
DEFAULT_CAP_TOKENS = 250_000
# Used when the curated matrix has no context window for the model (custom models): the
# common floor of current tool-calling models, so the guess errs towards compacting early.
DEFAULT_CONTEXT_WINDOW = 128_000
# Share of the trigger kept verbatim after a compaction (see `keep_tokens`): enough recent
# turns for the model to continue fluently, small enough that the next compaction is far off.
KEEP_RECENT_FRACTION = 0.25
# The summary's output cap: room for the eight sections of a long session, small enough that
# the compacted block never reclaims a meaningful share of the window it freed.
SUMMARY_MAX_TOKENS = 3_000

# The usual rule of thumb for English text and JSON with BPE tokenizers.
CHARS_PER_TOKEN = 4
# An image costs the provider a roughly fixed number of tokens, unrelated to the length of
# its base64: Anthropic bills ~1,600 for a full-size (1.15 MP) image, OpenAI at most ~1,100
# at high detail, Gemini 258 per tile. Take the largest so the estimate errs towards early.
IMAGE_TOKENS_ESTIMATE = 1_600
# A PDF costs ~1,500-3,000 tokens per page (text plus page image, Anthropic's figures); the
# page count is unknown without parsing, so assume a short document of about four pages.
# Long PDFs are underestimated: the provider-reported usage, the primary trigger signal,
# corrects that from the next response on.
FILE_TOKENS_ESTIMATE = 8_000

# Tool results are the bulk of an agent's history and the least load-bearing once acted
# upon: the first casualty when rendering the span for the summarizer.
SPAN_TOOL_RESULT_CLIP = 400
# Tool-call arguments often carry whole files being written; the summary notes *that* a file
# was written, never its contents, so the same clip applies.
SPAN_TOOL_ARGS_CLIP = 400
# ~100k tokens at chars/4: the summarizer's input fits a 128k-window model with its prompt
# and the summary's SUMMARY_MAX_TOKENS still to spare.
SPAN_BUDGET_CHARS = 400_000
# Preserved user messages are trimmed of pasted bulk (logs, documents): the ask is in the
# first few sentences, the bulk is in the summary or re-readable.
USER_MESSAGE_CLIP = 600
# The preserved list is capped to the newest N across repeated compactions; otherwise it
# grows forever and the block slowly reclaims the window it freed. 40 x 600 chars is at most
# ~6k tokens. Dropped messages stay counted; their intent lives in the summary.
USER_MESSAGES_MAX = 40

SUMMARY_SYSTEM_PROMPT = """\
You are condensing the earlier part of a working session between a user and an AI coworker \
(an agent that uses tools). The coworker will continue the session with nothing but your \
summary and the most recent turns, so the summary replaces its memory of everything below: \
keep whatever the work still depends on, and leave out what it does not.

Write these sections, in this order, each under its own heading:

1. Primary request and intent: what the user wants, in their terms, and how that changed \
over the session. Include every standing constraint or preference stated at any point (for \
example "never send anything without my approval"): a constraint stays in force long after \
the turn that stated it.
2. Key concepts and decisions: the facts, conventions and choices the work rests on, each \
with the reason it was made. A decision recorded without its reason gets reopened.
3. Files and resources touched: every file, URL, document, record or service that was read, \
created or changed, what was done to it and why it matters. Note that it was read or edited; \
do not reproduce its contents.
4. Errors and fixes: what went wrong, how it was resolved, and what the user said about it, \
so the same mistake is not made twice.
5. User messages: every message the user sent, in order, each reduced to one line with its \
request or feedback.
6. Pending tasks: work the user asked for that is not finished.
7. Current work: exactly what was in progress when this summary was requested, naming the \
files, functions or items involved.
8. Next step: the one action that follows from the current work and the user's latest \
request, if there is one, quoting the user's words where they pin it down. Do not invent \
new work.

Rules:
- File contents are not facts to carry forward. Record that a file was read or changed, \
never its text as the current state: the coworker reads it again when it needs it, and a \
stale copy in memory is worse than none.
- Be concrete: exact paths, names, identifiers, commands, numbers and error messages, never \
"the file" or "the earlier error".
- If the input begins with a previous summary, merge what is still relevant in it into your \
sections rather than summarizing it separately.
- Output only the eight sections: no preamble, no closing remarks."""

CONTINUATION_CONTRACT = (
    "Carry on from exactly where the session left off: resume the current work and take "
    "the next step described above. Do not ask again what has already been answered, do not "
    "recap, and do not mention that earlier history was summarized. If you need the contents "
    "of a file or resource noted above, read it again."
)

PRIOR_SUMMARY_LABEL = (
    "[previous compaction summary — fold its still-relevant content into the new summary]"
)
SINCE_LABEL = "[conversation since]"
_EMPTY_SPAN = "[no messages in this span]"

_BLOCK_SUMMARY_HEADING = "[Summary of the earlier part of this session]"
_BLOCK_USERS_HEADING = "[The user's messages from that earlier part, oldest first]"

_COMPACT_JSON = (",", ":")
# Keys of a canonical message that never reach a provider (display and metering only), so
# they must not count towards the context the model sees. `extras` do count: the owning
# provider sends them back.
_NEVER_SENT_KEYS = frozenset({"reasoning", "usage"})
_ATTACHMENT_TOKENS = {"image_url": IMAGE_TOKENS_ESTIMATE, "file": FILE_TOKENS_ESTIMATE}


# --------------------------------------------------------------------------- trigger


def trigger_tokens(
    context_window: int | None,
    *,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    cap_tokens: int = DEFAULT_CAP_TOKENS,
) -> int:
    """Context size at which compaction is due: min(threshold x window, cap).

    An unknown window (None or 0) means DEFAULT_CONTEXT_WINDOW.
    """
    window = context_window or DEFAULT_CONTEXT_WINDOW
    return min(int(threshold_pct * window), int(cap_tokens))


def should_compact(
    signal_tokens: int | None,
    context_window: int | None,
    *,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    cap_tokens: int = DEFAULT_CAP_TOKENS,
    enabled: bool = True,
) -> bool:
    """True when the context signal has reached the trigger.

    The signal is the last response's reported `context_tokens` when the provider reports
    usage, else `estimate_tokens` of the outbound messages; the engine picks. No signal
    (None) never triggers: compaction costs a model call and is not done on a guess of zero.
    """
    if not enabled or not signal_tokens:
        return False
    return signal_tokens >= trigger_tokens(
        context_window, threshold_pct=threshold_pct, cap_tokens=cap_tokens
    )


def keep_tokens(
    context_window: int | None,
    *,
    keep_fraction: float = KEEP_RECENT_FRACTION,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    cap_tokens: int = DEFAULT_CAP_TOKENS,
) -> int:
    """The verbatim tail's budget: keep_fraction x the trigger, not x the window.

    The seed calls it the keep-recent fraction; of the *trigger* is the reading that works
    with the cap. For a 1M-window model a quarter of the window (250k) equals the capped
    trigger, so the kept tail alone would be due for compaction again on the next turn. A
    fraction of the trigger is the same share of the budget actually in use for every model:
    25.6k tokens for the 128k default, 62.5k for any capped model.
    """
    trigger = trigger_tokens(context_window, threshold_pct=threshold_pct, cap_tokens=cap_tokens)
    return int(keep_fraction * trigger)


# --------------------------------------------------------------------------- estimate


def estimate_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """chars/4 over the messages serialized as compact JSON: the fallback signal for
    providers that report no usage, and the sizing of the verbatim tail.

    Literally `len(json.dumps(messages, separators=(",", ":"))) // 4`, with three
    deliberate departures so the estimate tracks what a provider bills:
    - `reasoning` and `usage` are left out: they never reach a provider;
    - an attachment part (`image_url`, `file`) counts a fixed IMAGE_TOKENS_ESTIMATE or
      FILE_TOKENS_ESTIMATE instead of the length of its base64 data URL (a 1 MB photo is
      ~1.6k tokens to the model, not 330k);
    - non-ASCII text stays escaped (`json.dumps` default): "\\u4e2d" is six characters, so a
      CJK character counts 1.5 tokens, close to real tokenizers, where the raw character
      would count a quarter.

    Additive by construction: the sum of per-message sizes gives the same number, which is
    what lets `pick_boundary` size every suffix in one pass (see `suffix_tokens`).
    """
    return (1 + sum(_message_chars(m) for m in messages)) // CHARS_PER_TOKEN


def suffix_tokens(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """`out[i] == estimate_tokens(messages[i:])` for every i in 0..len(messages), in one pass.

    Serialized, a list is "[" + the items joined by "," + "]": each message costs its own
    length plus one separator, and the list one more character, so suffix sizes are a
    reverse cumulative sum of per-message sizes.
    """
    out = [0] * (len(messages) + 1)
    chars = 1
    for i in range(len(messages) - 1, -1, -1):
        chars += _message_chars(messages[i])
        out[i] = chars // CHARS_PER_TOKEN
    return out


def _message_chars(message: Mapping[str, Any]) -> int:
    """Serialized length of one message plus its list separator, as `estimate_tokens`
    counts it (attachments at their fixed estimate)."""
    if isinstance(message, dict) and _NEVER_SENT_KEYS.isdisjoint(message):
        sent = message  # the common case: serialize as is, no copy
    else:
        sent = {k: v for k, v in message.items() if k not in _NEVER_SENT_KEYS}
    extra = 0
    content = sent.get("content")
    if isinstance(content, list) and any(_attachment_kind(p) for p in content):
        parts = []
        for part in content:
            kind = _attachment_kind(part)
            if kind:
                extra += _ATTACHMENT_TOKENS[kind] * CHARS_PER_TOKEN
                part = _without_data_urls(part)
            parts.append(part)
        sent = {**sent, "content": parts}
    return len(json.dumps(sent, separators=_COMPACT_JSON, default=str)) + 1 + extra


def _attachment_kind(part: Any) -> str | None:
    if isinstance(part, Mapping) and part.get("type") in _ATTACHMENT_TOKENS:
        return str(part["type"])
    return None


def _without_data_urls(value: Any) -> Any:
    """A copy with every data URL cut to its header ("data:image/png;base64,")."""
    if isinstance(value, str):
        if value.startswith("data:"):
            return value.split(",", 1)[0] + ","
        return value
    if isinstance(value, Mapping):
        return {k: _without_data_urls(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_data_urls(v) for v in value]
    return value


# --------------------------------------------------------------------------- boundary


def pick_boundary(
    messages: Sequence[Mapping[str, Any]],
    *,
    keep_tokens: int,
    after: int = 0,
) -> int | None:
    """The index of `messages` where the verbatim tail begins, or None when there is
    nothing meaningful to summarize.

    The seed's rule, in order:
    - None when what is left to compact (everything after the system prompt, or after
      `after`) already fits `keep_tokens`: summarizing it would only lose detail.
    - The earliest user message whose suffix fits `keep_tokens` (earliest first: keep as
      much verbatim as fits).
    - Only when the newest user turn alone exceeds the budget (a giant tool loop): cut
      inside it at the earliest assistant step whose suffix fits; failing that, at its
      latest assistant step (the most recent step always stays verbatim); failing that,
      at the newest user message.
    - A cut never separates an assistant's tool calls from their results, so the tail never
      starts with (or contains) a tool result whose call was summarized away: a user
      message sent while a tool ran is no turn start, and the newest turn is the newest
      user message that is one.
    - A boundary must leave something other than system messages before it, and must lie
      strictly after `after` (the prior compaction's boundary): a repeated compaction only
      ever moves forward.

    Linear in the history: suffix sizes come from one reverse cumulative sum.
    """
    n = len(messages)
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not users:
        return None
    suffix = suffix_tokens(messages)
    splits_a_call = _cuts_inside_tool_calls(messages)
    first_content = next((i for i, m in enumerate(messages) if m.get("role") != "system"), n)
    lowest = max(first_content, after)
    if suffix[min(lowest, n)] <= keep_tokens:
        return None

    def cuttable(i: int) -> bool:
        return i > lowest and not splits_a_call[i]

    def fit(candidates: Iterable[int]) -> int | None:
        for i in candidates:
            if suffix[i] <= keep_tokens:
                return i
        return None

    boundary = fit(i for i in users if cuttable(i))
    if boundary is not None:
        return boundary
    turn_starts = [i for i in users if not splits_a_call[i]]
    newest_turn = turn_starts[-1] if turn_starts else users[-1]
    if suffix[newest_turn] <= keep_tokens:
        return None  # the newest turn fits, yet no cut is allowed before it
    inside = [
        i
        for i in range(newest_turn + 1, n)
        if messages[i].get("role") == "assistant" and cuttable(i)
    ]
    boundary = fit(inside)
    if boundary is None and inside:
        boundary = inside[-1]
    if boundary is None and cuttable(newest_turn):
        boundary = newest_turn
    return boundary


def _cuts_inside_tool_calls(messages: Sequence[Mapping[str, Any]]) -> list[bool]:
    """`out[i]` is True when a boundary at i would put a tool result in the tail whose
    call stays in the summarized span (a provider rejects such an orphan)."""
    n = len(messages)
    issued_at: dict[str, int] = {}
    opened = [0] * (n + 1)
    for j, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant":
            for call in message.get("tool_calls") or ():
                call_id = _field(call, "id")
                if call_id is not None:
                    issued_at[str(call_id)] = j
        elif role == "tool":
            a = issued_at.get(str(message.get("tool_call_id")))
            if a is not None and a < j:
                opened[a + 1] += 1  # cuts in (a, j] separate the call from this result
                opened[j + 1] -= 1
    out = [False] * (n + 1)
    depth = 0
    for i in range(n + 1):
        depth += opened[i]
        out[i] = depth > 0
    return out


def span_to_summarize(
    messages: Sequence[Mapping[str, Any]],
    *,
    boundary: int,
    prior: CompactionState | None = None,
) -> list[Mapping[str, Any]]:
    """The messages a new summary must cover: from the prior boundary (whose summary is
    folded in by `summarizer_messages`) or the start, up to `boundary`; system messages
    excluded, since the system prompt is always sent verbatim."""
    start = _span_start(boundary, prior)
    return [m for m in messages[start:boundary] if m.get("role") != "system"]


def _span_start(boundary: int, prior: CompactionState | None) -> int:
    if prior is not None and 0 < prior.boundary_index <= boundary:
        return prior.boundary_index
    return 0


# --------------------------------------------------------------------------- summarizer


def render_span(span: Iterable[Mapping[str, Any]], *, budget_chars: int = SPAN_BUDGET_CHARS) -> str:
    """The summarized span as compact text for the summarizer, one entry per line:
    "user: ...", "assistant: ...", "assistant → name(args)", "tool result: ...".

    Tool results and call arguments are clipped hard (SPAN_TOOL_RESULT_CLIP) first. If the
    whole render still exceeds `budget_chars`, the oldest entries are dropped and counted
    in a leading marker: the newest context is the most load-bearing. Reasoning, sidecars
    and system messages are not rendered.
    """
    lines: list[str] = []
    for message in span:
        role = message.get("role")
        if role == "user":
            lines.append("user: " + _content_text(message.get("content")))
        elif role == "assistant":
            text = _content_text(message.get("content"))
            if text.strip():
                lines.append("assistant: " + text)
            for call in message.get("tool_calls") or ():
                name = _field(call, "name") or "?"
                args = _clip(_as_text(_field(call, "arguments")), SPAN_TOOL_ARGS_CLIP)
                lines.append(f"assistant → {name}({args})")
        elif role == "tool":
            text = _content_text(message.get("content"))
            lines.append("tool result: " + _clip(text, SPAN_TOOL_RESULT_CLIP))
    return _newest_lines_within(lines, budget_chars)


def _newest_lines_within(lines: list[str], budget: int) -> str:
    total = sum(len(line) + 1 for line in lines) - 1
    if total <= budget:
        return "\n".join(lines)
    for dropped in range(1, len(lines)):
        total -= len(lines[dropped - 1]) + 1
        marker = f"[{dropped} earlier entries dropped to fit the length budget]"
        if total + len(marker) + 1 <= budget:
            return "\n".join([marker, *lines[dropped:]])
    return _clip_within(lines[-1], budget)


def summarizer_messages(
    span: Iterable[Mapping[str, Any]], *, prior_summary: str = ""
) -> list[dict[str, Any]]:
    """Canonical messages for the summary call: the system prompt and one user message
    with the rendered span. Call with `max_tokens=SUMMARY_MAX_TOKENS`.

    On a repeated compaction the previous summary comes first, labelled so the model
    folds its still-relevant content into the new one, then the conversation since.
    """
    body = render_span(span) or _EMPTY_SPAN
    if prior_summary.strip():
        body = f"{PRIOR_SUMMARY_LABEL}\n{prior_summary.strip()}\n\n{SINCE_LABEL}\n{body}"
    return [
        {"role": "system", "content": SUMMARY_SYSTEM_PROMPT},
        {"role": "user", "content": body},
    ]


# --------------------------------------------------------------------------- state


@dataclass
class CompactionState:
    """What a compaction produced, persisted per session (JSON via to_dict/from_dict).

    `boundary_index` is the canonical index where the verbatim tail begins. No timestamps
    or other per-turn data: the compacted block rendered from this state must be
    byte-identical on every turn, or the provider's prompt cache misses from there on.
    """

    boundary_index: int
    summary: str
    user_messages: list[str] = field(default_factory=list)
    user_messages_dropped: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "boundary_index": self.boundary_index,
            "summary": self.summary,
            "user_messages": list(self.user_messages),
            "user_messages_dropped": self.user_messages_dropped,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> CompactionState | None:
        """None for no stored state; ValueError for a malformed one (never a silent guess:
        a wrong boundary would drop or duplicate history)."""
        if not data:
            return None
        boundary = data.get("boundary_index")
        summary = data.get("summary")
        users = data.get("user_messages", [])
        dropped = data.get("user_messages_dropped", 0)
        if (
            not isinstance(boundary, int)
            or isinstance(boundary, bool)
            or not isinstance(summary, str)
            or not isinstance(users, list)
            or not all(isinstance(u, str) for u in users)
            or not isinstance(dropped, int)
            or dropped < 0
        ):
            raise ValueError(f"malformed compaction state: {sorted(data)}")
        return cls(
            boundary_index=boundary,
            summary=summary,
            user_messages=list(users),
            user_messages_dropped=dropped,
        )


def compact(
    messages: Sequence[Mapping[str, Any]],
    *,
    summary: str,
    boundary: int,
    prior: CompactionState | None = None,
) -> CompactionState:
    """The state after summarizing `messages[:boundary]` into `summary`.

    The user messages of the newly summarized span (from the prior boundary on) are
    clipped to USER_MESSAGE_CLIP and appended to the prior preserved list; only the newest
    USER_MESSAGES_MAX are kept and the rest are counted, cumulatively, in
    `user_messages_dropped`.
    """
    if not 0 < boundary < len(messages):
        raise ValueError(f"boundary {boundary} outside 1..{len(messages) - 1}")
    if prior is not None and boundary <= prior.boundary_index:
        raise ValueError(f"boundary {boundary} does not move past {prior.boundary_index}")
    start = _span_start(boundary, prior)
    preserved = list(prior.user_messages) if prior else []
    dropped = prior.user_messages_dropped if prior else 0
    for message in messages[start:boundary]:
        if message.get("role") == "user":
            text = _content_text(message.get("content")).strip()
            if text:
                preserved.append(_clip(text, USER_MESSAGE_CLIP))
    excess = max(0, len(preserved) - USER_MESSAGES_MAX)
    return CompactionState(
        boundary_index=boundary,
        summary=summary,
        user_messages=preserved[excess:],
        user_messages_dropped=dropped + excess,
    )


def compacted_block(state: CompactionState) -> str:
    """The text that stands in for the summarized span: the summary, the preserved user
    messages (the count of omitted older ones first, in chronological order) and the
    continuation contract. Deterministic: the same state gives the same bytes."""
    parts = [f"{_BLOCK_SUMMARY_HEADING}\n{state.summary.strip()}"]
    if state.user_messages or state.user_messages_dropped:
        section = [_BLOCK_USERS_HEADING]
        if state.user_messages_dropped:
            section.append(
                f"({state.user_messages_dropped} earlier user messages omitted — "
                "their intent is covered by the summary above)"
            )
        section += ["- " + text.replace("\n", "\n  ") for text in state.user_messages]
        parts.append("\n".join(section))
    parts.append(CONTINUATION_CONTRACT)
    return "\n\n".join(parts)


def apply_to_outbound(
    messages: Sequence[dict[str, Any]], state: CompactionState | None
) -> list[dict[str, Any]]:
    """The outbound view: [system?] + the compacted block as a user message + the
    verbatim tail `messages[boundary:]`.

    Returns a new list and never mutates `messages`; message dicts are shared, not copied,
    so later outbound steps must copy before changing one. A no-op copy when `state` is
    None or stale (boundary <= 0 or >= len). Provider-private sidecars in the summarized
    span vanish with it: replay chains legally restart after a compaction point.

    When the tail starts with a user message the view has two user messages in a row.
    They stay separate here (the block is then byte-stable on its own, and the canonical
    tail untouched); the wire layers of APIs that need strict alternation (Anthropic,
    Gemini) merge consecutive same-role messages.
    """
    out = list(messages)
    if state is None:
        return out
    boundary = state.boundary_index
    if boundary <= 0 or boundary >= len(out):
        return out
    head = [out[0]] if out[0].get("role") == "system" else []
    block = {"role": "user", "content": compacted_block(state)}
    return [*head, block, *out[boundary:]]


# --------------------------------------------------------------------------- text helpers


def _field(obj: Any, name: str) -> Any:
    """A tool call's field, whether a canonical dict or a `ToolCall`."""
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=_COMPACT_JSON, default=str)


def _content_text(content: Any) -> str:
    """Message content as plain text; attachments become short markers."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        return _as_text(content)
    pieces = []
    for part in content:
        if not isinstance(part, Mapping):
            pieces.append(_as_text(part))
        elif part.get("type") == "text":
            pieces.append(str(part.get("text") or ""))
        elif part.get("type") == "image_url":
            pieces.append("[image]")
        elif part.get("type") == "file":
            name = _field(part.get("file") or {}, "filename") or part.get("filename")
            pieces.append(f"[file: {name}]" if name else "[file]")
        else:
            pieces.append(f"[{part.get('type', 'part')}]")
    return "\n".join(pieces)


def _clip(text: str, limit: int) -> str:
    """The first `limit` characters, with a marker saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} more chars]"


def _clip_within(text: str, budget: int) -> str:
    """Like `_clip`, but the result, marker included, is at most `budget` long."""
    if len(text) <= budget:
        return text
    marker = "… [clipped]"
    if budget <= len(marker):
        return text[:budget]
    return text[: budget - len(marker)] + marker
