"""OpenAI Responses API (`POST {base}/responses`): native OpenAI models.

Chat Completions rejects function tools combined with any `reasoning_effort` other than
`none` on GPT-5.6+ ("use /v1/responses"), which pinned reasoning OFF for native OpenAI
models. This is the Responses path (seed 000): reasoning and tools at real effort levels,
streamed reasoning summaries, and chain-of-thought continuity across tool round-trips via
`store: false` + `include: ["reasoning.encrypted_content"]`: nothing is retained
server-side, the encrypted reasoning travels with our own transcript instead.

Context → wire request (`build_request`): the system prompt becomes `instructions`, the
dialogue becomes `input` items (messages, `function_call`, `function_call_output`). The
reply → canonical shapes (`ResponsesStreamParser` for `stream: true`, `parse_response` for
one Response object).

Reasoning continuity: reasoning items (id, summary, `encrypted_content`) are kept exactly
as received in the turn's `extras["_openai"] = {"model": <bare model>, "items": [...]}` and
put back, ahead of that assistant turn's message and function calls, only when the same
model sees the history again: the encrypted content is model-bound, and another model gets
the plain transcript.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from .. import errors
from ..cache_policy import cache_request_fields
from ..cache_spec import get_cache_spec
from ..context import build_context, content_parts, content_text, parse_data_url
from ..reasoning import OFF, effort_from
from ..registry import ProviderDescriptor
from ..types import (
    AssistantTurn,
    Context,
    ModelCapabilities,
    StreamChunk,
    TokenUsage,
    ToolCall,
)
from ._http_client import HttpProviderClient, Prepared
from .openai_completions import auth_headers, parse_tool_arguments

logger = logging.getLogger(__name__)

RESPONSES_PATH = "/responses"
SIDECAR = "_openai"
# Without this, reasoning items come back without `encrypted_content`, and with
# `store: false` an item sent back by id alone is refused ("Items are not persisted when
# `store` is set to false"): the encrypted blob is the only way to continue the reasoning.
ENCRYPTED_REASONING = "reasoning.encrypted_content"
# "auto" is the most detailed summarizer the model offers (the reasoning guide's advice).
REASONING_SUMMARY = "auto"
# `detail` is required on an input_image; "auto" is the API's own default.
DEFAULT_IMAGE_DETAIL = "auto"
# A tool without a schema still needs one.
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
# Responses reports `status`, not a finish reason. The turn uses the Chat Completions
# vocabulary ("stop", "tool_calls", "length"), so the `openai` provider moving from
# Completions to Responses changes nothing for code that reads `finish_reason`.
_INCOMPLETE_REASONS = {"max_output_tokens": "length"}
# Joins the parts of a reasoning summary (the API streams each part as its own paragraph).
SUMMARY_JOINER = "\n\n"


# --- usage ---------------------------------------------------------------------------------

_RESPONSES_USAGE_FIELDS = frozenset({"input_tokens", "output_tokens"})


def _int(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def usage_from_responses(usage: Mapping[str, Any] | None) -> TokenUsage | None:
    """Map a Responses `usage` object into non-overlapping buckets.

    `input_tokens` INCLUDES `input_tokens_details.cached_tokens` (cache reads) and, where
    reported, `input_tokens_details.cache_write_tokens`: fresh input is what is left after
    both. `output_tokens` already includes `output_tokens_details.reasoning_tokens` (a
    breakdown, not an addition): counted once. None when no usage was reported.
    """
    if not isinstance(usage, Mapping) or not _RESPONSES_USAGE_FIELDS.intersection(usage):
        return None
    details = usage.get("input_tokens_details")
    if not isinstance(details, Mapping):
        details = {}
    cached = _int(details.get("cached_tokens"))
    written = _int(details.get("cache_write_tokens"))
    return TokenUsage(
        input=max(0, _int(usage.get("input_tokens")) - cached - written),
        output=_int(usage.get("output_tokens")),
        cache_read=cached,
        cache_write=written,
    )


# --- Context → request -------------------------------------------------------------------


def _has_text(text: Any) -> bool:
    return isinstance(text, str) and bool(text)


def _file_data(file: Mapping[str, Any]) -> str | None:
    """A PDF as the data URL `input_file.file_data` takes; a bare base64 string is wrapped."""
    data = file.get("file_data") or ""
    if not data:
        return None
    if parse_data_url(data) is not None:
        return data
    return f"data:application/pdf;base64,{data}"


def _input_part(part: Mapping[str, Any]) -> dict[str, Any] | None:
    """One canonical user/tool content part → an input_text / input_image / input_file."""
    kind = part.get("type")
    if kind == "text":
        return {"type": "input_text", "text": part["text"]} if _has_text(part.get("text")) else None
    if kind == "image_url":
        image = part.get("image_url") or {}
        url = image.get("url") if isinstance(image, Mapping) else image
        if not url:
            return None
        detail = image.get("detail") if isinstance(image, Mapping) else None
        return {"type": "input_image", "image_url": url, "detail": detail or DEFAULT_IMAGE_DETAIL}
    if kind == "file":
        file = part.get("file") or {}
        data = _file_data(file)
        if data is None:
            return None
        out: dict[str, Any] = {"type": "input_file"}
        if file.get("filename"):
            out["filename"] = file["filename"]
        out["file_data"] = data
        return out
    return None


def _input_parts(content: Any) -> list[dict[str, Any]]:
    return [p for p in (_input_part(part) for part in content_parts(content)) if p is not None]


def _sidecar(message: Mapping[str, Any], model: str) -> Mapping[str, Any] | None:
    sidecar = (message.get("extras") or {}).get(SIDECAR)
    if not isinstance(sidecar, Mapping) or sidecar.get("model") != model:
        return None
    return sidecar


def _arguments_json(call: Mapping[str, Any]) -> str:
    arguments = call.get("arguments")
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments or {}, ensure_ascii=False, separators=(",", ":"))


def _assistant_items(
    message: Mapping[str, Any], *, model: str, ordinal: int
) -> list[dict[str, Any]]:
    """Reasoning items (same model only), then the message, then its function calls.

    The output message needs an id on the wire. The one the API gave is kept in the
    sidecar; otherwise (another model's turn, an old transcript) a deterministic `msg_<n>`
    stands in, so the request prefix stays byte-stable across turns for prompt caching.
    """
    sidecar = _sidecar(message, model)
    items: list[dict[str, Any]] = []
    if sidecar is not None:
        items.extend(dict(item) for item in sidecar.get("items") or [] if isinstance(item, Mapping))
    text = content_text(message.get("content"))
    if text:
        known = (sidecar or {}).get("message")
        known = known if isinstance(known, Mapping) else {}
        wire: dict[str, Any] = {
            "type": "message",
            "role": "assistant",
            "id": known.get("id") or f"msg_{ordinal}",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        if known.get("phase"):
            wire["phase"] = known["phase"]
        items.append(wire)
    for call in message.get("tool_calls") or []:
        items.append(
            {
                "type": "function_call",
                "call_id": call["id"],
                "name": call["name"],
                "arguments": _arguments_json(call),
            }
        )
    return items


def _tool_output(content: Any) -> str | list[dict[str, Any]]:
    """Text stays a string (what every model reads); images or files make it a part list."""
    if isinstance(content, str):
        return content
    parts = content_parts(content)
    if all(part.get("type") == "text" for part in parts):
        return content_text(content)
    return _input_parts(content)


def _build_input(ctx: Context, *, model: str) -> list[dict[str, Any]]:
    """Canonical dialogue → Responses `input` items (system excluded)."""
    items: list[dict[str, Any]] = []
    assistants = 0
    for message in ctx.messages:
        role = message.get("role")
        if role == "user":
            parts = _input_parts(message.get("content"))
            if parts:
                items.append({"type": "message", "role": "user", "content": parts})
        elif role == "assistant":
            items.extend(_assistant_items(message, model=model, ordinal=assistants))
            assistants += 1
        elif role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id") or "",
                    "output": _tool_output(message.get("content")),
                }
            )
    return items


def _build_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Canonical tools → function tools.

    `strict` is always sent: the Responses API treats a function without it as strict,
    and strict mode demands a schema dialect (every property required, no additional
    properties) that an arbitrary tool schema does not meet. Only a tool that declares
    `strict: true` itself gets it.
    """
    out = []
    for tool in tools:
        wire: dict[str, Any] = {"type": "function", "name": tool["name"]}
        if tool.get("description"):
            wire["description"] = tool["description"]
        wire["parameters"] = tool.get("parameters") or EMPTY_PARAMETERS
        wire["strict"] = tool.get("strict") is True
        out.append(wire)
    return out


def _reasoning_fields(
    settings: Mapping[str, Any], capabilities: ModelCapabilities | None
) -> dict[str, Any]:
    """`reasoning` and `include` for this model and setting (providers/reasoning.py levels).

    Only a model known to reason (`capabilities.reasoning is True`) gets either: the
    others refuse `reasoning.effort` with a 400, as in the Chat Completions mapping.
    - low/medium/high → `{"effort": <level>, "summary": "auto"}` (summaries are what
      the UI shows as reasoning).
    - not set → `{"summary": "auto"}`: the model reasons at its own default effort, and
      the summary is still wanted.
    - "off" → no `reasoning` field. Not "none": models before gpt-5.1 refuse "none"
      with a 400, and gpt-5.1+ already default to no reasoning when the field is absent.
    Encrypted reasoning is requested in every case, so a tool round-trip can always
    continue the chain of thought (a pre-5.1 model reasons even when asked not to).
    """
    if capabilities is None or capabilities.reasoning is not True:
        return {}
    level = effort_from(settings)
    out: dict[str, Any] = {}
    if level is None:
        out["reasoning"] = {"summary": REASONING_SUMMARY}
    elif level != OFF:
        out["reasoning"] = {"effort": level, "summary": REASONING_SUMMARY}
    out["include"] = [ENCRYPTED_REASONING]
    return out


def _cache_fields(settings: Mapping[str, Any], descriptor: ProviderDescriptor) -> dict[str, Any]:
    """Automatic prompt caching: the session's `settings["cache_key"]` under the field the
    provider's `cache.json` names (`prompt_cache_key` for OpenAI), as in Chat Completions."""
    return cache_request_fields(get_cache_spec(descriptor.name), settings)


def build_request(
    ctx: Context,
    *,
    model: str,
    descriptor: ProviderDescriptor,
    stream: bool,
    settings: Mapping[str, Any],
    capabilities: ModelCapabilities | None = None,
) -> dict[str, Any]:
    """The JSON body for `POST /responses`. Key order is stable (byte-stable prefix).

    `store` is always false: the transcript is ours, and nothing is kept server-side.
    `temperature` is sent only to a model known not to reason: reasoning models refuse it.
    """
    body: dict[str, Any] = {"model": model}
    if ctx.system_prompt:
        body["instructions"] = ctx.system_prompt
    body["input"] = _build_input(ctx, model=model)
    if ctx.tools:
        body["tools"] = _build_tools(ctx.tools)
    body.update(_reasoning_fields(settings, capabilities))
    if settings.get("max_tokens"):
        body["max_output_tokens"] = int(settings["max_tokens"])
    reasons = capabilities.reasoning if capabilities is not None else None
    if settings.get("temperature") is not None and reasons is False:
        body["temperature"] = settings["temperature"]
    body.update(_cache_fields(settings, descriptor))
    body["store"] = False
    if stream:
        body["stream"] = True
    return body


# --- Reply → canonical --------------------------------------------------------------------


def _clean(item: Mapping[str, Any]) -> dict[str, Any]:
    """An output item as an input item: nulls dropped (the input types refuse them)."""
    return {key: value for key, value in item.items() if value is not None}


def _message_text(item: Mapping[str, Any]) -> str:
    parts = []
    for part in item.get("content") or []:
        if not isinstance(part, Mapping):
            continue
        if part.get("type") == "output_text":
            parts.append(str(part.get("text") or ""))
        elif part.get("type") == "refusal":
            parts.append(str(part.get("refusal") or ""))
    return "".join(parts)


def _reasoning_text(item: Mapping[str, Any]) -> str:
    """The summary parts; raw `content` text (open-weight servers) when there is no summary."""
    summary = [
        str(part.get("text") or "")
        for part in item.get("summary") or []
        if isinstance(part, Mapping) and part.get("text")
    ]
    if summary:
        return SUMMARY_JOINER.join(summary)
    return "".join(
        str(part.get("text") or "")
        for part in item.get("content") or []
        if isinstance(part, Mapping) and part.get("type") == "reasoning_text"
    )


def _tool_call(item: Mapping[str, Any], raw: str | None) -> ToolCall:
    call_id = item.get("call_id") or item.get("id") or ""
    name = item.get("name") or ""
    arguments, error = parse_tool_arguments(raw)
    if error:
        return ToolCall(id=call_id, name=name, arguments={}, raw_arguments=raw, error=error)
    return ToolCall(id=call_id, name=name, arguments=arguments)


def _finish_reason(status: str | None, incomplete: Any, has_calls: bool) -> str | None:
    if status == "incomplete":
        reason = incomplete.get("reason") if isinstance(incomplete, Mapping) else None
        return _INCOMPLETE_REASONS.get(reason or "", reason or "incomplete")
    if status == "completed":
        return "tool_calls" if has_calls else "stop"
    return None


def _assemble(
    items: list[Mapping[str, Any]],
    *,
    model: str,
    status: str | None,
    incomplete: Any,
    usage: Mapping[str, Any] | None,
    raw: Any,
) -> AssistantTurn:
    """Ordered output items → AssistantTurn (shared by the stream and the Response).

    Only reasoning items that carry `encrypted_content` go into the sidecar: with
    `store: false` an item without it cannot be sent back (the API no longer has it).
    """
    text: list[str] = []
    reasoning: list[str] = []
    kept: list[dict[str, Any]] = []
    calls: list[ToolCall] = []
    message: dict[str, Any] = {}
    for item in items:
        kind = item.get("type")
        if kind == "message":
            text.append(_message_text(item))
            if not message and item.get("id"):
                message = {"id": item["id"]}
                if item.get("phase"):
                    message["phase"] = item["phase"]
        elif kind == "reasoning":
            summary = _reasoning_text(item)
            if summary:
                reasoning.append(summary)
            if item.get("encrypted_content"):
                kept.append(_clean(item))
        elif kind == "function_call":
            calls.append(_tool_call(item, item.get("arguments")))
    extras: dict[str, Any] = {}
    if kept or message:
        sidecar: dict[str, Any] = {"model": model, "items": kept}
        if message:
            sidecar["message"] = message
        extras[SIDECAR] = sidecar
    return AssistantTurn(
        text="".join(text) or None,
        tool_calls=calls,
        finish_reason=_finish_reason(status, incomplete, bool(calls)),
        raw=raw,
        reasoning=SUMMARY_JOINER.join(reasoning) or None,
        extras=extras,
        usage=usage_from_responses(usage),
    )


def _failure(response: Mapping[str, Any], *, model: str, partial: AssistantTurn) -> Exception:
    """`response.failed` (or a failed Response object) → the matching ProviderError."""
    error = response.get("error")
    if isinstance(error, Mapping) and error:
        return errors.error_from_event({"error": dict(error)}, model=model, partial=partial)
    return errors.StreamError(f"the response from {model} failed", model=model, partial=partial)


# Events that repeat what other events carry (`*.done` closes what the deltas built,
# `*.added` opens what the item events track): skipped without a debug line.
_QUIET_SUFFIXES = (".done", ".added", ".in_progress")


class ResponsesStreamParser:
    """Accumulates Responses stream events into deltas and one final turn.

    `feed(event)` returns the StreamChunks that event produced; `done` turns True at
    `response.completed` or `response.incomplete`; `finish()` builds the AssistantTurn, or
    raises StreamError (carrying the partial turn) when the stream ended before either.
    `response.failed` and the `error` event raise the matching ProviderError at once.

    Output items are tracked by `output_index`. The item in `response.output_item.done`
    replaces the streamed one: it is authoritative, and it alone is guaranteed to carry the
    complete `encrypted_content`. Tool-call deltas are numbered by call ordinal.
    """

    def __init__(self, *, model: str) -> None:
        self.model = model
        self.done = False
        self._items: dict[int, dict[str, Any]] = {}
        self._text: dict[int, list[str]] = {}
        self._summary: dict[int, dict[int, list[str]]] = {}
        self._arguments: dict[int, list[str]] = {}
        self._ordinals: dict[int, int] = {}
        self._last_summary: tuple[int, int] | None = None
        self._response: dict[str, Any] = {}
        self._raw: dict[str, Any] = {}

    def feed(self, event: Any) -> list[StreamChunk]:
        if self.done or not (event.data or "").strip():
            return []
        try:
            payload = json.loads(event.data)
        except ValueError:
            raise self._stream_error(f"malformed stream event from {self.model}") from None
        if not isinstance(payload, Mapping):
            return []
        kind = str(payload.get("type") or event.event or "")
        if kind == "error":
            raise errors.error_from_event(
                dict(payload), model=self.model, partial=self.partial_turn()
            )
        handler = getattr(self, "_on_" + kind.replace(".", "_"), None)
        if handler is None:
            if not kind.endswith(_QUIET_SUFFIXES):
                logger.debug("responses: skipped a stream event of type %r", kind)
            return []
        return handler(payload)

    # -- lifecycle ----------------------------------------------------------------------

    def _on_response_created(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        response = payload.get("response") or {}
        self._raw = {k: response[k] for k in ("id", "model") if response.get(k)}
        return []

    def _on_response_completed(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        self._response = dict(payload.get("response") or {})
        self.done = True
        return []

    _on_response_incomplete = _on_response_completed

    def _on_response_failed(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        raise _failure(payload.get("response") or {}, model=self.model, partial=self.partial_turn())

    # -- items --------------------------------------------------------------------------

    def _on_response_output_item_added(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        index = int(payload.get("output_index", len(self._items)))
        item = dict(payload.get("item") or {})
        self._items[index] = item
        if item.get("type") != "function_call":
            return []
        ordinal = len(self._ordinals)
        self._ordinals[index] = ordinal
        initial = item.get("arguments") or ""
        self._arguments[index] = [initial] if initial else []
        delta = {"index": ordinal, "id": item.get("call_id"), "name": item.get("name")}
        return [StreamChunk(tool_call_delta={**delta, "arguments": initial})]

    def _on_response_output_item_done(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        index = int(payload.get("output_index", 0))
        item = payload.get("item")
        if isinstance(item, Mapping):
            self._items[index] = dict(item)
        return []

    def _on_response_output_text_delta(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        delta = str(payload.get("delta") or "")
        if not delta:
            return []
        self._text.setdefault(int(payload.get("output_index", 0)), []).append(delta)
        return [StreamChunk(text=delta)]

    _on_response_refusal_delta = _on_response_output_text_delta

    def _on_response_reasoning_summary_text_delta(
        self, payload: Mapping[str, Any]
    ) -> list[StreamChunk]:
        delta = str(payload.get("delta") or "")
        if not delta:
            return []
        key = (int(payload.get("output_index", 0)), int(payload.get("summary_index", 0)))
        parts = self._summary.setdefault(key[0], {})
        # A new summary part (or a new reasoning item) is a new paragraph on screen too.
        if self._last_summary is not None and self._last_summary != key:
            delta_out = SUMMARY_JOINER + delta
        else:
            delta_out = delta
        self._last_summary = key
        parts.setdefault(key[1], []).append(delta)
        return [StreamChunk(reasoning=delta_out)]

    def _on_response_reasoning_text_delta(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        """Raw reasoning text (gpt-oss behind Responses-compatible servers)."""
        delta = str(payload.get("delta") or "")
        return [StreamChunk(reasoning=delta)] if delta else []

    def _on_response_function_call_arguments_delta(
        self, payload: Mapping[str, Any]
    ) -> list[StreamChunk]:
        index = int(payload.get("output_index", 0))
        ordinal = self._ordinals.get(index)
        if ordinal is None:
            raise self._stream_error(f"function call arguments for unknown item {index}")
        fragment = str(payload.get("delta") or "")
        self._arguments[index].append(fragment)
        return [
            StreamChunk(
                tool_call_delta={"index": ordinal, "id": None, "name": None, "arguments": fragment}
            )
        ]

    def _on_response_function_call_arguments_done(
        self, payload: Mapping[str, Any]
    ) -> list[StreamChunk]:
        index = int(payload.get("output_index", 0))
        item = self._items.get(index)
        if item is not None and isinstance(payload.get("arguments"), str):
            item["arguments"] = payload["arguments"]
        return []

    # -- result -------------------------------------------------------------------------

    def _streamed_items(self) -> list[dict[str, Any]]:
        """The items as far as they got, with streamed text/summary/arguments filled in
        where the item itself does not carry them yet (no `.done` seen)."""
        out = []
        for index in sorted(self._items):
            item = dict(self._items[index])
            kind = item.get("type")
            if kind == "message" and not _message_text(item) and index in self._text:
                item["content"] = [
                    {"type": "output_text", "text": "".join(self._text[index]), "annotations": []}
                ]
            elif kind == "reasoning" and not item.get("summary") and index in self._summary:
                parts = self._summary[index]
                item["summary"] = [
                    {"type": "summary_text", "text": "".join(parts[i])} for i in sorted(parts)
                ]
            elif kind == "function_call" and not item.get("arguments"):
                item["arguments"] = "".join(self._arguments.get(index, []))
            out.append(item)
        return out

    def partial_turn(self) -> AssistantTurn:
        response = self._response
        output = response.get("output")
        items = (
            [dict(i) for i in output if isinstance(i, Mapping)]
            if isinstance(output, list) and output
            else self._streamed_items()
        )
        return _assemble(
            items,
            model=self.model,
            status=response.get("status") if response else None,
            incomplete=response.get("incomplete_details"),
            usage=response.get("usage"),
            raw=self._raw or None,
        )

    def finish(self) -> AssistantTurn:
        if not self.done:
            raise self._stream_error(
                f"the stream from {self.model} ended before response.completed"
            )
        turn = self.partial_turn()
        if turn.finish_reason is None:  # a terminal event without a status
            turn.finish_reason = "tool_calls" if turn.tool_calls else "stop"
        return turn

    def _stream_error(self, message: str) -> errors.StreamError:
        return errors.StreamError(message, model=self.model, partial=self.partial_turn())


def parse_response(payload: Mapping[str, Any], *, model: str) -> AssistantTurn:
    """A non-streamed Response object → AssistantTurn (a failed Response raises)."""
    if payload.get("status") == "failed" or (payload.get("error") and not payload.get("output")):
        empty = AssistantTurn()
        raise _failure(payload, model=model, partial=empty)
    items = [dict(i) for i in payload.get("output") or [] if isinstance(i, Mapping)]
    return _assemble(
        items,
        model=model,
        status=payload.get("status") or "completed",
        incomplete=payload.get("incomplete_details"),
        usage=payload.get("usage"),
        raw=dict(payload),
    )


# --- The client ---------------------------------------------------------------------------


class OpenAIResponsesClient(HttpProviderClient):
    """A `ProviderClient` for the Responses API. Receives BARE model names (the router
    strips the prefix). Owns `transport`: `close()` closes it."""

    @property
    def url(self) -> str:
        return self.base_url + RESPONSES_PATH

    def _prepare(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        settings: Mapping[str, Any],
        *,
        stream: bool,
    ) -> Prepared:
        headers = auth_headers(self.descriptor, self._api_key)
        body = build_request(
            build_context(messages, tools),
            model=model,
            descriptor=self.descriptor,
            stream=stream,
            settings=settings,
            capabilities=self._capabilities(model),
        )
        return self.url, headers, body

    def _parse(self, payload: dict[str, Any], *, model: str) -> AssistantTurn:
        return parse_response(payload, model=model)

    def _stream_parser(self, model: str) -> ResponsesStreamParser:
        return ResponsesStreamParser(model=model)
