"""A fake OpenAI Responses API.

`POST {base}/responses` (streaming or not) and `GET {base}/models`, with `base` ending in
`/v1` like the SDK expects; the key, error bodies and statuses are the Chat Completions
fake's (the two APIs share them). The stream is the real event sequence, each event named
in its SSE `event:` line and numbered by `sequence_number`:

    response.created, response.in_progress,
    per output item: response.output_item.added, then
        message:       content_part.added, output_text.delta..., output_text.done,
                       content_part.done
        reasoning:     per summary part: reasoning_summary_part.added,
                       reasoning_summary_text.delta..., reasoning_summary_text.done,
                       reasoning_summary_part.done
        function_call: function_call_arguments.delta..., function_call_arguments.done
    response.output_item.done,
    response.completed (response.incomplete when the reply stops at max_tokens),
    or `error` / `response.failed` for a scripted error event.

Checked in tests against the `openai` SDK's `ResponseStreamEvent` and `Response` types.

Encrypted reasoning: when the request asks for `include: ["reasoning.encrypted_content"]`,
every reasoning item carries an `encrypted_content` sealed with an HMAC over its id and the
model. A reasoning item sent back is refused like the real API refuses it with
`store: false`: without its encrypted content ("Items are not persisted"), or with content
that was edited, moved to another item, or produced by another model. A client that drops,
edits or cross-replays reasoning fails here, not in production.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from typing import Any

from .openai_chat import OpenAIChatFake, error_body
from .script import (
    STOP_MAX_TOKENS,
    ErrorEvent,
    HttpError,
    Reasoning,
    RedactedThinking,
    Reply,
    Step,
    Text,
    ToolCall,
    Usage,
)
from .server import (
    Event,
    Exchange,
    RecordedRequest,
    ResolvedUsage,
    fragments,
    pieces,
    tool_arguments_text,
)

ENCRYPTED_REASONING = "reasoning.encrypted_content"
# Any per-process secret works: only this fake ever checks its own seals.
SEALING_KEY = b"openworker-fake-encrypted-reasoning"
# Real encrypted reasoning is a Fernet token; the prefix makes ours look the part.
SEAL_PREFIX = "gAAAAA"
# `response.failed` carries an error code from a closed list: these two, by kind.
_FAILED_CODES = {"rate_limit": "rate_limit_exceeded"}
DEFAULT_FAILED_CODE = "server_error"


def seal_reasoning(item_id: str, model: str) -> str:
    """The `encrypted_content` of reasoning item `item_id` produced by `model`."""
    payload = json.dumps({"id": item_id, "model": model}, separators=(",", ":")).encode()
    mac = hmac.new(SEALING_KEY, payload, hashlib.sha256).digest()
    return SEAL_PREFIX + base64.urlsafe_b64encode(payload + mac).decode()


def open_seal(token: str) -> dict[str, Any] | None:
    """The sealed `{"id", "model"}`, or None when the token was not made here or was edited."""
    if not isinstance(token, str) or not token.startswith(SEAL_PREFIX):
        return None
    try:
        raw = base64.urlsafe_b64decode(token[len(SEAL_PREFIX) :].encode())
    except ValueError:
        return None
    payload, mac = raw[:-32], raw[-32:]
    expected = hmac.new(SEALING_KEY, payload, hashlib.sha256).digest()
    if len(raw) <= 32 or not hmac.compare_digest(mac, expected):
        return None
    try:
        sealed = json.loads(payload)
    except ValueError:
        return None
    return sealed if isinstance(sealed, dict) else None


class OpenAIResponsesFake(OpenAIChatFake):
    """Fake Responses server; `base_url` ends in `/v1` like the SDK expects.

    `failed_events=True` renders a scripted error event as `response.failed` (the API's
    way for a response that started and then failed) instead of the `error` event.
    """

    provider = "openai-responses"

    def __init__(self, *, failed_events: bool = False, **options: Any) -> None:
        super().__init__(**options)
        self.failed_events = failed_events

    # -- routing --------------------------------------------------------------------

    def handle(self, exchange: Exchange) -> None:
        request = exchange.request
        route = (request.method, request.path)
        if route not in (("POST", "/v1/responses"), ("GET", "/v1/models")):
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
            super().handle(exchange)
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
        reply = self.script.next_reply(last_user_text(body.get("input")))
        renderer = ResponsesRenderer(self, request, reply)
        self.play(
            exchange,
            reply,
            renderer,
            stream=bool(body.get("stream")),
            error_response=lambda err: self._error_response(err, model),
            headers={"x-request-id": "req_" + secrets.token_hex(16)},
        )

    def prompt_parts(self, body: dict[str, Any]) -> list[Any]:
        return [body.get("instructions"), body.get("input"), body.get("tools")]

    def cached_usage(self, body: dict[str, Any], output_text: str) -> Usage:
        """The Chat Completions fake's prefix-cache meter, over this API's prompt fields
        (model, tools, then instructions and input: the order the prefix is cached in)."""
        view = {
            "model": body.get("model"),
            "tools": body.get("tools"),
            "messages": [body.get("instructions"), body.get("input")],
            "prompt_cache_key": body.get("prompt_cache_key"),
        }
        return super().cached_usage(view, output_text)

    # -- validation -----------------------------------------------------------------

    def check_request(self, body: Any) -> dict[str, Any] | None:
        """Structural checks the real API also makes; an error body or None.

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
            return invalid("Missing required parameter: 'model'.", "model")
        for position, tool in enumerate(body.get("tools") or []):
            if not isinstance(tool, dict) or not tool.get("type"):
                return invalid(
                    f"Missing required parameter: 'tools[{position}].type'.",
                    f"tools[{position}].type",
                )
            if tool["type"] == "function" and not tool.get("name"):
                return invalid(
                    f"Missing required parameter: 'tools[{position}].name'.",
                    f"tools[{position}].name",
                )
        items = body.get("input")
        if isinstance(items, list):
            return _check_items(items, body, invalid)
        return None


def _check_items(items: list[Any], body: dict[str, Any], invalid: Any) -> dict[str, Any] | None:
    """Reasoning items must come back sealed and intact; every function call is answered
    by an output, and every output answers an earlier call."""
    stateless = body.get("store") is False
    model = body.get("model")
    calls: list[str] = []
    answered: set[str] = set()
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            return invalid(f"Invalid type for 'input[{position}]'.", f"input[{position}]")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "reasoning":
            item_id = item.get("id", "")
            token = item.get("encrypted_content")
            if not token:
                if stateless:
                    return invalid(
                        f"Item with id '{item_id}' not found. Items are not persisted when "
                        "`store` is set to false. Try again with `store` set to true, or "
                        "remove this item from your input.",
                        "input",
                    )
                continue
            sealed = open_seal(token)
            if sealed is None or sealed.get("id") != item_id or sealed.get("model") != model:
                return invalid(
                    f"The encrypted content for item {item_id} could not be verified.",
                    "input",
                )
        elif kind == "function_call":
            calls.append(item.get("call_id", ""))
        elif kind == "function_call_output":
            call_id = item.get("call_id", "")
            if call_id not in calls:
                return invalid(
                    f"No tool call found for function call output with call_id {call_id}.",
                    "input",
                )
            answered.add(call_id)
    for call_id in calls:
        if call_id not in answered:
            return invalid(f"No tool output found for function call {call_id}.", "input")
    return None


class ResponsesRenderer:
    """Renders one reply as Responses stream events or one Response object."""

    def __init__(self, fake: OpenAIResponsesFake, request: RecordedRequest, reply: Reply) -> None:
        body = request.body if isinstance(request.body, dict) else {}
        self.fake = fake
        self.reply = reply
        self.body = body
        self.id = "resp_" + secrets.token_hex(24)
        self.created_at = int(time.time())
        self.model = body.get("model", "")
        self.sealed = ENCRYPTED_REASONING in (body.get("include") or [])
        self.usage: ResolvedUsage = fake.resolve_usage(request, reply)
        self.items: list[dict[str, Any]] = []
        self._open: int | None = None
        self._sequence = 0

    # -- stream ---------------------------------------------------------------------

    def start_events(self) -> list[Event]:
        skeleton = self._response("in_progress", output=[], usage=None)
        return [
            self._event("response.created", response=skeleton),
            self._event("response.in_progress", response=skeleton),
        ]

    def step_events(self, step: Step) -> list[Event]:
        if isinstance(step, Text):
            return self._text(step.text)
        if isinstance(step, Reasoning):
            return self._reasoning(step.text)
        if isinstance(step, RedactedThinking):
            # No summary, only the encrypted reasoning: what the API sends when the model
            # reasoned but produced no summary.
            events = self._open_item({"type": "reasoning", "summary": []}, "rs_", fresh=True)
            return events + self._close_open()
        if isinstance(step, ToolCall):
            return self._tool_call(step)
        return []

    def error_events(self, step: ErrorEvent) -> list[Event]:
        status, body = self.fake._error_for(
            HttpError(None, kind=step.kind, message=step.message), self.model
        )
        error = body["error"]
        if self.fake.failed_events:
            code = _FAILED_CODES.get(step.kind, DEFAULT_FAILED_CODE)
            failed = self._response("failed", output=self.items, usage=None)
            failed["error"] = {"code": code, "message": error["message"]}
            return [self._event("response.failed", response=failed)]
        del status
        return [
            self._event(
                "error",
                code=error.get("code") or error.get("type"),
                message=error["message"],
                param=error.get("param"),
            )
        ]

    def finish_events(self) -> list[Event]:
        events = self._close_open()
        status = self.status
        name = "response.incomplete" if status == "incomplete" else "response.completed"
        events.append(self._event(name, response=self.message()))
        return events

    # -- whole response -------------------------------------------------------------

    @property
    def status(self) -> str:
        return "incomplete" if self.reply.stop == STOP_MAX_TOKENS else "completed"

    def message(self) -> dict[str, Any]:
        self._close_open()
        response = self._response(self.status, output=self.items, usage=usage_object(self.usage))
        if self.status == "incomplete":
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        return response

    def _response(
        self, status: str, *, output: list[dict[str, Any]], usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        body = self.body
        reasoning = body.get("reasoning") or {}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": self.model,
            "output": [_public(item) for item in output],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {
                "effort": reasoning.get("effort"),
                "summary": reasoning.get("summary"),
            },
            "store": body.get("store", True),
            "temperature": body.get("temperature", 1.0),
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "metadata": {},
        }

    # -- items ----------------------------------------------------------------------

    def _text(self, value: str) -> list[Event]:
        start = {"type": "message", "status": "in_progress", "role": "assistant", "content": []}
        events = self._open_item(start, "msg_")
        index = len(self.items) - 1
        item = self.items[index]
        if not item["content"]:
            part = {"type": "output_text", "text": "", "annotations": []}
            item["content"].append(part)
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=dict(part),
                )
            )
        item["content"][0]["text"] += value
        for piece in pieces(value):
            events.append(
                self._event(
                    "response.output_text.delta",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    delta=piece,
                    logprobs=[],
                )
            )
        return events

    def _reasoning(self, value: str) -> list[Event]:
        events = self._open_item({"type": "reasoning", "summary": []}, "rs_")
        index = len(self.items) - 1
        item = self.items[index]
        events.extend(self._close_summary_part(index))
        summary_index = len(item["summary"])
        item["summary"].append({"type": "summary_text", "text": value})
        item["_part_open"] = True
        events.append(
            self._event(
                "response.reasoning_summary_part.added",
                item_id=item["id"],
                output_index=index,
                summary_index=summary_index,
                part={"type": "summary_text", "text": ""},
            )
        )
        for piece in pieces(value):
            events.append(
                self._event(
                    "response.reasoning_summary_text.delta",
                    item_id=item["id"],
                    output_index=index,
                    summary_index=summary_index,
                    delta=piece,
                )
            )
        return events

    def _tool_call(self, step: ToolCall) -> list[Event]:
        call_id = step.id or "call_" + secrets.token_hex(12)
        arguments = tool_arguments_text(step)
        start = {
            "type": "function_call",
            "status": "in_progress",
            "arguments": "",
            "call_id": call_id,
            "name": step.name,
        }
        events = self._open_item(start, "fc_", fresh=True)
        index = len(self.items) - 1
        item = self.items[index]
        for fragment in fragments(arguments):
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=fragment,
                )
            )
        item["arguments"] = arguments
        events.append(
            self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=arguments,
            )
        )
        return events + self._close_open()

    def _open_item(self, start: dict[str, Any], prefix: str, *, fresh: bool = False) -> list[Event]:
        """Continue the open item of the same type, or close it and start a new one."""
        if not fresh and self._open is not None and self.items[self._open]["type"] == start["type"]:
            return []
        events = self._close_open()
        item = {"id": prefix + secrets.token_hex(24), **start}
        self.items.append(item)
        self._open = len(self.items) - 1
        events.append(
            self._event("response.output_item.added", output_index=self._open, item=_public(item))
        )
        return events

    def _close_summary_part(self, index: int) -> list[Event]:
        item = self.items[index]
        if not item.pop("_part_open", False):
            return []
        summary_index = len(item["summary"]) - 1
        text = item["summary"][summary_index]["text"]
        return [
            self._event(
                "response.reasoning_summary_text.done",
                item_id=item["id"],
                output_index=index,
                summary_index=summary_index,
                text=text,
            ),
            self._event(
                "response.reasoning_summary_part.done",
                item_id=item["id"],
                output_index=index,
                summary_index=summary_index,
                part={"type": "summary_text", "text": text},
            ),
        ]

    def _close_open(self) -> list[Event]:
        if self._open is None:
            return []
        index, self._open = self._open, None
        item = self.items[index]
        events: list[Event] = []
        kind = item["type"]
        if kind == "message" and item["content"]:
            part = item["content"][0]
            events.append(
                self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                )
            )
            events.append(
                self._event(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=dict(part),
                )
            )
        elif kind == "reasoning":
            events.extend(self._close_summary_part(index))
            if self.sealed:
                item["encrypted_content"] = seal_reasoning(item["id"], self.model)
        if kind != "reasoning":
            item["status"] = "completed"
        events.append(
            self._event(
                "response.output_item.done",
                output_index=index,
                item=_public(item),
            )
        )
        return events

    def _event(self, name: str, **fields: Any) -> Event:
        payload = {"type": name, **fields, "sequence_number": self._sequence}
        self._sequence += 1
        return (name, payload)


def _public(item: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of an item without the renderer's own bookkeeping keys."""
    return json.loads(json.dumps({k: v for k, v in item.items() if not k.startswith("_")}))


def usage_object(usage: ResolvedUsage) -> dict[str, Any]:
    """Responses usage: `input_tokens` includes the cached (and cache-written) tokens, and
    `output_tokens` includes the reasoning tokens; the details are breakdowns."""
    prompt = usage.input + usage.cache_read + usage.cache_write
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": usage.cache_read,
            "cache_write_tokens": usage.cache_write,
        },
        "output_tokens": usage.output,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning or 0},
        "total_tokens": prompt + usage.output,
    }


def last_user_text(items: Any) -> str:
    """Text of the last user message, or of the tool output that came after it."""
    if isinstance(items, str):
        return items
    for item in reversed(items if isinstance(items, list) else []):
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call_output":
            output = item.get("output")
            if isinstance(output, str):
                return output
            return "".join(
                part.get("text", "")
                for part in output or []
                if isinstance(part, dict) and part.get("type") == "input_text"
            )
        if item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            return "".join(
                part.get("text", "")
                for part in content or []
                if isinstance(part, dict) and part.get("type") == "input_text"
            )
    return ""
