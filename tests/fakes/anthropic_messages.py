"""A fake Anthropic Messages API.

`POST /v1/messages` (streaming or not), `POST /v1/messages/count_tokens` and
`GET /v1/models`, with the `anthropic-version` header and the key checked (`x-api-key`,
or `Authorization: Bearer` as the 2.x SDK sends it). The
stream is the real event sequence (message_start, content_block_start/delta/stop,
ping, message_delta, message_stop, or `event: error`), checked in tests against the
`anthropic` SDK's pydantic types. `base_url` is the root URL, as the SDK expects.

Thinking blocks are signed with an HMAC of their text, and a thinking block sent back
with a signature that does not match is refused like the real API refuses a modified
block: a client that edits or drops signatures fails here, not in production.

`simulate_cache=True` meters prompt caching the way the API does: the prompt renders as
tools, then system, then messages; a block carrying `cache_control` is a breakpoint; the
prefix up to a breakpoint is written to the cache (when at least `cache_min_tokens`
long) and reported as `cache_creation_input_tokens`; a later request whose prefix up to a
breakpoint (or up to CACHE_LOOKBACK_BLOCKS blocks before it) was written reads it back as
`cache_read_input_tokens`. The marks themselves are not part of the cached content, so a
breakpoint that moves on does not change the prefix before it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import secrets
from typing import Any

from .script import (
    STOP_END,
    STOP_MAX_TOKENS,
    STOP_TOOL_USE,
    ErrorEvent,
    HttpError,
    Reasoning,
    RedactedThinking,
    Reply,
    Step,
    Text,
    ToolCall,
    Usage,
    WireBlock,
    WireEvent,
)
from .server import (
    CHARS_PER_TOKEN,
    Event,
    Exchange,
    FakeServer,
    RecordedRequest,
    ResolvedUsage,
    fragments,
    pieces,
    tool_arguments_text,
)

DEFAULT_MODELS = ("claude-fake",)
# Any per-process secret works: only this fake ever checks its own signatures.
SIGNING_KEY = b"openworker-fake-thinking-signature"
# The API's floor for an extended-thinking budget.
MIN_THINKING_BUDGET = 1024
# The API refuses a request with more blocks carrying cache_control than this.
MAX_CACHE_BREAKPOINTS = 4
# How far back from a breakpoint the API looks for an earlier cache entry.
CACHE_LOOKBACK_BLOCKS = 20
# Smallest cacheable prefix of the Sonnet/Opus models; shorter ones silently don't cache.
DEFAULT_CACHE_MIN_TOKENS = 1024

_STOP_REASONS = {STOP_END: "end_turn", STOP_TOOL_USE: "tool_use", STOP_MAX_TOKENS: "max_tokens"}

# kind -> (status, error type, message); {model} is filled in.
_ERRORS: dict[str, tuple[int, str, str]] = {
    "rate_limit": (
        429,
        "rate_limit_error",
        "This request would exceed the rate limit for your organization of 50 requests per "
        "minute. For details, refer to: https://docs.claude.com/en/api/rate-limits.",
    ),
    "quota": (
        400,
        "invalid_request_error",
        "Your credit balance is too low to access the Anthropic API. Please go to Plans & "
        "Billing to upgrade or purchase credits.",
    ),
    "overloaded": (529, "overloaded_error", "Overloaded"),
    "context_length": (
        400,
        "invalid_request_error",
        "prompt is too long: 215000 tokens > 200000 maximum",
    ),
    "model_not_found": (404, "not_found_error", "model: {model}"),
    "auth": (401, "authentication_error", "invalid x-api-key"),
    "permission": (
        403,
        "permission_error",
        "Your API key does not have permission to use the specified resource.",
    ),
    "invalid_request": (400, "invalid_request_error", "Invalid request."),
    "server": (500, "api_error", "Internal server error"),
}
_KIND_BY_STATUS = {
    400: "invalid_request",
    401: "auth",
    403: "permission",
    404: "model_not_found",
    429: "rate_limit",
    503: "overloaded",
    529: "overloaded",
}


def error_body(type: str, message: str) -> dict[str, Any]:
    """Anthropic's error envelope."""
    return {"type": "error", "error": {"type": type, "message": message}}


def sign_thinking(thinking: str) -> str:
    digest = hmac.new(SIGNING_KEY, thinking.encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


class AnthropicMessagesFake(FakeServer):
    """Fake Messages server. `strict_roles=True` also refuses consecutive same-role
    messages (off by default: the real API merges them into one turn)."""

    api_prefix = ""
    provider = "anthropic"

    def __init__(
        self,
        *,
        strict_roles: bool = False,
        cache_min_tokens: int = DEFAULT_CACHE_MIN_TOKENS,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.strict_roles = strict_roles
        self.cache_min_tokens = cache_min_tokens
        self._cached_prefixes: set[str] = set()
        # Code execution containers handed out (programmatic tool calls run in one).
        self.containers: set[str] = set()

    # -- prompt-cache simulation ------------------------------------------------------

    def cached_usage(self, body: dict[str, Any], output_text: str) -> Usage:
        """Fresh input, cache read and cache write for one request (see the module doc)."""
        units = cache_units(body)
        running = hashlib.sha256(str(body.get("model", "")).encode())
        digests: list[str] = []
        totals: list[int] = []
        total = 0
        for canonical, _ in units:
            running.update(canonical.encode() + b"\x00")
            digests.append(running.hexdigest())
            total += max(1, math.ceil(len(canonical) / CHARS_PER_TOKEN))
            totals.append(total)
        breakpoints = [position for position, (_, marked) in enumerate(units) if marked]
        read = 0
        for point in breakpoints:
            for position in range(point, max(-1, point - CACHE_LOOKBACK_BLOCKS), -1):
                if digests[position] in self._cached_prefixes:
                    read = max(read, totals[position])
                    break
        written_to = read
        for point in breakpoints:
            if totals[point] >= self.cache_min_tokens and totals[point] > read:
                self._cached_prefixes.add(digests[point])
                written_to = max(written_to, totals[point])
        return Usage(
            input=total - written_to,
            output=self.output_tokens(output_text),
            cache_read=read,
            cache_write=written_to - read,
        )

    def reset_cache(self) -> None:
        self._cached_prefixes.clear()

    # -- routing --------------------------------------------------------------------

    def handle(self, exchange: Exchange) -> None:
        request = exchange.request
        route = (request.method, request.path)
        known = {
            ("POST", "/v1/messages"),
            ("POST", "/v1/messages/count_tokens"),
            ("GET", "/v1/models"),
        }
        if route not in known:
            self._error(exchange, 404, error_body("not_found_error", "Not Found"))
            return
        if not self._check_headers(exchange):
            return
        if route == ("GET", "/v1/models"):
            models = sorted(self.models) if self.models is not None else list(DEFAULT_MODELS)
            data = [_model(m) for m in models]
            exchange.send_json(
                200,
                {
                    "data": data,
                    "has_more": False,
                    "first_id": data[0]["id"] if data else None,
                    "last_id": data[-1]["id"] if data else None,
                },
            )
            return
        problem = self.check_request(request.body, count_only=route[1].endswith("count_tokens"))
        if problem is not None and self.validate:
            self._error(exchange, 400, problem)
            return
        body = request.body if isinstance(request.body, dict) else {}
        model = body.get("model", "")
        if self.models is not None and model not in self.models:
            status, err = self._error_for(HttpError(None, kind="model_not_found"), model)
            self._error(exchange, status, err)
            return
        if route[1].endswith("count_tokens"):
            prompt = json.dumps(self.prompt_parts(body), sort_keys=True)
            tokens = max(1, math.ceil(len(prompt) / CHARS_PER_TOKEN))
            exchange.send_json(200, {"input_tokens": tokens})
            return
        reply = self.script.next_reply(last_user_text(body.get("messages") or []))
        renderer = MessagesRenderer(self, request, reply)
        self.play(
            exchange,
            reply,
            renderer,
            stream=bool(body.get("stream")),
            error_response=lambda err: self._error_response(err, model),
            headers={"request-id": _request_id()},
        )

    def _check_headers(self, exchange: Exchange) -> bool:
        headers = exchange.request.headers
        if self.api_key is not None:
            # The SDK (2.x) sends `Authorization: Bearer`; raw clients send `x-api-key`.
            bearer = headers.get("authorization", "")
            key = headers.get("x-api-key") or bearer.removeprefix("Bearer ").strip()
            if not key:
                body = error_body("authentication_error", "x-api-key header is required")
                self._error(exchange, 401, body)
                return False
            if key != self.api_key:
                self._error(exchange, 401, error_body("authentication_error", "invalid x-api-key"))
                return False
        repeated = [
            name
            for name in ("content-type", "anthropic-version", "x-api-key")
            if exchange.request.header_count(name) > 1
        ]
        if repeated:
            body = error_body("invalid_request_error", f"{repeated[0]}: header given twice")
            self._error(exchange, 400, body)
            return False
        if not headers.get("anthropic-version"):
            body = error_body("invalid_request_error", "anthropic-version: header is required")
            self._error(exchange, 400, body)
            return False
        return True

    # -- errors ---------------------------------------------------------------------

    def _error(self, exchange: Exchange, status: int, body: dict[str, Any]) -> None:
        request_id = _request_id()
        exchange.send_json(status, {**body, "request_id": request_id}, {"request-id": request_id})

    def _error_for(self, err: HttpError, model: str) -> tuple[int, dict[str, Any]]:
        kind = err.kind or _KIND_BY_STATUS.get(err.status or 500, "server")
        status, type_, message = _ERRORS.get(kind, _ERRORS["server"])
        return err.status or status, error_body(type_, err.message or message.format(model=model))

    def _error_response(
        self, err: HttpError, model: str
    ) -> tuple[int, dict[str, Any] | str, dict[str, str]]:
        status, body = self._error_for(err, model)
        request_id = _request_id()
        headers = {"request-id": request_id, **err.headers}
        if err.body is not None:
            return status, err.body, headers
        return status, {**body, "request_id": request_id}, headers

    # -- validation -----------------------------------------------------------------

    def check_request(self, body: Any, *, count_only: bool = False) -> dict[str, Any] | None:
        """Cheap structural checks the real API also makes; an error body or None."""

        def invalid(message: str) -> dict[str, Any]:
            return error_body("invalid_request_error", message)

        if not isinstance(body, dict):
            return invalid("Request body is not valid JSON.")
        for name in ("model", "messages") if count_only else ("model", "max_tokens", "messages"):
            if name not in body:
                return invalid(f"{name}: Field required")
        messages = body["messages"]
        if not isinstance(messages, list):
            return invalid("messages: Input should be a valid list")
        thinking = body.get("thinking") or {}
        if thinking.get("type") == "enabled" and not count_only:
            budget = thinking.get("budget_tokens")
            if not isinstance(budget, int) or budget < MIN_THINKING_BUDGET:
                return invalid(
                    f"thinking.enabled.budget_tokens: Input should be greater than or equal "
                    f"to {MIN_THINKING_BUDGET}"
                )
            if budget >= body["max_tokens"]:
                return invalid(
                    "`max_tokens` must be greater than `thinking.budget_tokens`. Please "
                    "consult our documentation at https://docs.claude.com/en/docs/"
                    "build-with-claude/extended-thinking#max-tokens-and-context-window-size"
                )
        for position, tool in enumerate(body.get("tools") or []):
            if not isinstance(tool, dict) or not tool.get("name"):
                return invalid(f"tools.{position}.name: Field required")
            if tool.get("type") in (None, "custom") and "input_schema" not in tool:
                return invalid(f"tools.{position}.custom.input_schema: Field required")
        marks = count_cache_marks(body)
        if marks > MAX_CACHE_BREAKPOINTS:
            return invalid(
                f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be "
                f"provided. Found {marks}."
            )
        problem = ttl_order_problem(body)
        if problem is not None:
            return invalid(problem)
        problem = self._container_problem(body)
        if problem is not None:
            return invalid(problem)
        return self._check_messages(messages, invalid)

    def _container_problem(self, body: dict[str, Any]) -> str | None:
        """Results of programmatic tool calls must name the container their code runs in."""
        assistants = [m for m in body.get("messages") or [] if m.get("role") == "assistant"]
        blocks = assistants[-1].get("content") if assistants else None
        pending = [
            b
            for b in (blocks if isinstance(blocks, list) else [])
            if _is_block(b, "tool_use") and isinstance(b.get("caller"), dict)
        ]
        if not pending:
            return None
        if body.get("container") not in self.containers:
            return (
                "container: a container id is required when responding to a programmatic "
                "tool call (tool_use with a caller)"
            )
        return None

    def _check_messages(self, messages: list[Any], invalid: Any) -> dict[str, Any] | None:
        previous_tool_uses: list[str] = []
        previous_role = None
        for position, message in enumerate(messages):
            if not isinstance(message, dict):
                return invalid(f"messages.{position}: Input should be a valid dictionary")
            role = message.get("role")
            if role not in ("user", "assistant"):
                return invalid(f"messages.{position}.role: Input should be 'user' or 'assistant'")
            if self.strict_roles and role == previous_role:
                return invalid('messages: roles must alternate between "user" and "assistant"')
            content = message.get("content")
            is_last = position == len(messages) - 1
            if content in ("", []) and not (is_last and role == "assistant"):
                return invalid(
                    f"messages.{position}: all messages must have non-empty content except "
                    f"for the optional final assistant message"
                )
            blocks = content if isinstance(content, list) else []
            results = [b.get("tool_use_id") for b in blocks if _is_block(b, "tool_result")]
            unexpected = [r for r in results if r not in previous_tool_uses]
            if unexpected:
                return invalid(
                    f"messages.{position}.content.0: unexpected `tool_use_id` found in "
                    f"`tool_result` blocks: {', '.join(map(str, unexpected))}. Each "
                    f"`tool_result` block must have a corresponding `tool_use` block in the "
                    f"previous message."
                )
            unanswered = [t for t in previous_tool_uses if t not in results]
            if unanswered:
                return invalid(
                    f"messages.{position - 1}: `tool_use` ids were found without "
                    f"`tool_result` blocks immediately after: {', '.join(unanswered)}. Each "
                    f"`tool_use` block must have a corresponding `tool_result` block in the "
                    f"next message."
                )
            for index, block in enumerate(blocks):
                problem = _check_block(block, f"messages.{position}.content.{index}", role)
                if problem:
                    return invalid(problem)
            previous_tool_uses = [b.get("id") for b in blocks if _is_block(b, "tool_use")]
            previous_role = role
        return None


def count_cache_marks(value: Any) -> int:
    """How many objects anywhere in `value` carry `cache_control` (the API's count)."""
    if isinstance(value, dict):
        own = 1 if value.get("cache_control") else 0
        return own + sum(count_cache_marks(v) for k, v in value.items() if k != "cache_control")
    if isinstance(value, list):
        return sum(count_cache_marks(item) for item in value)
    return 0


def _marks_in_order(value: Any) -> list[dict[str, Any]]:
    """Every `cache_control` in `value`, depth first: inner blocks (a tool result's
    content) before the mark on the block that holds them, as the prompt renders."""
    found: list[dict[str, Any]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if key != "cache_control":
                found.extend(_marks_in_order(item))
        if isinstance(value.get("cache_control"), dict):
            found.append(value["cache_control"])
    elif isinstance(value, list):
        for item in value:
            found.extend(_marks_in_order(item))
    return found


def _ttl_seconds(mark: dict[str, Any]) -> int:
    return {"5m": 300, "1h": 3600}.get(mark.get("ttl") or "5m", 0)


def ttl_order_problem(body: dict[str, Any]) -> str | None:
    """The API's refusal of a longer TTL after a shorter one in prompt order (tools, then
    system, then messages), or of a TTL it does not offer; None when the order holds."""
    marks = [
        *_marks_in_order(body.get("tools") or []),
        *_marks_in_order(body.get("system") if isinstance(body.get("system"), list) else []),
        *_marks_in_order(body.get("messages") or []),
    ]
    shortest: dict[str, Any] | None = None
    for mark in marks:
        if _ttl_seconds(mark) == 0:
            return f"cache_control.ttl: Input should be '5m' or '1h' (got {mark.get('ttl')!r})"
        if shortest is not None and _ttl_seconds(mark) > _ttl_seconds(shortest):
            return (
                f"a ttl='{mark.get('ttl')}' cache_control block must not come after a "
                f"ttl='{shortest.get('ttl') or '5m'}' cache_control block. Note that blocks "
                "are processed in the following order: `tools`, `system`, `messages`."
            )
        if shortest is None or _ttl_seconds(mark) < _ttl_seconds(shortest):
            shortest = mark
    return None


def _without_marks(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_marks(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_without_marks(item) for item in value]
    return value


def cache_units(body: dict[str, Any]) -> list[tuple[str, bool]]:
    """The prompt as cacheable units in render order (tools, system, message blocks):
    each unit's canonical JSON without cache marks, and whether it carried a mark."""
    units: list[tuple[Any, bool]] = []
    for tool in body.get("tools") or []:
        units.append((["tool", _without_marks(tool)], count_cache_marks(tool) > 0))
    system = body.get("system")
    if isinstance(system, str) and system:
        units.append((["system", {"type": "text", "text": system}], False))
    elif isinstance(system, list):
        for block in system:
            units.append((["system", _without_marks(block)], count_cache_marks(block) > 0))
    for position, message in enumerate(body.get("messages") or []):
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for block in blocks if isinstance(blocks, list) else []:
            unit = [position, message.get("role"), _without_marks(block)]
            units.append((unit, count_cache_marks(block) > 0))
    return [(json.dumps(unit, sort_keys=True), marked) for unit, marked in units]


def _is_block(block: Any, kind: str) -> bool:
    return isinstance(block, dict) and block.get("type") == kind


def _check_block(block: Any, where: str, role: str) -> str | None:
    if not isinstance(block, dict) or "type" not in block:
        return f"{where}.type: Field required"
    kind = block["type"]
    if kind == "text" and not block.get("text"):
        return "messages: text content blocks must be non-empty"
    if kind == "thinking":
        if role != "assistant":
            return f"{where}: thinking blocks are only allowed in assistant messages"
        signature = block.get("signature")
        if not signature:
            return f"{where}.thinking.signature: Field required"
        if not hmac.compare_digest(signature, sign_thinking(block.get("thinking", ""))):
            return f"{where}: Invalid `signature` in `thinking` block"
    if kind == "tool_use" and role != "assistant":
        return f"{where}: tool_use blocks are only allowed in assistant messages"
    if kind == "tool_result" and role != "user":
        return f"{where}: tool_result blocks are only allowed in user messages"
    return None


class MessagesRenderer:
    """Renders one reply as Messages stream events or one Message object."""

    def __init__(self, fake: AnthropicMessagesFake, request: RecordedRequest, reply: Reply) -> None:
        body = request.body if isinstance(request.body, dict) else {}
        self.fake = fake
        self.reply = reply
        self.id = "msg_" + secrets.token_hex(12)
        self.model = body.get("model", "")
        self.usage: ResolvedUsage = fake.resolve_usage(request, reply)
        self.blocks: list[dict[str, Any]] = []
        self._open: int | None = None
        self._pinged = False
        self.container: dict[str, Any] | None = None

    # -- stream ---------------------------------------------------------------------

    def start_events(self) -> list[Event]:
        message = self._skeleton()
        message["usage"]["output_tokens"] = 1  # the API reports a token at start
        return [("message_start", {"type": "message_start", "message": message})]

    def step_events(self, step: Step) -> list[Event]:
        if isinstance(step, Text):
            events = self._open_block("text", {"type": "text", "text": ""})
            index = len(self.blocks) - 1
            self.blocks[index]["text"] += step.text
            for piece in pieces(step.text):
                delta = {"type": "text_delta", "text": piece}
                events.append(self._delta(index, delta))
            return events
        if isinstance(step, Reasoning):
            start = {"type": "thinking", "thinking": "", "signature": ""}
            events = self._open_block("thinking", start)
            index = len(self.blocks) - 1
            self.blocks[index]["thinking"] += step.text
            for piece in pieces(step.text):
                events.append(self._delta(index, {"type": "thinking_delta", "thinking": piece}))
            return events
        if isinstance(step, RedactedThinking):
            block = {"type": "redacted_thinking", "data": step.data}
            return self._open_block("redacted_thinking", block, fresh=True)
        if isinstance(step, ToolCall) and step.caller is not None:
            # Programmatic tool calling: the whole input at the start, no deltas.
            call_id = step.id or "toolu_" + secrets.token_hex(12)
            block = {
                "type": "tool_use",
                "id": call_id,
                "name": step.name,
                "input": dict(step.arguments),
                "caller": dict(step.caller),
            }
            if self.container is None:
                self.container = {
                    "id": "container_" + secrets.token_hex(12),
                    "expires_at": "2026-12-01T23:59:00Z",
                }
                self.fake.containers.add(self.container["id"])
            return self._open_block("tool_use", block, fresh=True)
        if isinstance(step, WireBlock) and step.api == "anthropic":
            events = self._open_block(step.block["type"], dict(step.block), fresh=True)
            index = len(self.blocks) - 1
            self.blocks[index] = _applied(step.block, step.deltas)
            events.extend(self._delta(index, delta) for delta in step.deltas)
            return events
        if isinstance(step, WireEvent) and step.api == "anthropic":
            return [(step.name, dict(step.data))]
        if isinstance(step, ToolCall):
            call_id = step.id or "toolu_" + secrets.token_hex(12)
            arguments = tool_arguments_text(step)
            block = {"type": "tool_use", "id": call_id, "name": step.name, "input": {}}
            events = self._open_block("tool_use", block, fresh=True)
            index = len(self.blocks) - 1
            self.blocks[index]["input"] = step.arguments
            for fragment in ["", *fragments(arguments)]:
                delta = {"type": "input_json_delta", "partial_json": fragment}
                events.append(self._delta(index, delta))
            return events
        return []

    def error_events(self, step: ErrorEvent) -> list[Event]:
        _, body = self.fake._error_for(
            HttpError(None, kind=step.kind, message=step.message), self.model
        )
        return [("error", body)]

    def finish_events(self) -> list[Event]:
        events = self._close_open()
        usage = self.usage
        delta_usage = {
            "input_tokens": usage.input,
            "cache_creation_input_tokens": usage.cache_write,
            "cache_read_input_tokens": usage.cache_read,
            "output_tokens": usage.output,
        }
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": self.stop_reason,
                        "stop_sequence": None,
                        **({"container": self.container} if self.container else {}),
                    },
                    "usage": delta_usage,
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    # -- whole message --------------------------------------------------------------

    def message(self) -> dict[str, Any]:
        self._close_open()
        message = self._skeleton()
        message["content"] = [self._final(block) for block in self.blocks]
        message["stop_reason"] = self.stop_reason
        if self.container:
            message["container"] = self.container
        return message

    @property
    def stop_reason(self) -> str:
        if self.reply.stop is not None:
            return _STOP_REASONS.get(self.reply.stop, self.reply.stop)
        return "tool_use" if any(b["type"] == "tool_use" for b in self.blocks) else "end_turn"

    # -- internals ------------------------------------------------------------------

    def _skeleton(self) -> dict[str, Any]:
        usage = self.usage
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": usage.input,
                "cache_creation_input_tokens": usage.cache_write,
                "cache_read_input_tokens": usage.cache_read,
                "output_tokens": usage.output,
            },
        }

    def _final(self, block: dict[str, Any]) -> dict[str, Any]:
        if block["type"] == "thinking":
            return {**block, "signature": sign_thinking(block["thinking"])}
        return block

    def _open_block(self, kind: str, start: dict[str, Any], *, fresh: bool = False) -> list[Event]:
        """Continue the open block of `kind`, or close it and start a new one."""
        if not fresh and self._open is not None and self.blocks[self._open]["type"] == kind:
            return []
        events = self._close_open()
        self.blocks.append(dict(start))
        self._open = len(self.blocks) - 1
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": self._open, "content_block": start},
            )
        )
        if not self._pinged:
            self._pinged = True
            events.append(("ping", {"type": "ping"}))
        return events

    def _close_open(self) -> list[Event]:
        if self._open is None:
            return []
        index, self._open = self._open, None
        events: list[Event] = []
        block = self.blocks[index]
        if block["type"] == "thinking":
            signature = sign_thinking(block["thinking"])
            events.append(self._delta(index, {"type": "signature_delta", "signature": signature}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        return events

    def _delta(self, index: int, delta: dict[str, Any]) -> Event:
        return (
            "content_block_delta",
            {"type": "content_block_delta", "index": index, "delta": delta},
        )


def _applied(start: dict[str, Any], deltas: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """A block as a whole Message holds it: its start with the deltas folded in."""
    block = json.loads(json.dumps(start))
    partial_json = ""
    for delta in deltas:
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta["text"]
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta["citation"])
        elif kind == "input_json_delta":
            partial_json += delta.get("partial_json", "")
    if partial_json:
        block["input"] = json.loads(partial_json)
    return block


def last_user_text(messages: list[Any]) -> str:
    """Text of the last user message; tool results count when there is no text."""
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        texts: list[str] = []
        for block in content if isinstance(content, list) else []:
            if _is_block(block, "text"):
                texts.append(block.get("text", ""))
            elif _is_block(block, "tool_result"):
                inner = block.get("content")
                if isinstance(inner, str):
                    texts.append(inner)
                elif isinstance(inner, list):
                    texts.extend(b.get("text", "") for b in inner if _is_block(b, "text"))
        return "".join(texts)
    return ""


def _model(model_id: str) -> dict[str, Any]:
    return {
        "type": "model",
        "id": model_id,
        "display_name": model_id,
        "created_at": "2025-01-01T00:00:00Z",
    }


def _request_id() -> str:
    return "req_" + secrets.token_hex(12)
