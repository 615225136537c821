"""OpenAI Chat Completions (`POST {base}/chat/completions`) and every compatible vendor.

Context → wire request (`build_request`), and the reply → canonical shapes
(`CompletionsStreamParser` for `stream=True`, `parse_completion` for one object). Vendor
differences come from the descriptor's `CompatFlags`, never from branches on a name.

Chat Completions has no provider-private sidecars of its own: `extras` and `cache_control`
marks on the outbound copy are dropped here (OpenAI caches prefixes automatically). The
one exception is declared, not branched on: a vendor with `replay_reasoning_content`
(DeepSeek's thinking mode) gets each reply's reasoning kept in `extras["_<provider>"] =
{"model": <bare model>, "reasoning_content": ...}` and sent back as `reasoning_content` on
that assistant message, to the same model only; canonical `reasoning` stays display only.
A `refusal` (OpenAI's safety refusal, streamed as `delta.refusal`) is the reply's text,
since it is what the user must see; `finish_reason` passes through (`content_filter`).
A vendor with `replay_thinking_chunks` (Mistral) keeps it the same way and gets it back as
a `thinking` content chunk ahead of the text, to the same model only.

Reasoning also arrives as typed content chunks (Mistral): `content` as a list of
`{"type": "thinking", "thinking": [{"type": "text", ...}]}` (→ reasoning) and
`{"type": "text", ...}` (→ text) parts; chunk types this module does not know are skipped
with a debug log. A vendor with `tool_call_id_length` (Mistral's nine characters) gets
every tool-call id of another shape re-keyed in the outbound copy (`rekey_tool_call_ids`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import errors
from ..cache_policy import cache_request_fields, cache_request_headers
from ..cache_spec import get_cache_spec
from ..context import build_context, content_parts, content_text
from ..reasoning import completions_reasoning_fields, effort_from
from ..registry import CompatFlags, ProviderDescriptor
from ..types import AssistantTurn, Context, ModelCapabilities, StreamChunk, ToolCall
from ..usage import usage_from_openai
from ._http_client import HttpProviderClient, Prepared

logger = logging.getLogger(__name__)

CHAT_COMPLETIONS_PATH = "/chat/completions"
DONE_SENTINEL = "[DONE]"
# When a descriptor names no reasoning field we still read the two spellings vendors use
# (DeepSeek/xAI `reasoning_content`, Ollama/Groq/OpenRouter `reasoning`): OpenAI itself
# sends neither, so reading them can only surface text a vendor meant as reasoning. The
# first present wins: some servers (vLLM) send both spellings carrying the same text.
FALLBACK_REASONING_FIELDS = ("reasoning_content", "reasoning")
# A tool without a schema still needs one: the API rejects a function without parameters
# on several compatible vendors.
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
# What a model that must get `reasoning_content` back receives on assistant messages it
# did not write (another model's turns, a switch mid-loop): the field must be present, and
# a single space is the smallest value DeepSeek is reported to accept (LiteLLM's
# DeepSeek transformation). It carries no reasoning, so no model sees another's thinking.
REASONING_CONTENT_PLACEHOLDER = " "
# Legacy `functions` API spelling, mapped so callers only ever see "tool_calls".
_FINISH_ALIASES = {"function_call": "tool_calls"}
# Tries at a free id before a clash is let through: only a tiny id space (never nine
# base-62 characters) runs out of them.
MAX_REKEY_ATTEMPTS = 64
_ID_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


# --- Context → request -------------------------------------------------------------------


def _build_system(system_prompt: str | None, compat: CompatFlags) -> list[dict[str, Any]]:
    """The system prompt as messages[0]: `developer` for OpenAI's own reasoning-era models."""
    if not system_prompt:
        return []
    return [{"role": "developer" if compat.developer_role else "system", "content": system_prompt}]


def _user_part(part: Mapping[str, Any]) -> dict[str, Any] | None:
    kind = part.get("type")
    if kind == "text":
        text = part.get("text") or ""
        return {"type": "text", "text": text} if text else None
    if kind == "image_url":
        image = part.get("image_url") or {}
        url = image.get("url") if isinstance(image, Mapping) else image
        if not url:
            return None
        out: dict[str, Any] = {"url": url}
        if isinstance(image, Mapping) and image.get("detail"):
            out["detail"] = image["detail"]
        return {"type": "image_url", "image_url": out}
    if kind == "file":
        source = part.get("file") or {}
        file: dict[str, Any] = {}
        for key in ("filename", "file_data"):
            if source.get(key):
                file[key] = source[key]
        return {"type": "file", "file": file} if file.get("file_data") else None
    return None


def _user_content(content: Any) -> str | list[dict[str, Any]]:
    """A plain string stays a string (every vendor takes it); parts map one to one."""
    if isinstance(content, str):
        return content
    parts = [p for p in (_user_part(part) for part in content_parts(content)) if p is not None]
    return parts


def sidecar_key(descriptor: ProviderDescriptor) -> str:
    """`extras` key of the provider's reasoning sidecar (`_deepseek`)."""
    return f"_{descriptor.name}"


def _replayed_reasoning(
    message: Mapping[str, Any], *, sidecar: str, model: str, placeholder: bool
) -> str | None:
    """The `reasoning_content` to send back on an assistant message: the same model's own,
    else the placeholder where the model needs the field on every message, else None."""
    kept = (message.get("extras") or {}).get(sidecar)
    if isinstance(kept, Mapping) and kept.get("model") == model:
        text = kept.get("reasoning_content")
        if isinstance(text, str) and text:
            return text
    return REASONING_CONTENT_PLACEHOLDER if placeholder else None


def _replayed_thinking_chunk(
    message: Mapping[str, Any], *, sidecar: str, model: str
) -> dict[str, Any] | None:
    """The thinking chunk to put first in an assistant message's content: the same
    model's own reasoning (and its signature, where one came), else None."""
    text = _replayed_reasoning(message, sidecar=sidecar, model=model, placeholder=False)
    if not text:
        return None
    chunk: dict[str, Any] = {"type": "thinking", "thinking": [{"type": "text", "text": text}]}
    signature = ((message.get("extras") or {}).get(sidecar) or {}).get("signature")
    if isinstance(signature, str) and signature:
        chunk["signature"] = signature
    return chunk


def _assistant_message(
    message: Mapping[str, Any],
    *,
    reasoning_content: str | None = None,
    thinking_chunk: dict[str, Any] | None = None,
    call_id: Any = None,
) -> dict[str, Any]:
    text = content_text(message.get("content"))
    calls = message.get("tool_calls") or []
    content: Any = text or (None if calls else "")
    if thinking_chunk:
        content = [thinking_chunk]
        if text:
            content.append({"type": "text", "text": text})
    out: dict[str, Any] = {"role": "assistant", "content": content}
    rename = call_id or (lambda value: value)
    if calls:
        out["tool_calls"] = [
            {
                "id": rename(call["id"]),
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": _arguments_json(call),
                },
            }
            for call in calls
        ]
    if reasoning_content is not None:
        out["reasoning_content"] = reasoning_content
    return out


def _arguments_json(call: Mapping[str, Any]) -> str:
    arguments = call.get("arguments")
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments or {}, ensure_ascii=False, separators=(",", ":"))


def rekey_tool_call_ids(length: int) -> Any:
    """A renamer for one request's tool-call ids: an id that is already `length` letters
    and digits stays; any other becomes `length` base-62 characters of its SHA-256, so the
    call and its result (and the same id in every later request) get the same new id
    without any state kept. Two ids that would land on one name get distinct ones."""
    valid = re.compile(rf"[A-Za-z0-9]{{{length}}}")
    given: dict[str, str] = {}
    taken: dict[str, str] = {}

    def derive(call_id: str, salt: int) -> str:
        seed = call_id if salt == 0 else f"{call_id}\x00{salt}"
        number = int.from_bytes(hashlib.sha256(seed.encode()).digest(), "big")
        out = []
        for _ in range(length):
            number, digit = divmod(number, len(_ID_ALPHABET))
            out.append(_ID_ALPHABET[digit])
        return "".join(out)

    def rename(call_id: Any) -> str:
        call_id = str(call_id or "")
        if call_id in given:
            return given[call_id]
        candidate, salt = (call_id, 0) if valid.fullmatch(call_id) else (derive(call_id, 0), 0)
        while taken.get(candidate, call_id) != call_id and salt < MAX_REKEY_ATTEMPTS:
            salt += 1
            candidate = derive(call_id, salt)
        given[call_id] = candidate
        taken[candidate] = call_id
        return candidate

    return rename


def _build_messages(
    ctx: Context,
    compat: CompatFlags,
    *,
    model: str = "",
    sidecar: str = "",
    thinks: bool = False,
) -> list[dict[str, Any]]:
    """Canonical dialogue → Chat Completions messages (system excluded).

    With `compat.replay_reasoning_content`, assistant messages carry `reasoning_content`:
    their own (from the `sidecar` extras) when `model` wrote them, a placeholder otherwise
    when the model `thinks` (its capabilities say it reasons), nothing when unknown. With
    `compat.replay_thinking_chunks` the same model's own reasoning goes back as a thinking
    chunk, and with `compat.tool_call_id_length` ids are re-keyed (this copy only).
    """
    out: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}
    length = compat.tool_call_id_length
    call_id = rekey_tool_call_ids(length) if length else (lambda value: value)
    for message in ctx.messages:
        role = message.get("role")
        if role == "user":
            out.append({"role": "user", "content": _user_content(message.get("content"))})
        elif role == "assistant":
            for call in message.get("tool_calls") or []:
                call_names[call["id"]] = call["name"]
            replayed = (
                _replayed_reasoning(message, sidecar=sidecar, model=model, placeholder=thinks)
                if compat.replay_reasoning_content
                else None
            )
            thinking = (
                _replayed_thinking_chunk(message, sidecar=sidecar, model=model)
                if compat.replay_thinking_chunks
                else None
            )
            out.append(
                _assistant_message(
                    message,
                    reasoning_content=replayed,
                    thinking_chunk=thinking,
                    call_id=call_id,
                )
            )
        elif role == "tool":
            result_of = message.get("tool_call_id") or ""
            tool: dict[str, Any] = {
                "role": "tool",
                "tool_call_id": call_id(result_of),
                "content": content_text(message.get("content")),
            }
            if compat.tool_result_name:
                tool["name"] = message.get("name") or call_names.get(result_of, "")
            out.append(tool)
    return out


def _build_tools(tools: list[dict[str, Any]], compat: CompatFlags) -> list[dict[str, Any]]:
    """Canonical tools → function tools.

    `strict` is only sent when the vendor accepts it AND the tool itself declares it: strict
    mode demands a schema dialect (every property required, no additional properties) that
    an arbitrary tool schema does not meet, so it is never switched on here.
    """
    out = []
    for tool in tools:
        function: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        function["parameters"] = tool.get("parameters") or EMPTY_PARAMETERS
        if compat.strict_tools and isinstance(tool.get("strict"), bool):
            function["strict"] = tool["strict"]
        out.append({"type": "function", "function": function})
    return out


def _cache_fields(settings: Mapping[str, Any], descriptor: ProviderDescriptor) -> dict[str, Any]:
    """Automatic prompt caching: the session's `settings["cache_key"]` under the body field
    the provider's `cache.json` names (`prompt_cache_key` for OpenAI), nothing for vendors
    that declare no key field: which vendors accept it is a declaration, not a guess."""
    return cache_request_fields(get_cache_spec(descriptor.name), settings)


def _cache_headers(settings: Mapping[str, Any], descriptor: ProviderDescriptor) -> dict[str, str]:
    """The cache key as a header, for vendors that declare one (xAI `x-grok-conv-id`)."""
    return cache_request_headers(get_cache_spec(descriptor.name), settings)


def _reasoning_fields(
    settings: Mapping[str, Any],
    descriptor: ProviderDescriptor,
    capabilities: ModelCapabilities | None,
) -> dict[str, Any]:
    """`reasoning_effort` as the vendor's compat flags declare it (providers/reasoning.py):
    top-level `reasoning_effort`, OpenRouter's `reasoning` object, or nothing."""
    return completions_reasoning_fields(
        effort_from(settings), compat=descriptor.compat, capabilities=capabilities
    )


def build_request(
    ctx: Context,
    *,
    model: str,
    descriptor: ProviderDescriptor,
    stream: bool,
    settings: Mapping[str, Any],
    capabilities: ModelCapabilities | None = None,
) -> dict[str, Any]:
    """The JSON body for `POST /chat/completions`. Key order is stable (byte-stable prefix).

    `capabilities` (the model's) decide whether `reasoning_effort` may be sent at all.
    """
    compat = descriptor.compat
    body: dict[str, Any] = {
        "model": model,
        "messages": _build_system(ctx.system_prompt, compat)
        + _build_messages(
            ctx,
            compat,
            model=model,
            sidecar=sidecar_key(descriptor),
            thinks=bool(capabilities is not None and capabilities.reasoning),
        ),
    }
    if ctx.tools:
        body["tools"] = _build_tools(ctx.tools, compat)
    if settings.get("max_tokens"):
        body[compat.max_tokens_field] = int(settings["max_tokens"])
    if settings.get("temperature") is not None:
        body["temperature"] = settings["temperature"]
    body.update(_reasoning_fields(settings, descriptor, capabilities))
    body.update(_cache_fields(settings, descriptor))
    if stream:
        body["stream"] = True
        if compat.usage_in_stream:
            body["stream_options"] = {"include_usage": True}
    return body


def auth_headers(descriptor: ProviderDescriptor, api_key: str | None) -> dict[str, str]:
    """Headers that authenticate a request; refuses before any I/O when a key is missing."""
    if descriptor.requires_key and not api_key:
        name = descriptor.label or descriptor.name
        raise errors.AuthenticationError(
            f"no API key configured for {name}",
            friendly=f"No API key is configured for {name}. Add one in your provider settings.",
        )
    if not api_key or descriptor.auth == "none":
        return {}
    if descriptor.auth == "x-api-key":
        return {"x-api-key": api_key}
    return {"Authorization": f"Bearer {api_key}"}


# --- Reply → canonical --------------------------------------------------------------------


# Content chunk types that carry nothing for the turn, by design (no debug line for them).
_QUIET_CHUNKS = frozenset({"reference"})


@dataclass(frozen=True)
class _Content:
    text: str = ""
    reasoning: str = ""
    signature: str | None = None  # a thinking chunk's, for its replay


def _content_of(value: Any) -> _Content:
    """Text and reasoning of delta/message content: a string is text; a list of typed
    chunks (Mistral) gives its `text` chunks as text and the text inside its `thinking`
    chunks as reasoning (with the chunk's signature). Other chunk types are skipped."""
    if isinstance(value, str):
        return _Content(text=value)
    if not isinstance(value, list):
        return _Content()
    text: list[str] = []
    reasoning: list[str] = []
    signature: str | None = None
    for item in value:
        if isinstance(item, str):
            text.append(item)
            continue
        kind = item.get("type") if isinstance(item, Mapping) else None
        if kind == "text":
            text.append(str(item.get("text") or ""))
        elif kind == "thinking":
            inner = item.get("thinking")
            if isinstance(inner, str):
                reasoning.append(inner)
            else:
                reasoning.append(_content_of(inner or []).text)
            if isinstance(item.get("signature"), str) and item["signature"]:
                signature = item["signature"]
        elif kind not in _QUIET_CHUNKS:
            logger.debug("chat completions: skipped a content chunk of type %r", kind)
    return _Content("".join(text), "".join(reasoning), signature)


def _refusal_of(source: Mapping[str, Any]) -> str:
    """`refusal` text (OpenAI's structured refusals), or ""."""
    value = source.get("refusal")
    return value if isinstance(value, str) else ""


def _reasoning_of(source: Mapping[str, Any], reasoning_field: str | None) -> str:
    fields = (reasoning_field,) if reasoning_field else FALLBACK_REASONING_FIELDS
    for name in fields:
        value = source.get(name)
        if isinstance(value, str) and value:
            return value
    return ""


def parse_tool_arguments(raw: str | None) -> tuple[dict[str, Any], str | None]:
    """(arguments, error). Empty means no arguments; anything not a JSON object is an error
    the engine reports back to the model rather than a crash."""
    if raw is None or not raw.strip():
        return {}, None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return {}, f"tool arguments are not valid JSON: {exc}"
    if not isinstance(value, dict):
        return {}, f"tool arguments must be a JSON object, got {type(value).__name__}"
    return value, None


def _tool_call(call_id: str, name: str, raw: str | None) -> ToolCall:
    arguments, error = parse_tool_arguments(raw)
    if error:
        return ToolCall(id=call_id, name=name, arguments={}, raw_arguments=raw, error=error)
    return ToolCall(id=call_id, name=name, arguments=arguments)


def _finish_reason(reason: str | None, has_calls: bool) -> str | None:
    reason = _FINISH_ALIASES.get(reason or "", reason)
    # Some compatible servers (older Ollama among them) say "stop" after emitting calls.
    if has_calls and reason in (None, "stop"):
        return "tool_calls"
    return reason


@dataclass
class _CallBuffer:
    id: str | None = None
    name: str | None = None
    fragments: list[str] = field(default_factory=list)


class CompletionsStreamParser:
    """Accumulates `chat.completion.chunk` events into deltas and one final turn.

    `feed(event)` returns the StreamChunks that event produced; `done` turns True at
    `data: [DONE]`; `finish()` builds the AssistantTurn, or raises StreamError (carrying
    the partial turn) when the stream ended with neither `[DONE]` nor a finish_reason.
    Tool-call ids and names arrive on a call's first fragment only; calls are assembled
    per wire `index`. A fragment carrying a different id at an index already in use starts
    a new call: some compatible servers number every call 0. With `sidecar` (an `extras`
    key) the reasoning is also kept there for replay to the same model (see
    `replay_reasoning_content`).
    """

    def __init__(
        self, *, model: str, reasoning_field: str | None = None, sidecar: str | None = None
    ) -> None:
        self.model = model
        self.reasoning_field = reasoning_field
        self.sidecar = sidecar
        self.done = False
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[_CallBuffer] = []
        self._slots: dict[int, int] = {}
        self._finish: str | None = None
        self._signature: str | None = None
        self._usage: Mapping[str, Any] | None = None
        self._raw: dict[str, Any] = {}

    def feed(self, event: Any) -> list[StreamChunk]:
        data = (event.data or "").strip()
        if not data or self.done:
            return []
        if data == DONE_SENTINEL:
            self.done = True
            return []
        try:
            payload = json.loads(data)
        except ValueError:
            raise self._stream_error(f"malformed stream chunk from {self.model}") from None
        if not isinstance(payload, Mapping):
            return []
        if payload.get("error"):
            raise errors.error_from_event(
                dict(payload), model=self.model, partial=self.partial_turn()
            )
        if not self._raw:
            self._raw = {k: payload[k] for k in ("id", "model") if payload.get(k)}
        if payload.get("usage"):
            self._usage = payload["usage"]
        chunks: list[StreamChunk] = []
        for choice in payload.get("choices") or []:
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content = _content_of(delta.get("content"))
            # A refusal is what the user is told instead of an answer: it is the text.
            text = content.text + _refusal_of(delta)
            reasoning = _reasoning_of(delta, self.reasoning_field) + content.reasoning
            if content.signature:
                self._signature = content.signature
            if reasoning:
                self._reasoning.append(reasoning)
                chunks.append(StreamChunk(reasoning=reasoning))
            if text:
                self._text.append(text)
                chunks.append(StreamChunk(text=text))
            for position, call in enumerate(delta.get("tool_calls") or []):
                chunks.append(self._feed_call(position, call))
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        return chunks

    def _feed_call(self, position: int, call: Mapping[str, Any]) -> StreamChunk:
        wire_index = call.get("index", position)
        call_id = call.get("id") or None
        function = call.get("function") or {}
        slot = self._slots.get(wire_index)
        if slot is None or (call_id and self._calls[slot].id and self._calls[slot].id != call_id):
            slot = len(self._calls)
            self._slots[wire_index] = slot
            self._calls.append(_CallBuffer())
        buffer = self._calls[slot]
        name = function.get("name") or None
        if call_id and not buffer.id:
            buffer.id = call_id
        if name and not buffer.name:
            buffer.name = name
        fragment = function.get("arguments") or ""
        if not isinstance(fragment, str):  # a vendor that sends the object itself
            fragment = json.dumps(fragment, ensure_ascii=False)
        buffer.fragments.append(fragment)
        return StreamChunk(
            tool_call_delta={"index": slot, "id": call_id, "name": name, "arguments": fragment}
        )

    def partial_turn(self) -> AssistantTurn:
        """The turn as far as it got: text and reasoning so far, calls as assembled."""
        calls = [
            _tool_call(b.id or f"call_{i}", b.name or "", "".join(b.fragments))
            for i, b in enumerate(self._calls)
        ]
        reasoning = "".join(self._reasoning) or None
        return AssistantTurn(
            text="".join(self._text) or None,
            tool_calls=calls,
            finish_reason=_finish_reason(self._finish, bool(calls)),
            raw=self._raw or None,
            reasoning=reasoning,
            extras=_reasoning_sidecar(self.sidecar, self.model, reasoning, self._signature),
            usage=usage_from_openai(self._usage),
        )

    def finish(self) -> AssistantTurn:
        if not self.done and self._finish is None:
            raise self._stream_error(f"the stream from {self.model} ended before it finished")
        return self.partial_turn()

    def _stream_error(self, message: str) -> errors.StreamError:
        return errors.StreamError(message, model=self.model, partial=self.partial_turn())


def _reasoning_sidecar(
    sidecar: str | None, model: str, reasoning: str | None, signature: str | None = None
) -> dict[str, Any]:
    """`extras` holding the reply's reasoning (and its thinking chunk's signature) for
    replay to `model`, when kept at all."""
    if not sidecar or not reasoning:
        return {}
    kept: dict[str, Any] = {"model": model, "reasoning_content": reasoning}
    if signature:
        kept["signature"] = signature
    return {sidecar: kept}


def parse_completion(
    payload: Mapping[str, Any],
    *,
    model: str,
    reasoning_field: str | None = None,
    sidecar: str | None = None,
) -> AssistantTurn:
    """A non-streamed `chat.completion` object → AssistantTurn (`sidecar` as the parser's)."""
    if payload.get("error"):
        raise errors.error_from_event(dict(payload), model=model)
    choices = payload.get("choices") or []
    if not choices:
        raise errors.ProviderError(f"the reply from {model} had no choices", model=model)
    choice = choices[0]
    message = choice.get("message") or {}
    calls = [
        _tool_call(
            call.get("id") or f"call_{i}",
            (call.get("function") or {}).get("name") or "",
            _raw_arguments((call.get("function") or {}).get("arguments")),
        )
        for i, call in enumerate(message.get("tool_calls") or [])
    ]
    content = _content_of(message.get("content"))
    reasoning = (_reasoning_of(message, reasoning_field) + content.reasoning) or None
    return AssistantTurn(
        text=(content.text + _refusal_of(message)) or None,
        tool_calls=calls,
        finish_reason=_finish_reason(choice.get("finish_reason"), bool(calls)),
        raw=dict(payload),
        reasoning=reasoning,
        extras=_reasoning_sidecar(sidecar, model, reasoning, content.signature),
        usage=usage_from_openai(payload.get("usage")),
    )


def _raw_arguments(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


# --- The client ---------------------------------------------------------------------------


class OpenAICompletionsClient(HttpProviderClient):
    """A `ProviderClient` for one Chat Completions provider (OpenAI, Ollama, DeepSeek...).

    Receives BARE model names (the router strips the prefix). Owns `transport`: `close()`
    closes it.
    """

    @property
    def url(self) -> str:
        return self.base_url + CHAT_COMPLETIONS_PATH

    def _prepare(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        settings: Mapping[str, Any],
        *,
        stream: bool,
    ) -> Prepared:
        headers = {
            **auth_headers(self.descriptor, self._api_key),
            **_cache_headers(settings, self.descriptor),
        }
        body = build_request(
            build_context(messages, tools),
            model=model,
            descriptor=self.descriptor,
            stream=stream,
            settings=settings,
            capabilities=self._capabilities(model),
        )
        return self.url, headers, body

    @property
    def _sidecar(self) -> str | None:
        """Where replies keep their reasoning for replay, for vendors that need it back."""
        compat = self.descriptor.compat
        if not (compat.replay_reasoning_content or compat.replay_thinking_chunks):
            return None
        return sidecar_key(self.descriptor)

    def _parse(self, payload: dict[str, Any], *, model: str) -> AssistantTurn:
        return parse_completion(
            payload,
            model=model,
            reasoning_field=self.descriptor.compat.reasoning_field,
            sidecar=self._sidecar,
        )

    def _stream_parser(self, model: str) -> CompletionsStreamParser:
        return CompletionsStreamParser(
            model=model,
            reasoning_field=self.descriptor.compat.reasoning_field,
            sidecar=self._sidecar,
        )
