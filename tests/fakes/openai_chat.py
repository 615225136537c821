"""A fake OpenAI Chat Completions API (and the OpenAI-compatible vendors: DeepSeek,
Ollama's /v1, OpenRouter...).

`POST {base}/chat/completions` with `base` ending in `/v1`, streaming or not, and
`GET {base}/models`. Chunks, completions, usage and errors have the real API's shapes
(checked in tests against the `openai` SDK's pydantic types). Reasoning goes out as
`delta.reasoning_content` (DeepSeek) or `delta.reasoning` (OpenRouter, Ollama) per
`reasoning_field`. `api_key=None` accepts any or no Authorization (Ollama).

`require_reasoning_content=True` enforces DeepSeek's thinking-mode rule: in every turn
(between two user messages) in which the model called tools, each assistant message must
carry a `reasoning_content` string, or the request is refused with DeepSeek's 400.

`simulate_cache=True` meters automatic prefix caching the way OpenAI does: no marks, the
longest prefix this request shares with any earlier one (model, tools, then messages) is
served from cache once it reaches CACHE_MIN_TOKENS, counted in CACHE_BLOCK_TOKENS steps,
and reported as `prompt_tokens_details.cached_tokens` (a part of `prompt_tokens`).
Nothing is ever reported as a cache write. `cache_keys` records each `prompt_cache_key`.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from typing import Any

from .script import (
    STOP_END,
    STOP_MAX_TOKENS,
    STOP_TOOL_USE,
    ErrorEvent,
    HttpError,
    Reasoning,
    Reply,
    Step,
    Text,
    ToolCall,
    Usage,
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

SYSTEM_FINGERPRINT = "fp_fake0001"
DEFAULT_MODELS = ("gpt-fake",)
REASONING_FIELDS = ("reasoning_content", "reasoning")
# DeepSeek's 400 for a tool-loop assistant message sent back without its reasoning.
MISSING_REASONING_CONTENT = (
    "Missing `reasoning_content` field in the assistant message at message index {index}. "
    "For more information, please refer to "
    "https://api-docs.deepseek.com/guides/thinking_mode#tool-calls"
)
# Automatic caching starts at 1024 prompt tokens and then grows in 128-token increments.
CACHE_MIN_TOKENS = 1024
CACHE_BLOCK_TOKENS = 128

_FINISH_REASONS = {STOP_END: "stop", STOP_TOOL_USE: "tool_calls", STOP_MAX_TOKENS: "length"}

# kind -> (status, type, code, param, message); {model} is filled in.
_ERRORS: dict[str, tuple[int, str, str | None, str | None, str]] = {
    "rate_limit": (
        429,
        "requests",
        "rate_limit_exceeded",
        None,
        "Rate limit reached for {model} in organization org-fake on requests per min "
        "(RPM): Limit 3, Used 3, Requested 1. Please try again in 20s.",
    ),
    "quota": (
        429,
        "insufficient_quota",
        "insufficient_quota",
        None,
        "You exceeded your current quota, please check your plan and billing details.",
    ),
    "overloaded": (
        503,
        "server_error",
        None,
        None,
        "The server is overloaded or not ready yet.",
    ),
    "context_length": (
        400,
        "invalid_request_error",
        "context_length_exceeded",
        "messages",
        "This model's maximum context length is 128000 tokens. However, your messages "
        "resulted in 130000 tokens. Please reduce the length of the messages.",
    ),
    "model_not_found": (
        404,
        "invalid_request_error",
        "model_not_found",
        None,
        "The model `{model}` does not exist or you do not have access to it.",
    ),
    "auth": (
        401,
        "invalid_request_error",
        "invalid_api_key",
        None,
        "Incorrect API key provided. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
    ),
    "permission": (
        403,
        "invalid_request_error",
        "unsupported_country_region_territory",
        None,
        "Country, region, or territory not supported",
    ),
    "invalid_request": (400, "invalid_request_error", None, None, "Invalid request."),
    "server": (
        500,
        "server_error",
        None,
        None,
        "The server had an error while processing your request. Sorry about that!",
    ),
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


def error_body(
    message: str, type: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """OpenAI's error envelope."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class OpenAIChatFake(FakeServer):
    """Fake Chat Completions server; `base_url` ends in `/v1` like the SDK expects."""

    api_prefix = "/v1"
    provider = "openai"

    def __init__(
        self,
        *,
        reasoning_field: str = "reasoning_content",
        report_usage: bool = True,
        require_reasoning_content: bool = False,
        **options: Any,
    ) -> None:
        if reasoning_field not in REASONING_FIELDS:
            raise ValueError(f"reasoning_field is one of {REASONING_FIELDS}")
        super().__init__(**options)
        self.reasoning_field = reasoning_field
        # False: ignore stream_options.include_usage and omit usage (some compat vendors).
        self.report_usage = report_usage
        self.require_reasoning_content = require_reasoning_content
        self.cache_keys: list[str | None] = []
        self._cached_prompts: list[str] = []

    # -- prompt-cache simulation ------------------------------------------------------

    def cached_usage(self, body: dict[str, Any], output_text: str) -> Usage:
        """The longest prefix shared with an earlier request, rounded down to the cache's
        granularity, as cache read; the rest as fresh input."""
        self.cache_keys.append(body.get("prompt_cache_key"))
        prompt = json.dumps(
            [body.get("model"), body.get("tools"), body.get("messages")],
            ensure_ascii=False,
            separators=(",", ":"),
        )
        total = max(1, math.ceil(len(prompt) / CHARS_PER_TOKEN))
        shared = max(
            (shared_prefix(prompt, seen) for seen in self._cached_prompts),
            default=0,
        )
        self._cached_prompts.append(prompt)
        cached = cached_tokens(shared // CHARS_PER_TOKEN)
        return Usage(
            input=total - cached, output=self.output_tokens(output_text), cache_read=cached
        )

    def reset_cache(self) -> None:
        self._cached_prompts.clear()
        self.cache_keys.clear()

    # -- routing --------------------------------------------------------------------

    def handle(self, exchange: Exchange) -> None:
        request = exchange.request
        route = (request.method, request.path)
        if route not in (("POST", "/v1/chat/completions"), ("GET", "/v1/models")):
            self._error(
                exchange,
                404,
                error_body(
                    f"Invalid URL ({request.method} {request.path})", "invalid_request_error"
                ),
            )
            return
        if not self._authorized(exchange):
            return
        if route == ("GET", "/v1/models"):
            models = sorted(self.models) if self.models is not None else list(DEFAULT_MODELS)
            exchange.send_json(200, {"object": "list", "data": [_model(m) for m in models]})
            return
        problem = self.check_request(request.body) if self.validate else None
        if problem is not None:
            self._error(exchange, 400, problem)
            return
        body = request.body if isinstance(request.body, dict) else {}
        model = body.get("model", "")
        if self.models is not None and model not in self.models:
            status, err = self._error_for(HttpError(None, kind="model_not_found"), model)
            self._error(exchange, status, err)
            return
        reply = self.script.next_reply(last_user_text(body.get("messages") or []))
        renderer = self.renderer(request, reply)
        self.play(
            exchange,
            reply,
            renderer,
            stream=bool(body.get("stream")),
            error_response=lambda err: self._error_response(err, model),
            headers={"x-request-id": _request_id()},
        )

    def renderer(self, request: RecordedRequest, reply: Reply) -> ChatRenderer:
        """The renderer of one reply (a vendor's fake renders its own shapes)."""
        return ChatRenderer(self, request, reply)

    def _authorized(self, exchange: Exchange) -> bool:
        if self.api_key is None:
            return True
        header = exchange.request.headers.get("authorization", "")
        if not header:
            self._error(
                exchange,
                401,
                error_body(
                    "You didn't provide an API key. You need to provide your API key in an "
                    "Authorization header using Bearer auth (i.e. Authorization: Bearer "
                    "YOUR_KEY).",
                    "invalid_request_error",
                ),
            )
            return False
        if header != f"Bearer {self.api_key}":
            status, err = self._error_for(HttpError(None, kind="auth"), "")
            self._error(exchange, status, err)
            return False
        return True

    # -- errors ---------------------------------------------------------------------

    def _error(self, exchange: Exchange, status: int, body: dict[str, Any]) -> None:
        exchange.send_json(status, body, {"x-request-id": _request_id()})

    def _error_for(self, err: HttpError, model: str) -> tuple[int, dict[str, Any]]:
        kind = err.kind or _KIND_BY_STATUS.get(err.status or 500, "server")
        status, type_, code, param, message = _ERRORS.get(kind, _ERRORS["server"])
        body = error_body(err.message or message.format(model=model), type_, code, param)
        return err.status or status, body

    def _error_response(
        self, err: HttpError, model: str
    ) -> tuple[int, dict[str, Any] | str, dict[str, str]]:
        status, body = self._error_for(err, model)
        headers = {"x-request-id": _request_id(), **err.headers}
        return status, err.body if err.body is not None else body, headers

    # -- validation -----------------------------------------------------------------

    def check_request(self, body: Any) -> dict[str, Any] | None:
        """Cheap structural checks the real API also makes; an error body or None.

        Kept honest: each one is a 400 the real API returns.
        """

        def invalid(message: str, param: str | None = None) -> dict[str, Any]:
            return error_body(message, "invalid_request_error", None, param)

        if not isinstance(body, dict):
            return invalid(
                "We could not parse the JSON body of your request. (HINT: This likely means "
                "you aren't using your HTTP library correctly.)"
            )
        if not body.get("model"):
            return invalid("you must provide a model parameter")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return invalid("[] is too short - 'messages'", "messages")
        if body.get("stream_options") is not None and not body.get("stream"):
            return invalid(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                "stream_options",
            )
        for position, tool in enumerate(body.get("tools") or []):
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(function, dict) or tool.get("type") != "function":
                return invalid(
                    f"Missing required parameter: 'tools[{position}].function'.",
                    f"tools[{position}].function",
                )
            if not function.get("name"):
                return invalid(
                    f"Missing required parameter: 'tools[{position}].function.name'.",
                    f"tools[{position}].function.name",
                )
        problem = _check_tool_messages(messages, invalid)
        if problem is None and self.require_reasoning_content:
            problem = _check_reasoning_content(messages, invalid)
        return problem


class ChatRenderer:
    """Renders one reply as chat.completion.chunk events or one chat.completion."""

    def __init__(self, fake: OpenAIChatFake, request: RecordedRequest, reply: Reply) -> None:
        body = request.body if isinstance(request.body, dict) else {}
        self.fake = fake
        self.reply = reply
        self.id = "chatcmpl-" + secrets.token_hex(12)
        self.created = int(time.time())
        self.model = body.get("model", "")
        stream_options = body.get("stream_options") or {}
        self.include_usage = bool(stream_options.get("include_usage")) and fake.report_usage
        self.usage: ResolvedUsage = fake.resolve_usage(request, reply)
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: list[dict[str, Any]] = []
        self.refusal: list[str] = []

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> Event:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if self.include_usage:
            chunk["usage"] = None
        return (None, chunk)

    def start_events(self) -> list[Event]:
        return [self._chunk({"role": "assistant", "content": "", "refusal": None})]

    def step_events(self, step: Step) -> list[Event]:
        if isinstance(step, Text):
            self.text.append(step.text)
            return [self._chunk({"content": piece}) for piece in pieces(step.text)]
        if isinstance(step, Reasoning):
            self.reasoning.append(step.text)
            field = self.fake.reasoning_field
            return [self._chunk({field: piece}) for piece in pieces(step.text)]
        if isinstance(step, ToolCall):
            index = len(self.tool_calls)
            call_id = step.id or "call_" + secrets.token_hex(12)
            arguments = tool_arguments_text(step)
            self.tool_calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": step.name, "arguments": arguments},
                }
            )
            head = {
                "index": index,
                "id": call_id,
                "type": "function",
                "function": {"name": step.name, "arguments": ""},
            }
            events = [self._chunk({"tool_calls": [head]})]
            for fragment in fragments(arguments):
                tail = {"index": index, "function": {"arguments": fragment}}
                events.append(self._chunk({"tool_calls": [tail]}))
            return events
        if isinstance(step, WireEvent) and step.api == "openai":
            # A chunk's `delta` in the API's own shape (`refusal`, a field a client may
            # not know yet); a whole reply folds a `refusal` into the message.
            if isinstance(step.data.get("refusal"), str):
                self.refusal.append(step.data["refusal"])
            return [self._chunk(dict(step.data))]
        return []  # redacted thinking has no Chat Completions form

    def error_events(self, step: ErrorEvent) -> list[Event]:
        _, body = self.fake._error_for(
            HttpError(None, kind=step.kind, message=step.message), self.model
        )
        return [(None, body)]

    def finish_events(self) -> list[Event]:
        events = [self._chunk({}, self.finish_reason)]
        if self.include_usage:
            events.append(
                (
                    None,
                    {
                        "id": self.id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.model,
                        "system_fingerprint": SYSTEM_FINGERPRINT,
                        "choices": [],
                        "usage": usage_object(self.usage),
                    },
                )
            )
        events.append((None, "[DONE]"))
        return events

    @property
    def finish_reason(self) -> str:
        if self.reply.stop is not None:
            return _FINISH_REASONS.get(self.reply.stop, self.reply.stop)
        return "tool_calls" if self.tool_calls else "stop"

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.text) if self.text else None,
            "refusal": "".join(self.refusal) or None,
            "annotations": [],
        }
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        if self.reasoning:
            message[self.fake.reasoning_field] = "".join(self.reasoning)
        completion: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self.finish_reason,
                }
            ],
        }
        if self.fake.report_usage:
            completion["usage"] = usage_object(self.usage)
        return completion


def shared_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings (a binary search over slice
    comparisons: long prompts compare in C, not a character at a time in Python)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def cached_tokens(shared_tokens: int) -> int:
    """Tokens served from cache for a shared prefix of `shared_tokens`: none below the
    minimum, then the minimum plus whole blocks."""
    if shared_tokens < CACHE_MIN_TOKENS:
        return 0
    blocks = (shared_tokens - CACHE_MIN_TOKENS) // CACHE_BLOCK_TOKENS
    return CACHE_MIN_TOKENS + blocks * CACHE_BLOCK_TOKENS


def usage_object(usage: ResolvedUsage) -> dict[str, Any]:
    """OpenAI usage: prompt_tokens includes the cached tokens (they are a detail of it)."""
    prompt = usage.input + usage.cache_read + usage.cache_write
    prompt_details: dict[str, Any] = {"cached_tokens": usage.cache_read, "audio_tokens": 0}
    if usage.cache_write:
        prompt_details["cache_write_tokens"] = usage.cache_write
    return {
        "prompt_tokens": prompt,
        "completion_tokens": usage.output,
        "total_tokens": prompt + usage.output,
        "prompt_tokens_details": prompt_details,
        "completion_tokens_details": {
            "reasoning_tokens": usage.reasoning or 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def last_user_text(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "".join(
                    part.get("text", "")
                    for part in content
                    if isinstance(part, dict) and part.get("type") == "text"
                )
    return ""


def _check_tool_messages(messages: list[Any], invalid: Any) -> dict[str, Any] | None:
    """Tool messages answer the calls of the assistant message right before them, and
    every call is answered before the conversation moves on."""
    pending: list[str] = []
    answered: set[str] = set()
    for position, message in enumerate(messages):
        if not isinstance(message, dict):
            return invalid(f"Invalid type for 'messages[{position}]'.", f"messages[{position}]")
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not call_id:
                return invalid(
                    "Missing parameter 'tool_call_id': messages with role 'tool' must have "
                    "a 'tool_call_id'.",
                    f"messages.[{position}].tool_call_id",
                )
            if call_id not in pending or call_id in answered:
                return invalid(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"messages.[{position}].role",
                )
            answered.add(call_id)
            continue
        missing = [call_id for call_id in pending if call_id not in answered]
        if missing:
            return invalid(
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(missing)}",
                f"messages.[{position}].role",
            )
        pending, answered = [], set()
        if role == "assistant":
            pending = [
                call.get("id") for call in message.get("tool_calls") or [] if isinstance(call, dict)
            ]
    return None


def _check_reasoning_content(messages: list[Any], invalid: Any) -> dict[str, Any] | None:
    """Each assistant message of a turn that called tools carries `reasoning_content`."""
    turns: list[list[tuple[int, dict[str, Any]]]] = [[]]
    for position, message in enumerate(messages):
        if message.get("role") == "user":
            turns.append([])
        elif message.get("role") == "assistant":
            turns[-1].append((position, message))
    for turn in turns:
        if not any(message.get("tool_calls") for _, message in turn):
            continue
        for position, message in turn:
            if not isinstance(message.get("reasoning_content"), str):
                return invalid(MISSING_REASONING_CONTENT.format(index=position))
    return None


def _model(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 1_700_000_000, "owned_by": "fake"}


def _request_id() -> str:
    return "req_" + secrets.token_hex(16)
