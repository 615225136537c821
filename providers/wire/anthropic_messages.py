"""Anthropic Messages API (`POST {base}/v1/messages`).

Context → wire request (`build_request`), and the reply → canonical shapes
(`MessagesStreamParser` for `stream: true`, `parse_message` for one Message object).

Thinking continuity: thinking and `redacted_thinking` blocks are kept exactly as received
in the turn's `extras["_anthropic"] = {"model": <bare model>, "thinking": [...]}` and put
back, first in the assistant message, only when the same model sees that history again:
signatures are model-bound, and another model would reject them.

Server tools (web search, web fetch, code execution, tool search) answer inside the reply:
their `server_tool_use` and `*_tool_result` blocks are kept in the sidecar's `server` list
and replayed, after the thinking, to the same model (the results carry encrypted content
the model cites from); citations on text blocks are kept in its `citations` list. A client
`tool_use` called from inside code execution (programmatic tool calling) arrives with its
whole `input` in `content_block_start` and a `caller`, without `input_json_delta`; the
caller is kept (sidecar `callers`, by call id) and put back on the replayed call, and the
reply's code execution `container` (sidecar `container`) is sent with the results, since
the paused code resumes there. Block,
delta and event types this module does not know are skipped with a debug log: what is
known of the reply still lands.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from .. import errors
from ..cache_policy import CACHE_RETENTION_SETTING, apply_cache_policy
from ..cache_spec import CacheSpec, get_cache_spec
from ..context import build_context, content_parts, parse_data_url
from ..reasoning import anthropic_thinking, effort_from
from ..registry import ProviderDescriptor
from ..types import AssistantTurn, Context, ModelCapabilities, StreamChunk, ToolCall
from ..usage import merge_anthropic_usage, usage_from_anthropic
from ._http_client import HttpProviderClient, Prepared
from .openai_completions import parse_tool_arguments

logger = logging.getLogger(__name__)

MESSAGES_PATH = "/v1/messages"
ANTHROPIC_VERSION = "2023-06-01"
# `max_tokens` is mandatory on this API. Used when neither the caller nor the model's
# capabilities give one: every current Claude model accepts at least 8192.
DEFAULT_MAX_TOKENS = 8192
SIDECAR = "_anthropic"
THINKING_TYPES = ("thinking", "redacted_thinking")
# Blocks of the API's own (server) tools: kept for replay, never turned into tool calls.
SERVER_BLOCK_TYPES = frozenset(
    {
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "container_upload",
    }
)
_KNOWN_BLOCK_TYPES = frozenset({"text", "tool_use", *THINKING_TYPES, *SERVER_BLOCK_TYPES})
# Events that carry nothing to keep, by design (no debug line for them).
_SILENT_EVENTS = frozenset({"ping", "content_block_stop"})
# Blocks whose `input` streams as `input_json_delta`.
_JSON_INPUT_TYPES = ("tool_use", "server_tool_use")
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


# --- Context → request -------------------------------------------------------------------


def _build_system(
    system_prompt: str | None, cache_marker: dict[str, Any] | None = None
) -> str | list[dict[str, Any]] | None:
    """The system prompt as the top-level `system`: a string, or, with a cache marker, one
    text block carrying the system breakpoint (it caches tools + system: tools render
    first). `Context.system_prompt` is one string, so the mark covers the whole block.
    """
    if not system_prompt:
        return None
    if cache_marker is None:
        return system_prompt
    return [{"type": "text", "text": system_prompt, "cache_control": cache_marker}]


def _has_text(text: Any) -> bool:
    """The API rejects text blocks that are empty or only whitespace."""
    return isinstance(text, str) and bool(text.strip())


def _with_cache_control(block: dict[str, Any], part: Mapping[str, Any]) -> dict[str, Any]:
    if part.get("cache_control"):
        block["cache_control"] = part["cache_control"]
    return block


def _image_block(url: str) -> dict[str, Any]:
    parsed = parse_data_url(url)
    if parsed is not None:
        media_type, data = parsed
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        }
    return {"type": "image", "source": {"type": "url", "url": url}}


def _document_block(file: Mapping[str, Any]) -> dict[str, Any] | None:
    file_data = file.get("file_data") or ""
    parsed = parse_data_url(file_data)
    # A bare base64 string (no data: prefix) is taken to be the PDF itself.
    data = parsed[1] if parsed is not None else file_data
    if not data:
        return None
    block: dict[str, Any] = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": data},
    }
    if file.get("filename"):
        block["title"] = file["filename"]
    return block


def _content_blocks(content: Any) -> list[dict[str, Any]]:
    """Canonical user/tool content → text, image and document blocks (blank text dropped)."""
    blocks: list[dict[str, Any]] = []
    for part in content_parts(content):
        kind = part.get("type")
        block: dict[str, Any] | None = None
        if kind == "text" and _has_text(part.get("text")):
            block = {"type": "text", "text": part["text"]}
        elif kind == "image_url":
            image = part.get("image_url") or {}
            url = image.get("url") if isinstance(image, Mapping) else image
            block = _image_block(url) if url else None
        elif kind == "file":
            block = _document_block(part.get("file") or {})
        if block is not None:
            blocks.append(_with_cache_control(block, part))
    return blocks


def _own_sidecar(message: Mapping[str, Any], model: str) -> Mapping[str, Any]:
    """The message's sidecar when `model` wrote it (its blocks are model-bound), else {}."""
    sidecar = (message.get("extras") or {}).get(SIDECAR)
    if not isinstance(sidecar, Mapping) or sidecar.get("model") != model:
        return {}
    return sidecar


def _sidecar_blocks(sidecar: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    return [dict(block) for block in sidecar.get(key) or [] if isinstance(block, Mapping)]


def _assistant_blocks(message: Mapping[str, Any], model: str) -> list[dict[str, Any]]:
    sidecar = _own_sidecar(message, model)
    blocks = _sidecar_blocks(sidecar, "thinking") + _sidecar_blocks(sidecar, "server")
    callers = sidecar.get("callers") if isinstance(sidecar.get("callers"), Mapping) else {}
    content = message.get("content")
    if isinstance(content, str):
        if _has_text(content):
            blocks.append({"type": "text", "text": content})
    else:
        blocks.extend(
            _with_cache_control({"type": "text", "text": part["text"]}, part)
            for part in content_parts(content)
            if part.get("type") == "text" and _has_text(part.get("text"))
        )
    for call in message.get("tool_calls") or []:
        arguments = call.get("arguments")
        if isinstance(arguments, str):
            arguments, _ = parse_tool_arguments(arguments)
        block = {
            "type": "tool_use",
            "id": call["id"],
            "name": call["name"],
            "input": arguments or {},
        }
        if isinstance(callers.get(call["id"]), Mapping):
            block["caller"] = dict(callers[call["id"]])
        blocks.append(block)
    return blocks


def _tool_result_block(message: Mapping[str, Any]) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.get("tool_call_id")}
    content = message.get("content")
    if isinstance(content, str):
        if content:
            block["content"] = content
    else:
        inner = _content_blocks(content)
        if inner:
            block["content"] = inner
    if message.get("is_error"):
        block["is_error"] = True
    # A cache breakpoint on the tool result (the policy's mark on a tool message), last so
    # the bytes before it are the same whether or not the block is marked.
    if message.get("cache_control"):
        block["cache_control"] = message["cache_control"]
    return block


def _build_messages(ctx: Context, *, model: str) -> list[dict[str, Any]]:
    """Canonical dialogue → alternating user/assistant messages of content blocks.

    Tool results become `tool_result` blocks in a user message; consecutive messages that
    land on the same role (several tool results, then the user's next words) are merged
    into one message, because the API requires the roles to alternate.
    """
    out: list[dict[str, Any]] = []
    for message in ctx.messages:
        role = message.get("role")
        if role == "user":
            wire_role, blocks = "user", _content_blocks(message.get("content"))
        elif role == "assistant":
            wire_role, blocks = "assistant", _assistant_blocks(message, model)
        elif role == "tool":
            wire_role, blocks = "user", [_tool_result_block(message)]
        else:
            continue
        if not blocks:
            continue
        if out and out[-1]["role"] == wire_role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": wire_role, "content": blocks})
    return out


def _pending_container(messages: list[dict[str, Any]], model: str) -> str | None:
    """The code execution container to continue in: the latest assistant message's, when
    `model` wrote it and it made programmatic tool calls (the API resumes the paused code
    in that container and refuses the results without it)."""
    for message in reversed(messages):
        if message.get("role") != "assistant":
            continue
        sidecar = _own_sidecar(message, model)
        container = sidecar.get("container")
        if sidecar.get("callers") and isinstance(container, Mapping) and container.get("id"):
            return str(container["id"])
        return None
    return None


def _build_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for tool in tools:
        wire: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description"):
            wire["description"] = tool["description"]
        wire["input_schema"] = tool.get("parameters") or EMPTY_SCHEMA
        if tool.get("cache_control"):
            wire["cache_control"] = tool["cache_control"]
        out.append(wire)
    return out


def _max_tokens(settings: Mapping[str, Any], capabilities: ModelCapabilities | None) -> int:
    if settings.get("max_tokens"):
        return int(settings["max_tokens"])
    if capabilities is not None and capabilities.max_output_tokens:
        return int(capabilities.max_output_tokens)
    return DEFAULT_MAX_TOKENS


def _thinking(
    settings: Mapping[str, Any],
    capabilities: ModelCapabilities | None,
    *,
    max_tokens: int,
    messages: list[dict[str, Any]],
) -> dict[str, Any]:
    """`reasoning_effort` → the body fields `thinking`, `output_config` and a raised
    `max_tokens` (merged into the body; empty when no thinking is asked for).

    The shape follows `capabilities.thinking` (providers/reasoning.py): a budget for
    Claude 3.7-4.5, adaptive thinking with an effort for 4.6 on, nothing when unknown.
    A budget is left out for one request that continues a tool loop whose assistant
    message does not open with a thinking block (its history came from another model,
    or thinking was off): the API refuses exactly that combination with a 400 ("a final
    assistant message must start with a thinking block"); adaptive thinking does not
    demand the block. Nor for a request that ends with an assistant prefill.
    """
    plan = anthropic_thinking(effort_from(settings), capabilities, max_tokens=max_tokens)
    if plan.thinking is None:
        return {}
    if messages and messages[-1].get("role") == "assistant":
        # An assistant prefill (a continue: docs/PROTOCOL.md "Continue"). The API refuses
        # a prefill with thinking on, so that one request goes without.
        return {}
    if plan.thinking.get("type") == "enabled" and _continues_unthought_tool_loop(messages):
        return {}
    fields: dict[str, Any] = {"max_tokens": plan.max_tokens, "thinking": plan.thinking}
    if plan.output_config is not None:
        fields["output_config"] = plan.output_config
    return fields


def _continues_unthought_tool_loop(messages: list[dict[str, Any]]) -> bool:
    """The request answers tool calls of an assistant message that has no leading thinking
    block (wire messages, after merging)."""
    if len(messages) < 2 or messages[-1]["role"] != "user":
        return False
    if not any(block.get("type") == "tool_result" for block in messages[-1]["content"]):
        return False
    assistant = messages[-2]
    blocks = assistant.get("content") or []
    return assistant["role"] == "assistant" and (
        not blocks or blocks[0].get("type") not in THINKING_TYPES
    )


def _apply_cache(
    ctx: Context, spec: CacheSpec | None, settings: Mapping[str, Any], base_url: str | None
) -> tuple[Context, dict[str, Any] | None]:
    """The Context with the cache policy's breakpoints placed, and the system marker.

    `spec` None leaves the Context as it is (callers' own marks still pass through).
    """
    if spec is None:
        return ctx, None
    plan = apply_cache_policy(
        ctx.messages,
        ctx.tools,
        spec=spec,
        retention=settings.get(CACHE_RETENTION_SETTING),
        system=bool(ctx.system_prompt),
        base_url=base_url,
    )
    return Context(ctx.system_prompt, plan.messages, plan.tools), plan.system


def build_request(
    ctx: Context,
    *,
    model: str,
    descriptor: ProviderDescriptor,
    stream: bool,
    settings: Mapping[str, Any],
    capabilities: ModelCapabilities | None = None,
    cache_spec: CacheSpec | None = None,
    base_url: str | None = None,
) -> dict[str, Any]:
    """The JSON body for `POST /v1/messages`. Key order is stable (byte-stable prefix).

    With `cache_spec` (the client passes its provider's declaration) the cache policy
    places the breakpoints; `base_url` decides whether the long TTL may be asked for.
    """
    max_tokens = _max_tokens(settings, capabilities)
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens}
    ctx, system_marker = _apply_cache(ctx, cache_spec, settings, base_url)
    system = _build_system(ctx.system_prompt, system_marker)
    if system is not None:
        body["system"] = system
    body["messages"] = _build_messages(ctx, model=model)
    if ctx.tools:
        body["tools"] = _build_tools(ctx.tools)
    container = _pending_container(ctx.messages, model)
    if container:
        body["container"] = container
    # Updates `max_tokens` in place (its key keeps its position) when a budget needs room.
    body.update(_thinking(settings, capabilities, max_tokens=max_tokens, messages=body["messages"]))
    # `temperature` is never sent: current models refuse it with a 400 ("deprecated for
    # this model") and the API's own default applies everywhere when it is absent.
    if stream:
        body["stream"] = True
    return body


def request_headers(descriptor: ProviderDescriptor, api_key: str | None) -> dict[str, str]:
    if descriptor.requires_key and not api_key:
        name = descriptor.label or descriptor.name
        raise errors.AuthenticationError(
            f"no API key configured for {name}",
            friendly=f"No API key is configured for {name}. Add one in your provider settings.",
        )
    # No content-type here: the transport sets it on every JSON request, and a second one
    # (the names differ in case, so both went out) is a header the API may refuse.
    headers = {"anthropic-version": ANTHROPIC_VERSION}
    if api_key:
        headers["x-api-key"] = api_key
    return headers


# --- Reply → canonical --------------------------------------------------------------------


def _assemble(
    blocks: list[dict[str, Any]],
    tool_json: Mapping[int, list[str]],
    *,
    model: str,
    stop_reason: str | None,
    usage: Mapping[str, Any] | None,
    raw: Any,
    container: Any = None,
) -> AssistantTurn:
    """Ordered content blocks → AssistantTurn (shared by the stream and the Message)."""
    text: list[str] = []
    reasoning: list[str] = []
    sidecar: dict[str, Any] = {"thinking": [], "server": [], "callers": {}, "citations": []}
    if isinstance(container, Mapping) and container.get("id"):
        sidecar["container"] = {k: container[k] for k in ("id", "expires_at") if k in container}
    calls: list[ToolCall] = []
    for position, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "text":
            text.append(block.get("text") or "")
            sidecar["citations"].extend(c for c in block.get("citations") or [] if c)
        elif kind in THINKING_TYPES:
            sidecar["thinking"].append(dict(block))
            if kind == "thinking" and block.get("thinking"):
                reasoning.append(block["thinking"])
        elif kind == "tool_use":
            call = _tool_call(block, tool_json.get(position))
            calls.append(call)
            if isinstance(block.get("caller"), Mapping):
                sidecar["callers"][call.id] = dict(block["caller"])
        elif kind == "server_tool_use":
            server = dict(block)
            if position in tool_json:
                server["input"] = _tool_call(block, tool_json[position]).arguments
            sidecar["server"].append(server)
        elif kind in SERVER_BLOCK_TYPES:
            sidecar["server"].append(dict(block))
    extras: dict[str, Any] = {}
    kept = {key: value for key, value in sidecar.items() if value}
    if kept:
        extras[SIDECAR] = {"model": model, **kept}
    return AssistantTurn(
        text="".join(text) or None,
        tool_calls=calls,
        finish_reason=stop_reason,
        raw=raw,
        reasoning="\n\n".join(reasoning) or None,
        extras=extras,
        usage=usage_from_anthropic(usage),
    )


def _tool_call(block: Mapping[str, Any], fragments: list[str] | None) -> ToolCall:
    call_id, name = block.get("id") or "", block.get("name") or ""
    raw = "".join(fragments or [])
    if not raw.strip():
        # A whole Message, or a streamed block whose `input` came whole in its
        # content_block_start (programmatic tool calling): `input` is already an object.
        value = block.get("input")
        return ToolCall(id=call_id, name=name, arguments=dict(value or {}))
    arguments, error = parse_tool_arguments(raw)
    if error:
        return ToolCall(id=call_id, name=name, arguments={}, raw_arguments=raw, error=error)
    return ToolCall(id=call_id, name=name, arguments=arguments)


class MessagesStreamParser:
    """Accumulates Messages stream events into deltas and one final turn.

    `feed(event)` returns the StreamChunks that event produced; `done` turns True at
    `message_stop`; `finish()` builds the AssistantTurn, or raises StreamError with the
    partial turn when the stream ended without `message_stop`. An `error` event (sent
    after HTTP 200, e.g. overloaded_error) raises the matching ProviderError at once.
    Usage starts from `message_start` and is overwritten by `message_delta`'s cumulative
    counts.
    """

    def __init__(self, *, model: str) -> None:
        self.model = model
        self.done = False
        self._blocks: dict[int, dict[str, Any]] = {}
        self._tool_json: dict[int, list[str]] = {}
        self._tool_ordinal: dict[int, int] = {}
        self._skipped: set[int] = set()  # indexes of blocks of unknown types
        self._stop_reason: str | None = None
        self._usage: dict[str, Any] | None = None
        self._raw: dict[str, Any] = {}
        self._container: Any = None  # the code execution container, for a continuation

    def feed(self, event: Any) -> list[StreamChunk]:
        if self.done or not (event.data or "").strip():
            return []
        try:
            payload = json.loads(event.data)
        except ValueError:
            raise self._stream_error(f"malformed stream event from {self.model}") from None
        if not isinstance(payload, Mapping):
            return []
        kind = payload.get("type") or event.event
        handler = getattr(self, f"_on_{kind}", None)
        if handler is None:
            if kind not in _SILENT_EVENTS:
                logger.debug("anthropic: skipped a stream event of type %r", kind)
            return []
        return handler(payload)

    def _on_message_start(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        message = payload.get("message") or {}
        self._raw = {k: message[k] for k in ("id", "model") if message.get(k)}
        self._container = message.get("container") or self._container
        self._usage = merge_anthropic_usage(None, message.get("usage"))
        return []

    def _on_content_block_start(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        index = int(payload.get("index", len(self._blocks)))
        block = dict(payload.get("content_block") or {})
        kind = block.get("type")
        if kind not in _KNOWN_BLOCK_TYPES:
            logger.debug("anthropic: skipped a content block of unknown type %r", kind)
            self._skipped.add(index)
            return []
        self._blocks[index] = block
        if kind in _JSON_INPUT_TYPES:
            self._tool_json[index] = []
        if kind == "tool_use":
            ordinal = len(self._tool_ordinal)
            self._tool_ordinal[index] = ordinal
            # Whole `input` here (programmatic tool calling) is the call's arguments; a
            # streamed one starts as `{}` and comes in input_json_delta fragments.
            start = block.get("input")
            arguments = json.dumps(start, ensure_ascii=False) if start else ""
            delta = {"index": ordinal, "id": block.get("id"), "name": block.get("name")}
            return [StreamChunk(tool_call_delta={**delta, "arguments": arguments})]
        if kind == "text" and block.get("text"):
            return [StreamChunk(text=block["text"])]
        if kind == "thinking" and block.get("thinking"):
            return [StreamChunk(reasoning=block["thinking"])]
        return []

    def _on_content_block_delta(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        index = int(payload.get("index", 0))
        block = self._blocks.get(index)
        delta = payload.get("delta") or {}
        if block is None:
            if index in self._skipped:
                return []
            raise self._stream_error(f"content_block_delta for unknown block {index}")
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = (block.get("text") or "") + delta.get("text", "")
            return [StreamChunk(text=delta.get("text", ""))]
        if kind == "thinking_delta":
            block["thinking"] = (block.get("thinking") or "") + delta.get("thinking", "")
            return [StreamChunk(reasoning=delta.get("thinking", ""))]
        if kind == "signature_delta":
            block["signature"] = delta.get("signature", "")
            return []
        if kind == "citations_delta":
            if isinstance(delta.get("citation"), Mapping):
                block.setdefault("citations", []).append(dict(delta["citation"]))
            return []
        if kind == "input_json_delta" and index in self._tool_json:
            fragment = delta.get("partial_json", "")
            self._tool_json[index].append(fragment)
            ordinal = self._tool_ordinal.get(index)
            if ordinal is None:  # a server tool's input: not a call of ours
                return []
            return [
                StreamChunk(
                    tool_call_delta={
                        "index": ordinal,
                        "id": None,
                        "name": None,
                        "arguments": fragment,
                    }
                )
            ]
        logger.debug("anthropic: skipped a content_block_delta of type %r", kind)
        return []

    def _on_message_delta(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        delta = payload.get("delta") or {}
        if delta.get("stop_reason"):
            self._stop_reason = delta["stop_reason"]
        if delta.get("container"):
            self._container = delta["container"]
        if delta.get("stop_details"):
            self._raw["stop_details"] = delta["stop_details"]
        self._usage = merge_anthropic_usage(self._usage, payload.get("usage"))
        return []

    def _on_message_stop(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        self.done = True
        return []

    def _on_error(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        raise errors.error_from_event(dict(payload), model=self.model, partial=self.partial_turn())

    def partial_turn(self) -> AssistantTurn:
        blocks = [self._blocks[i] for i in sorted(self._blocks)]
        positions = {index: pos for pos, index in enumerate(sorted(self._blocks))}
        tool_json = {positions[i]: frags for i, frags in self._tool_json.items()}
        return _assemble(
            blocks,
            tool_json,
            model=self.model,
            stop_reason=self._stop_reason,
            usage=self._usage,
            raw=self._raw or None,
            container=self._container,
        )

    def finish(self) -> AssistantTurn:
        if not self.done:
            raise self._stream_error(f"the stream from {self.model} ended before message_stop")
        return self.partial_turn()

    def _stream_error(self, message: str) -> errors.StreamError:
        return errors.StreamError(message, model=self.model, partial=self.partial_turn())


def parse_message(payload: Mapping[str, Any], *, model: str) -> AssistantTurn:
    """A non-streamed Message object → AssistantTurn."""
    if payload.get("type") == "error":
        raise errors.error_from_event(dict(payload), model=model)
    blocks = [dict(b) for b in payload.get("content") or [] if isinstance(b, Mapping)]
    return _assemble(
        blocks,
        {},
        model=model,
        stop_reason=payload.get("stop_reason"),
        usage=payload.get("usage"),
        raw=dict(payload),
        container=payload.get("container"),
    )


# --- The client ---------------------------------------------------------------------------


class AnthropicMessagesClient(HttpProviderClient):
    """A `ProviderClient` for the Messages API. Receives BARE model names. Owns `transport`:
    `close()` closes it."""

    @property
    def url(self) -> str:
        return self.base_url + MESSAGES_PATH

    def _prepare(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        settings: Mapping[str, Any],
        *,
        stream: bool,
    ) -> Prepared:
        headers = request_headers(self.descriptor, self._api_key)
        body = build_request(
            build_context(messages, tools),
            model=model,
            descriptor=self.descriptor,
            stream=stream,
            settings=settings,
            capabilities=self._capabilities(model),
            cache_spec=get_cache_spec(self.descriptor.name),
            base_url=self.base_url,
        )
        return self.url, headers, body

    def _parse(self, payload: dict[str, Any], *, model: str) -> AssistantTurn:
        return parse_message(payload, model=model)

    def _stream_parser(self, model: str) -> MessagesStreamParser:
        return MessagesStreamParser(model=model)
