"""Amazon Bedrock Converse (`POST {base}/model/{modelId}/converse`) and ConverseStream
(`POST {base}/model/{modelId}/converse-stream`).

Context → wire request (`build_request`), and the reply → canonical shapes
(`ConverseStreamParser` for the binary event stream, `parse_response` for one object).
Field names follow the bedrock-runtime service model (2023-09-30), the same file botocore
ships: `system: [{text}]`, `messages[].content[]` union blocks (`text`, `image`,
`document`, `toolUse`, `toolResult`, `reasoningContent`, `cachePoint`), `toolConfig`,
`inferenceConfig`, `additionalModelRequestFields`. Blob fields (image and document bytes,
`redactedContent`) travel as base64 strings in this JSON protocol.

Credentials (the provider profile): a Bedrock API key (`api_key`) is sent as
`Authorization: Bearer`; otherwise `access_key_id` + `secret_access_key` (+
`session_token`) sign every request with SigV4 (service `bedrock`, the profile's
`region`). The signed bytes are `encode_body(body)`, the transport's own serializer.

Reasoning continuity: reasoningContent blocks (`reasoningText {text, signature}` or
`redactedContent`) are kept as received in `extras["_bedrock"] = {"model": <bare model>,
"blocks": [...]}` and replayed first in the assistant message only to the same model:
signatures are model-bound.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any
from urllib.parse import quote, urlsplit

from .. import errors, reasoning
from ..aws_sigv4 import AwsCredentials, sign
from ..cancel import CancelToken
from ..context import build_context, content_parts, parse_data_url
from ..eventstream import EventStreamDecoder, EventStreamMessage
from ..registry import ProviderDescriptor
from ..transport import encode_body
from ..types import AssistantTurn, Context, ModelCapabilities, StreamChunk, TokenUsage, ToolCall
from ._http_client import HttpProviderClient, Prepared, aclose_iterator
from .openai_completions import parse_tool_arguments

logger = logging.getLogger(__name__)

CONVERSE_PATH = "/model/{model}/converse"
CONVERSE_STREAM_PATH = "/model/{model}/converse-stream"
SIGNING_SERVICE = "bedrock"  # the service model's `signingName` (not `bedrock-runtime`)
EVENTSTREAM_CONTENT_TYPE = "application/vnd.amazon.eventstream"
SIDECAR = "_bedrock"
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
# The ImageFormat enum of the service model, keyed by the media type a data URL names.
IMAGE_FORMATS = {
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/jpg": "jpeg",
    "image/gif": "gif",
    "image/webp": "webp",
}
# Converse takes images as bytes or S3 locations only; a web URL is described instead.
REMOTE_IMAGE_PLACEHOLDER = "[image at {url}: not sent, Bedrock accepts inline images only]"
# A toolResult needs at least one content block and the API refuses blank text.
EMPTY_TOOL_RESULT = "(no output)"
# DocumentBlock.name may hold only alphanumerics, single spaces, hyphens, parentheses and
# square brackets (service model); anything else becomes a hyphen.
_DOCUMENT_NAME_BAD = re.compile(r"[^A-Za-z0-9\s\-()\[\]]+")
_DOCUMENT_NAME_SPACES = re.compile(r"\s+")
DEFAULT_DOCUMENT_NAME = "document"
# The cap thinking is fitted under when neither the caller nor the model gives one (the
# Anthropic client's default: every current Claude model accepts 8192).
DEFAULT_THINKING_MAX_TOKENS = 8192
CACHE_POINT = {"cachePoint": {"type": "default"}}
# Exception events inside a 200 stream (`:exception-type`) → the error they mean.
_STREAM_EXCEPTIONS: dict[str, type[errors.ProviderError]] = {
    "throttlingException": errors.RateLimitError,
    "serviceUnavailableException": errors.OverloadedError,
    "internalServerException": errors.StreamError,
    "modelStreamErrorException": errors.StreamError,
    "validationException": errors.BadRequestError,
}
# Bedrock says who is at fault in the message text (and the x-amzn-errortype header, which
# the shared error translation does not read): these phrases refine an HTTP error.
_AUTH_PHRASES = (
    "security token included in the request is",
    "request signature we calculated does not match",
    "missing authentication token",
    "invalid api key",
    "bearer token",
)
_NO_ACCESS_PHRASES = (
    "don't have access to the model",
    "provided model identifier is invalid",
    "could not resolve the foundation model",
    "model identifier is invalid",
)
_QUOTA_PHRASES = ("too many tokens per day",)


# --- Context → request -------------------------------------------------------------------


def _has_text(text: Any) -> bool:
    """The API refuses text blocks that are empty or only whitespace."""
    return isinstance(text, str) and bool(text.strip())


def _with_cache_point(blocks: list[dict[str, Any]], part: Mapping[str, Any]) -> None:
    """A caller's `cache_control` mark becomes a cachePoint block right after its block
    (Bedrock's breakpoint is a block of its own, not a field on the marked one)."""
    if part.get("cache_control"):
        blocks.append(dict(CACHE_POINT))


def _image_block(url: str) -> dict[str, Any]:
    parsed = parse_data_url(url)
    if parsed is not None and parsed[0].lower() in IMAGE_FORMATS:
        media_type, data = parsed
        return {"image": {"format": IMAGE_FORMATS[media_type.lower()], "source": {"bytes": data}}}
    return {"text": REMOTE_IMAGE_PLACEHOLDER.format(url=url[:200])}


def document_name(filename: str | None, taken: set[str]) -> str:
    """A DocumentBlock name the API accepts, unique within the request."""
    stem = (filename or "").rsplit(".", 1)[0] if "." in (filename or "") else (filename or "")
    name = _DOCUMENT_NAME_SPACES.sub(" ", _DOCUMENT_NAME_BAD.sub("-", stem)).strip()
    name = name or DEFAULT_DOCUMENT_NAME
    candidate, counter = name, 2
    while candidate in taken:
        candidate = f"{name} ({counter})"
        counter += 1
    taken.add(candidate)
    return candidate


def _document_block(file: Mapping[str, Any], names: set[str]) -> dict[str, Any] | None:
    file_data = file.get("file_data") or ""
    parsed = parse_data_url(file_data)
    # A bare base64 string (no data: prefix) is taken to be the PDF itself.
    data = parsed[1] if parsed is not None else file_data
    if not data:
        return None
    return {
        "document": {
            "format": "pdf",
            "name": document_name(file.get("filename"), names),
            "source": {"bytes": data},
        }
    }


def _content_blocks(content: Any, names: set[str]) -> list[dict[str, Any]]:
    """Canonical user/tool content → text, image and document blocks (blank text dropped)."""
    blocks: list[dict[str, Any]] = []
    for part in content_parts(content):
        kind = part.get("type")
        block: dict[str, Any] | None = None
        if kind == "text" and _has_text(part.get("text")):
            block = {"text": part["text"]}
        elif kind == "image_url":
            image = part.get("image_url") or {}
            url = image.get("url") if isinstance(image, Mapping) else image
            block = _image_block(url) if url else None
        elif kind == "file":
            block = _document_block(part.get("file") or {}, names)
        if block is not None:
            blocks.append(block)
            _with_cache_point(blocks, part)
    return blocks


def _sidecar_blocks(message: Mapping[str, Any], model: str) -> list[dict[str, Any]]:
    sidecar = (message.get("extras") or {}).get(SIDECAR)
    if not isinstance(sidecar, Mapping) or sidecar.get("model") != model:
        return []
    return [
        json.loads(json.dumps(block))
        for block in sidecar.get("blocks") or []
        if isinstance(block, Mapping) and "reasoningContent" in block
    ]


def _assistant_blocks(message: Mapping[str, Any], model: str) -> list[dict[str, Any]]:
    blocks = _sidecar_blocks(message, model)
    for part in content_parts(message.get("content")):
        if part.get("type") == "text" and _has_text(part.get("text")):
            blocks.append({"text": part["text"]})
            _with_cache_point(blocks, part)
    for call in message.get("tool_calls") or []:
        arguments = call.get("arguments")
        if isinstance(arguments, str):
            arguments, _ = parse_tool_arguments(arguments)
        blocks.append(
            {"toolUse": {"toolUseId": call["id"], "name": call["name"], "input": arguments or {}}}
        )
    return blocks


def _tool_result_block(message: Mapping[str, Any], names: set[str]) -> dict[str, Any]:
    content = [
        block
        for block in _content_blocks(message.get("content"), names)
        if "cachePoint" not in block
    ]
    result: dict[str, Any] = {
        "toolUseId": message.get("tool_call_id") or "",
        "content": content or [{"text": EMPTY_TOOL_RESULT}],
    }
    # `status` is honoured by Claude and Nova; it is sent only when it says something.
    if message.get("is_error"):
        result["status"] = "error"
    return {"toolResult": result}


def _build_messages(ctx: Context, *, model: str) -> list[dict[str, Any]]:
    """Canonical dialogue → alternating user/assistant messages of content blocks.

    Tool results become toolResult blocks in a user message; consecutive messages landing
    on the same role are merged, because Converse requires the roles to alternate.
    """
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    for message in ctx.messages:
        role = message.get("role")
        if role == "user":
            wire_role, blocks = "user", _content_blocks(message.get("content"), names)
        elif role == "assistant":
            wire_role, blocks = "assistant", _assistant_blocks(message, model)
        elif role == "tool":
            wire_role, blocks = "user", [_tool_result_block(message, names)]
        else:
            continue
        if not blocks:
            continue
        if out and out[-1]["role"] == wire_role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": wire_role, "content": blocks})
    return out


def _build_system(system_prompt: str | None) -> list[dict[str, Any]] | None:
    return [{"text": system_prompt}] if _has_text(system_prompt) else None


def _build_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for tool in tools:
        spec: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description"):
            spec["description"] = tool["description"]
        spec["inputSchema"] = {"json": tool.get("parameters") or EMPTY_SCHEMA}
        out.append({"toolSpec": spec})
        if tool.get("cache_control"):
            out.append(dict(CACHE_POINT))
    return out


def _reasoning_fields(
    settings: Mapping[str, Any],
    capabilities: ModelCapabilities | None,
    max_tokens: int | None,
) -> tuple[int | None, dict[str, Any]]:
    """(maxTokens, additionalModelRequestFields) for the call's `reasoning_effort`.

    Claude on Bedrock takes Anthropic's own thinking fields, passed to the model verbatim
    through `additionalModelRequestFields`; the shape per model comes from the shared
    mapping (`providers.reasoning.anthropic_thinking`), which sends nothing to a model
    whose shape is unknown. Thinking needs a cap to fit under, so `maxTokens` is set when
    thinking is asked for even if the caller gave none.
    """
    if reasoning.effort_from(settings) in (None, reasoning.OFF):
        return max_tokens, {}
    plan = reasoning.anthropic_thinking(
        reasoning.effort_from(settings),
        capabilities,
        max_tokens=max_tokens or DEFAULT_THINKING_MAX_TOKENS,
    )
    fields: dict[str, Any] = {}
    if plan.thinking is not None:
        fields["thinking"] = plan.thinking
    if plan.output_config is not None:
        fields["output_config"] = plan.output_config
    if not fields:
        return max_tokens, {}
    return plan.max_tokens, fields


def _continues_unthought_tool_loop(messages: list[dict[str, Any]]) -> bool:
    """The request answers tool calls of an assistant message whose first block is not
    reasoning (wire messages)."""
    if len(messages) < 2 or messages[-1].get("role") != "user":
        return False
    if not any("toolResult" in block for block in messages[-1].get("content") or []):
        return False
    assistant = messages[-2]
    blocks = assistant.get("content") or []
    return assistant.get("role") == "assistant" and (
        not blocks or "reasoningContent" not in blocks[0]
    )


def build_request(
    ctx: Context,
    *,
    model: str,
    settings: Mapping[str, Any],
    capabilities: ModelCapabilities | None = None,
) -> dict[str, Any]:
    """The JSON body for Converse/ConverseStream (the model id travels in the path).

    Key order is stable, so the serialized prefix is byte-stable between turns.
    """
    body: dict[str, Any] = {"messages": _build_messages(ctx, model=model)}
    system = _build_system(ctx.system_prompt)
    if system is not None:
        body["system"] = system
    max_tokens = settings.get("max_tokens") or (
        capabilities.max_output_tokens if capabilities is not None else None
    )
    requested_max = int(max_tokens) if max_tokens else None
    max_tokens, extra_fields = _reasoning_fields(settings, capabilities, requested_max)
    if (extra_fields.get("thinking") or {}).get("type") == "enabled" and (
        _continues_unthought_tool_loop(body["messages"])
    ):
        # Claude refuses a thinking budget on a request that answers tool calls of an
        # assistant turn that did not start with thinking (another model's tool loop).
        max_tokens, extra_fields = requested_max, {}
    inference: dict[str, Any] = {}
    if max_tokens:
        inference["maxTokens"] = int(max_tokens)
    # Extended thinking refuses a temperature other than the default: sent only without it.
    if settings.get("temperature") is not None and not extra_fields:
        inference["temperature"] = float(settings["temperature"])
    if inference:
        body["inferenceConfig"] = inference
    if ctx.tools:
        body["toolConfig"] = {"tools": _build_tools(ctx.tools)}
    if extra_fields:
        body["additionalModelRequestFields"] = extra_fields
    return body


# --- Reply → canonical --------------------------------------------------------------------


def usage_from_bedrock(usage: Mapping[str, Any] | None) -> TokenUsage | None:
    """Map a Converse `usage` object (response or stream `metadata`).

    `inputTokens` EXCLUDES both cache buckets (Bedrock's prompt-caching guide: total input
    = inputTokens + cacheReadInputTokens + cacheWriteInputTokens), so it maps as is, like
    Anthropic's `input_tokens`. `outputTokens` includes any reasoning. `totalTokens` is a
    sum and not read. None when no usage object was reported.
    """
    if not isinstance(usage, Mapping) or not {"inputTokens", "outputTokens"} & set(usage):
        return None

    def count(name: str) -> int:
        try:
            return max(0, int(usage.get(name) or 0))
        except (TypeError, ValueError):
            return 0

    return TokenUsage(
        input=count("inputTokens"),
        output=count("outputTokens"),
        cache_read=count("cacheReadInputTokens"),
        cache_write=count("cacheWriteInputTokens"),
    )


def _assemble(
    blocks: list[dict[str, Any]],
    *,
    model: str,
    stop_reason: str | None,
    usage: Mapping[str, Any] | None,
    raw: Any,
) -> AssistantTurn:
    """Ordered wire content blocks → AssistantTurn (shared by the stream and the response).

    A toolUse block whose `input` is still a string (streamed fragments) is parsed here.
    """
    text: list[str] = []
    reasoning: list[str] = []
    kept: list[dict[str, Any]] = []
    calls: list[ToolCall] = []
    for block in blocks:
        if "text" in block:
            text.append(block.get("text") or "")
        elif "reasoningContent" in block:
            content = block["reasoningContent"] or {}
            kept.append({"reasoningContent": dict(content)})
            thought = (content.get("reasoningText") or {}).get("text")
            if thought:
                reasoning.append(thought)
        elif "toolUse" in block:
            calls.append(_tool_call(block["toolUse"] or {}))
    extras: dict[str, Any] = {}
    if kept:
        extras[SIDECAR] = {"model": model, "blocks": kept}
    return AssistantTurn(
        text="".join(text) or None,
        tool_calls=calls,
        finish_reason=stop_reason,
        raw=raw,
        reasoning="\n\n".join(reasoning) or None,
        extras=extras,
        usage=usage_from_bedrock(usage),
    )


def _tool_call(tool_use: Mapping[str, Any]) -> ToolCall:
    call_id, name = tool_use.get("toolUseId") or "", tool_use.get("name") or ""
    value = tool_use.get("input")
    if isinstance(value, Mapping):
        return ToolCall(id=call_id, name=name, arguments=dict(value))
    raw = value if isinstance(value, str) else None
    arguments, error = parse_tool_arguments(raw)
    if error:
        return ToolCall(id=call_id, name=name, arguments={}, raw_arguments=raw, error=error)
    return ToolCall(id=call_id, name=name, arguments=arguments)


def stream_exception(
    exception_type: str | None,
    payload: Mapping[str, Any],
    *,
    model: str,
    partial: AssistantTurn | None = None,
) -> errors.ProviderError:
    """The error for an exception event inside a 200 stream.

    The message text decides first (context too long, quota, access keep their kind even
    under a generic type); otherwise the `:exception-type` does; otherwise StreamError.
    """
    message = payload.get("message") or payload.get("Message") or exception_type or "error"
    error = errors.error_from_event({"message": str(message)}, model=model, partial=partial)
    if type(error) is not errors.StreamError:
        return error
    cls = _STREAM_EXCEPTIONS.get(exception_type or "", errors.StreamError)
    raw = f"{exception_type}: {error.raw_message}" if exception_type else error.raw_message
    return cls(raw, model=model, partial=partial)


class ConverseStreamParser:
    """Accumulates ConverseStream events into deltas and one final turn.

    `feed(message)` takes one decoded event-stream message; `feed_event(type, payload)`
    the same as plain data. Text and reasoning blocks have no contentBlockStart (only
    toolUse does), so a block is created by its first delta. `done` turns True at
    messageStop; the `metadata` event (usage) follows it, so callers read to the end of
    the body. `finish()` builds the turn, or raises StreamError with the partial turn when
    the stream ended before messageStop. An exception event raises at once.
    """

    def __init__(self, *, model: str) -> None:
        self.model = model
        self.done = False
        self._blocks: dict[int, dict[str, Any]] = {}
        self._tool_fragments: dict[int, list[str]] = {}
        self._tool_ordinal: dict[int, int] = {}
        self._stop_reason: str | None = None
        self._usage: dict[str, Any] | None = None
        self._raw: dict[str, Any] = {}

    def feed(self, message: EventStreamMessage) -> list[StreamChunk]:
        kind = message.message_type or "event"
        try:
            payload = json.loads(message.payload) if message.payload.strip() else {}
        except ValueError:
            raise self._stream_error(f"malformed stream event from {self.model}") from None
        if not isinstance(payload, Mapping):
            payload = {}
        if kind == "exception":
            raise stream_exception(
                message.exception_type, payload, model=self.model, partial=self.partial_turn()
            )
        if kind == "error":
            code = message.headers.get(":error-code") or "error"
            text = message.headers.get(":error-message") or ""
            raise errors.StreamError(
                f"{code}: {text}".strip(": "), model=self.model, partial=self.partial_turn()
            )
        return self.feed_event(message.event_type or "", payload)

    def feed_event(self, event_type: str, payload: Mapping[str, Any]) -> list[StreamChunk]:
        if self.done and event_type != "metadata":
            return []
        handler = getattr(self, f"_on_{event_type}", None)
        if handler is None:
            logger.debug("bedrock: skipped a stream event of type %r", event_type)
            return []
        return handler(payload)

    def _on_messageStart(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        return []

    def _on_contentBlockStart(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        index = int(payload.get("contentBlockIndex", len(self._blocks)))
        start = payload.get("start") or {}
        tool = start.get("toolUse")
        if not isinstance(tool, Mapping):
            return []
        ordinal = len(self._tool_ordinal)
        self._tool_ordinal[index] = ordinal
        self._tool_fragments[index] = []
        self._blocks[index] = {
            "toolUse": {"toolUseId": tool.get("toolUseId"), "name": tool.get("name"), "input": ""}
        }
        delta = {"index": ordinal, "id": tool.get("toolUseId"), "name": tool.get("name")}
        return [StreamChunk(tool_call_delta={**delta, "arguments": ""})]

    def _on_contentBlockDelta(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        index = int(payload.get("contentBlockIndex", 0))
        delta = payload.get("delta") or {}
        if "text" in delta:
            block = self._blocks.setdefault(index, {"text": ""})
            if "text" not in block:
                raise self._stream_error(f"text delta for non-text block {index}")
            block["text"] += delta["text"] or ""
            return [StreamChunk(text=delta["text"])] if delta["text"] else []
        if "toolUse" in delta:
            if index not in self._tool_fragments:
                raise self._stream_error(f"toolUse delta for unknown block {index}")
            fragment = (delta["toolUse"] or {}).get("input") or ""
            self._tool_fragments[index].append(fragment)
            self._blocks[index]["toolUse"]["input"] += fragment
            call = {"index": self._tool_ordinal[index], "id": None, "name": None}
            return [StreamChunk(tool_call_delta={**call, "arguments": fragment})]
        if "reasoningContent" in delta:
            return self._reasoning_delta(index, delta["reasoningContent"] or {})
        logger.debug("bedrock: skipped a content delta of kind %s", sorted(delta))
        return []

    def _reasoning_delta(self, index: int, delta: Mapping[str, Any]) -> list[StreamChunk]:
        block = self._blocks.setdefault(index, {"reasoningContent": {}})
        content = block.get("reasoningContent")
        if content is None:
            raise self._stream_error(f"reasoning delta for non-reasoning block {index}")
        if "redactedContent" in delta:
            content["redactedContent"] = (content.get("redactedContent") or "") + (
                delta["redactedContent"] or ""
            )
            return []
        thought = content.setdefault("reasoningText", {"text": ""})
        if "text" in delta:
            thought["text"] += delta["text"] or ""
            return [StreamChunk(reasoning=delta["text"])] if delta["text"] else []
        if "signature" in delta:
            thought["signature"] = (thought.get("signature") or "") + (delta["signature"] or "")
        return []

    def _on_contentBlockStop(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        return []

    def _on_messageStop(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        self._stop_reason = payload.get("stopReason")
        self.done = True
        return []

    def _on_metadata(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        usage = payload.get("usage")
        if isinstance(usage, Mapping):
            self._usage = dict(usage)
        metrics = payload.get("metrics")
        if isinstance(metrics, Mapping):
            self._raw["metrics"] = dict(metrics)
        return []

    def partial_turn(self) -> AssistantTurn:
        blocks = [self._blocks[i] for i in sorted(self._blocks)]
        return _assemble(
            blocks,
            model=self.model,
            stop_reason=self._stop_reason,
            usage=self._usage,
            raw=self._raw or None,
        )

    def finish(self) -> AssistantTurn:
        if not self.done:
            raise self._stream_error(f"the stream from {self.model} ended before messageStop")
        return self.partial_turn()

    def _stream_error(self, message: str) -> errors.StreamError:
        return errors.StreamError(message, model=self.model, partial=self.partial_turn())


def parse_response(payload: Mapping[str, Any], *, model: str) -> AssistantTurn:
    """A non-streamed Converse response → AssistantTurn."""
    message = (payload.get("output") or {}).get("message") or {}
    blocks = [dict(b) for b in message.get("content") or [] if isinstance(b, Mapping)]
    return _assemble(
        blocks,
        model=model,
        stop_reason=payload.get("stopReason"),
        usage=payload.get("usage"),
        raw=dict(payload),
    )


def refine_error(error: errors.ProviderError, *, model: str) -> errors.ProviderError:
    """Re-read an HTTP error with Bedrock's own phrasing (see `_AUTH_PHRASES`...)."""
    if error.status is None:
        return error
    text = error.raw_message.lower()
    cls: type[errors.ProviderError] | None = None
    if any(phrase in text for phrase in _AUTH_PHRASES):
        cls = errors.AuthenticationError
    elif any(phrase in text for phrase in _NO_ACCESS_PHRASES):
        cls = errors.NoAccessError
    elif any(phrase in text for phrase in _QUOTA_PHRASES):
        cls = errors.QuotaError
    if cls is None or isinstance(error, cls):
        return error
    refined = cls(
        error.raw_message,
        status=error.status,
        model=model,
        partial=error.partial,
        retry_after=error.retry_after,
    )
    return refined


# --- The client ---------------------------------------------------------------------------


def region_from_url(url: str) -> str | None:
    """`us-west-2` from `https://bedrock-runtime.us-west-2.amazonaws.com` (and FIPS or
    other AWS partitions' hosts); None for any other host."""
    host = urlsplit(url).hostname or ""
    match = re.match(r"^bedrock-runtime(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$", host)
    return match.group(1) if match else None


class BedrockConverseClient(HttpProviderClient):
    """A `ProviderClient` for Bedrock Converse. Receives BARE model ids (a model id, an
    inference profile id or an ARN). Owns `transport`: `close()` closes it.

    `base_url` is the profile's override, else the regional endpoint of the profile's
    `region`, else empty: a client without a region fails at call time, with a friendly
    message, not when it is built."""

    # The factory passes the whole SecretStore profile: SigV4 needs more than one key.
    takes_profile = True
    # The usage `metadata` event follows messageStop: streams are read to the end.
    stop_when_done = False

    def __init__(
        self,
        descriptor: ProviderDescriptor,
        *,
        api_key: str | None,
        base_url: str | None,
        transport: Any,
        capabilities: Callable[[str], ModelCapabilities],
        profile: Mapping[str, Any] | None = None,
    ) -> None:
        profile = profile or {}
        access_key, secret_key = profile.get("access_key_id"), profile.get("secret_access_key")
        self._credentials = (
            AwsCredentials(access_key, secret_key, profile.get("session_token") or None)
            if access_key and secret_key
            else None
        )
        self.region: str | None = profile.get("region") or (
            region_from_url(base_url) if base_url else None
        )
        super().__init__(
            descriptor,
            api_key=api_key or None,
            base_url=base_url,
            transport=transport,
            capabilities=capabilities,
        )

    def _resolve_base_url(self, base_url: str | None) -> str:
        if base_url:
            return base_url.rstrip("/")
        if self.region:
            return self.descriptor.default_base_url.format(region=self.region).rstrip("/")
        return ""

    def url(self, model: str, *, stream: bool) -> str:
        if not self.base_url:
            raise errors.BadRequestError(
                "no region configured for Amazon Bedrock",
                friendly="No AWS region is configured for Amazon Bedrock. Add one in your "
                "provider settings.",
            )
        path = CONVERSE_STREAM_PATH if stream else CONVERSE_PATH
        # The model id is one path label: `:` and `/` (ARNs) are escaped, as the SDKs do.
        return self.base_url + path.format(model=quote(model, safe=""))

    def _headers(self, url: str, body: dict[str, Any], *, stream: bool) -> dict[str, str]:
        name = self.descriptor.label or self.descriptor.name
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        elif self._credentials is not None:
            if not self.region:
                raise errors.BadRequestError(
                    "no region configured for SigV4 signing",
                    friendly=f"No AWS region is configured for {name}. Add one in your "
                    "provider settings.",
                )
            headers.update(
                sign(
                    "POST",
                    url,
                    headers,
                    encode_body(body),
                    credentials=self._credentials,
                    region=self.region,
                    service=SIGNING_SERVICE,
                )
            )
        else:
            raise errors.AuthenticationError(
                f"no credentials configured for {name}",
                friendly=f"No credentials are configured for {name}. Add a Bedrock API key, "
                "or an access key ID and secret access key, in your provider settings.",
            )
        # Unsigned on purpose: only the headers above must reach the server unchanged.
        headers["Accept"] = EVENTSTREAM_CONTENT_TYPE if stream else "application/json"
        return headers

    def _prepare(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        settings: Mapping[str, Any],
        *,
        stream: bool,
    ) -> Prepared:
        body = build_request(
            build_context(messages, tools),
            model=model,
            settings=settings,
            capabilities=self._capabilities(model),
        )
        url = self.url(model, stream=stream)
        return url, self._headers(url, body, stream=stream), body

    def _parse(self, payload: dict[str, Any], *, model: str) -> AssistantTurn:
        return parse_response(payload, model=model)

    def _stream_parser(self, model: str) -> ConverseStreamParser:
        return ConverseStreamParser(model=model)

    def _open_astream(
        self,
        url: str,
        *,
        headers: dict[str, str],
        body: dict[str, Any],
        model: str,
        cancel: CancelToken | None,
    ) -> AsyncIterator[EventStreamMessage]:
        chunks = self._transport.astream_bytes(
            url, headers=headers, body=body, model=model, cancel=cancel
        )
        return _adecoded(chunks)

    def _refine_error(self, exc: errors.ProviderError, *, model: str) -> errors.ProviderError:
        return refine_error(exc, model=model)


async def _adecoded(chunks: AsyncIterator[bytes]) -> AsyncIterator[EventStreamMessage]:
    """The event-stream messages in a body's byte chunks (CRCs checked, a frame cut short
    at the end is an error); closing this closes the transport's iterator."""
    decoder = EventStreamDecoder()
    try:
        async for data in chunks:
            for message in decoder.feed(data):
                yield message
        decoder.flush()
    finally:
        await aclose_iterator(chunks)
