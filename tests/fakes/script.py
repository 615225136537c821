"""The script model shared by every fake provider: what the next reply will be.

A `Reply` is a list of provider-neutral steps (text, reasoning, tool calls, usage,
faults, pacing). Each fake translates the steps into its own wire protocol, so one
script drives the OpenAI and the Anthropic fake alike. A `Script` is a thread-safe queue
of replies consumed one per model request; when it is empty the default reply is used
(by default an echo of the last user message), so a fake never has to be scripted just
to answer.

Scripts also travel as JSON (for the subprocess mode): a step is
`{"type": "text", "text": "Hi"}`, a reply is `{"steps": [...], "delay": 0.01}`, a
script file is `{"replies": [...], "default": {...}}` or a bare list of replies.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Neutral stop reasons a reply may force; each fake maps them to its own vocabulary and
# passes any other string through verbatim (to script a vendor-specific reason).
STOP_END = "end"
STOP_TOOL_USE = "tool_use"
STOP_MAX_TOKENS = "max_tokens"

# Neutral error kinds for `HttpError` and `ErrorEvent`; each fake renders them in its
# API's own body shape and status (quota is a 429 on OpenAI but a 400 on Anthropic).
ERROR_KINDS = (
    "rate_limit",
    "quota",
    "overloaded",
    "context_length",
    "model_not_found",
    "auth",
    "permission",
    "invalid_request",
    "server",
)


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Reasoning:
    """Thinking text: `reasoning_content` on OpenAI-compatible APIs, a signed
    `thinking` block on Anthropic."""

    text: str


@dataclass(frozen=True)
class RedactedThinking:
    """An Anthropic `redacted_thinking` block (opaque `data`); other fakes skip it."""

    data: str = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"


@dataclass(frozen=True)
class ToolCall:
    """A function call whose JSON arguments are streamed in several fragments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    # Raw argument text sent instead of `json.dumps(arguments)`: scripts invalid JSON.
    raw_arguments: str | None = None
    # Anthropic programmatic tool calling: the call is made from inside code execution,
    # so its block carries this `caller` and its whole `input`, with no input_json_delta.
    caller: dict[str, Any] | None = None


@dataclass(frozen=True)
class WireBlock:
    """A content block in one API's own shape, for shapes the neutral steps don't cover
    (server tool blocks, cited text): streamed as its start `block` then `deltas`, and
    whole as `block` with the deltas applied. Only the fake of `api` renders it."""

    api: str
    block: dict[str, Any]
    deltas: tuple[dict[str, Any], ...] = ()

    def __init__(self, api: str, block: dict[str, Any], deltas: Iterable[Any] = ()) -> None:
        object.__setattr__(self, "api", api)
        object.__setattr__(self, "block", dict(block))
        object.__setattr__(self, "deltas", tuple(dict(d) for d in deltas))


@dataclass(frozen=True)
class WireEvent:
    """One stream event in one API's own shape, sent verbatim (an event type a client
    may not know yet); skipped by the other fakes and by whole replies."""

    api: str
    name: str | None
    data: dict[str, Any]


@dataclass(frozen=True)
class Usage:
    """Token counts to report. `None` input/output fall back to the fake's `usage_for`."""

    input: int | None = None
    output: int | None = None
    cache_read: int = 0
    cache_write: int = 0
    # Reasoning tokens (a subset of `output`), reported where the wire has a field for it.
    reasoning: int | None = None


@dataclass(frozen=True)
class HttpError:
    """Answer with an HTTP error instead of a 200 (must be a reply's first step).

    `body`: a dict is sent as JSON verbatim, a str as raw text (a proxy's HTML page),
    None lets the fake build its API's own error body for `kind` (or for `status`).
    """

    status: int | None  # None: the provider's own status for `kind`
    body: dict[str, Any] | str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # Neutral error kind the fake maps to its body (see ERROR_KINDS). None: from status.
    kind: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class Reset:
    """Close the socket abruptly (TCP RST), mid-stream or before any response."""


@dataclass(frozen=True)
class Truncate:
    """End the body cleanly but without the protocol's terminal event."""


@dataclass(frozen=True)
class ErrorEvent:
    """The API's in-stream error event after an HTTP 200, then end of stream.

    In a non-streaming reply it becomes the HTTP error of the same kind.
    """

    kind: str = "overloaded"
    message: str | None = None


@dataclass(frozen=True)
class Drip:
    """From here on, sleep `seconds` before each event: a slow drip."""

    seconds: float


@dataclass(frozen=True)
class Pause:
    """Sleep once, here: a stall mid-stream (read timeouts, Stop while waiting)."""

    seconds: float


Step = (
    Text
    | Reasoning
    | RedactedThinking
    | ToolCall
    | WireBlock
    | WireEvent
    | Usage
    | HttpError
    | Reset
    | Truncate
    | ErrorEvent
    | Drip
    | Pause
)

_STEP_TYPES: dict[str, type] = {
    "text": Text,
    "reasoning": Reasoning,
    "redacted_thinking": RedactedThinking,
    "tool_call": ToolCall,
    "wire_block": WireBlock,
    "wire_event": WireEvent,
    "usage": Usage,
    "http_error": HttpError,
    "reset": Reset,
    "truncate": Truncate,
    "error_event": ErrorEvent,
    "drip": Drip,
    "pause": Pause,
}
_STEP_NAMES = {cls: name for name, cls in _STEP_TYPES.items()}


@dataclass(frozen=True)
class Reply:
    """One scripted model reply: steps in wire order.

    `delay` is the per-event delay for the whole reply (tokens at a fixed rate) unless
    a `Drip` step changes it; `None` uses the server's default. `stop` forces the stop
    reason (see STOP_*); by default it is tool_use when the reply calls a tool.
    """

    steps: tuple[Step, ...] = ()
    delay: float | None = None
    stop: str | None = None

    def __init__(
        self, *steps: Step | Iterable[Step], delay: float | None = None, stop: str | None = None
    ) -> None:
        flat: list[Step] = []
        for step in steps:
            if isinstance(step, tuple(_STEP_NAMES)):
                flat.append(step)  # type: ignore[arg-type]
            else:
                flat.extend(step)  # type: ignore[arg-type]
        for position, step in enumerate(flat):
            if isinstance(step, HttpError) and position != 0:
                raise ValueError("http_error must be the first step: a 200 is already sent")
        object.__setattr__(self, "steps", tuple(flat))
        object.__setattr__(self, "delay", delay)
        object.__setattr__(self, "stop", stop)

    @property
    def http_error(self) -> HttpError | None:
        first = self.steps[0] if self.steps else None
        return first if isinstance(first, HttpError) else None

    @property
    def usage(self) -> Usage | None:
        found = [step for step in self.steps if isinstance(step, Usage)]
        return found[-1] if found else None

    @property
    def has_tool_calls(self) -> bool:
        return any(isinstance(step, ToolCall) for step in self.steps)

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": [step_to_json(step) for step in self.steps],
            "delay": self.delay,
            "stop": self.stop,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | list[Any]) -> Reply:
        """A reply from `{"steps": [...], "delay": ..., "stop": ...}` or a bare step list."""
        if isinstance(data, list):
            data = {"steps": data}
        unknown = set(data) - {"steps", "delay", "stop"}
        if unknown:
            raise ValueError(f"unknown reply keys: {sorted(unknown)}")
        steps = [step_from_json(item) for item in data.get("steps", [])]
        return cls(*steps, delay=data.get("delay"), stop=data.get("stop"))


def step_to_json(step: Step) -> dict[str, Any]:
    return {"type": _STEP_NAMES[type(step)], **asdict(step)}


def step_from_json(data: dict[str, Any]) -> Step:
    data = dict(data)
    kind = data.pop("type", None)
    cls = _STEP_TYPES.get(kind or "")
    if cls is None:
        raise ValueError(f"unknown step type {kind!r}; known: {sorted(_STEP_TYPES)}")
    allowed = {f.name for f in fields(cls)}
    unknown = set(data) - allowed
    if unknown:
        raise ValueError(f"unknown fields for {kind}: {sorted(unknown)}")
    return cls(**data)


# Builders: the vocabulary tests script with.


def text(value: str) -> Text:
    return Text(value)


def reasoning(value: str) -> Reasoning:
    return Reasoning(value)


def redacted_thinking(data: str | None = None) -> RedactedThinking:
    return RedactedThinking(data) if data is not None else RedactedThinking()


def tool_call(
    name: str,
    arguments: dict[str, Any] | None = None,
    id: str | None = None,
    *,
    raw_arguments: str | None = None,
    caller: dict[str, Any] | None = None,
) -> ToolCall:
    return ToolCall(name, dict(arguments or {}), id, raw_arguments, caller)


def wire_block(api: str, block: dict[str, Any], *deltas: dict[str, Any]) -> WireBlock:
    return WireBlock(api, block, deltas)


def wire_event(api: str, data: dict[str, Any], name: str | None = None) -> WireEvent:
    return WireEvent(api, name if name is not None else data.get("type"), dict(data))


def usage(
    input: int | None = None,
    output: int | None = None,
    cache_read: int = 0,
    cache_write: int = 0,
    reasoning: int | None = None,
) -> Usage:
    return Usage(input, output, cache_read, cache_write, reasoning)


def http_error(
    status: int | None,
    body: dict[str, Any] | str | None = None,
    headers: dict[str, str] | None = None,
    *,
    kind: str | None = None,
    message: str | None = None,
) -> HttpError:
    return HttpError(status, body, dict(headers or {}), kind, message)


def rate_limited(retry_after: float | None = 1, message: str | None = None) -> HttpError:
    """429 in the API's shape; `retry_after` seconds in the Retry-After header."""
    headers = {} if retry_after is None else {"retry-after": f"{retry_after:g}"}
    return HttpError(None, None, headers, "rate_limit", message)


def quota_exceeded(message: str | None = None) -> HttpError:
    return HttpError(None, None, {}, "quota", message)


def overloaded(status: int | None = None, message: str | None = None) -> HttpError:
    """By default Anthropic's 529 overloaded_error, OpenAI's 503 server_error."""
    return HttpError(status, None, {}, "overloaded", message)


def context_too_long(message: str | None = None) -> HttpError:
    return HttpError(None, None, {}, "context_length", message)


def model_not_found(message: str | None = None) -> HttpError:
    return HttpError(None, None, {}, "model_not_found", message)


def reset() -> Reset:
    return Reset()


def truncate() -> Truncate:
    return Truncate()


def error_event(kind: str = "overloaded", message: str | None = None) -> ErrorEvent:
    return ErrorEvent(kind, message)


def drip(seconds: float) -> Drip:
    return Drip(seconds)


def pause(seconds: float) -> Pause:
    return Pause(seconds)


DefaultReply = Callable[[str], Reply]


def echo_reply(last_user_text: str) -> Reply:
    """The unscripted answer: the last user message, verbatim (or a fixed line)."""
    return Reply(Text(last_user_text or "(no user text)"))


class Script:
    """Thread-safe queue of replies, one consumed per model request.

    `default` builds the reply when the queue is empty; it receives the text of the
    last user message. Pass a `Reply` to answer every unscripted request the same way
    (a bench's steady token stream).
    """

    def __init__(
        self, replies: Iterable[Reply] = (), default: Reply | DefaultReply | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._queue: deque[Reply] = deque(replies)
        self.default: Reply | DefaultReply = default if default is not None else echo_reply

    def push(self, *replies: Reply | Step) -> None:
        """Queue replies; a bare step is shorthand for a one-step reply."""
        with self._lock:
            for item in replies:
                self._queue.append(item if isinstance(item, Reply) else Reply(item))

    def clear(self) -> None:
        with self._lock:
            self._queue.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._queue)

    def next_reply(self, last_user_text: str) -> Reply:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        if isinstance(self.default, Reply):
            return self.default
        return self.default(last_user_text)

    @classmethod
    def from_json(cls, data: dict[str, Any] | list[Any]) -> Script:
        """`{"replies": [...], "default": {...}}` or a bare list of replies."""
        if isinstance(data, list):
            data = {"replies": data}
        unknown = set(data) - {"replies", "default"}
        if unknown:
            raise ValueError(f"unknown script keys: {sorted(unknown)}")
        replies = [Reply.from_json(item) for item in data.get("replies", [])]
        default = data.get("default")
        return cls(replies, Reply.from_json(default) if default is not None else None)
