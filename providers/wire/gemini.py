"""Gemini API (`generativelanguage.googleapis.com/v1beta`).

`POST {base}/models/{model}:streamGenerateContent?alt=sse` streams; `POST
{base}/models/{model}:generateContent` answers whole. Context → wire request
(`build_request`), and the reply → canonical shapes (`GeminiStreamParser`, which also
parses one whole `GenerateContentResponse`). The key travels in the `x-goog-api-key`
header: never in the query string, where it would be logged.

Translation (seed 002): the system prompt becomes `systemInstruction`; assistant messages
are role `model`; tool results are `functionResponse` parts in a `user` content, carrying
the function NAME (Gemini matches responses to calls by name and order) found from the
assistant tool call with the same id, plus the call's `id` when the API issued one.

Thought signatures: Gemini returns opaque `thoughtSignature`s on response parts (the first
`functionCall` of every step on Gemini 3, the last text part otherwise, sometimes a final
empty text part) and wants them back on the same parts. They are model-bound, so they are
kept in the turn's `extras["_gemini"] = {"model": <bare model>, "signatures": [...],
"api_ids": bool}` and put back only when the same model sees that history again. Each
signature names its `position` in the replayed parts of that message and the `kind` of
part it belongs to (see `replay_layout`); a signature whose part no longer matches (an
edited history) is dropped rather than moved. Tool calls another model made, or that
this model made without a signature, get Google's documented placeholder signature on the
first call of the message, since Gemini 3 refuses an unsigned call in the current turn.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from .. import errors, reasoning
from ..context import build_context, content_parts, content_text, parse_data_url
from ..registry import ProviderDescriptor
from ..types import AssistantTurn, Context, ModelCapabilities, StreamChunk, TokenUsage, ToolCall
from ._http_client import HttpProviderClient, Prepared
from .openai_completions import parse_tool_arguments

logger = logging.getLogger(__name__)

GENERATE_PATH = "/models/{model}:generateContent"
STREAM_PATH = "/models/{model}:streamGenerateContent?alt=sse"
SIDECAR = "_gemini"
# Google's documented placeholder for function calls the model did not produce itself
# (another vendor's turns, a model switch): it passes Gemini 3's signature validation.
FOREIGN_SIGNATURE = "skip_thought_signature_validator"
# Gemini 2.5 Pro only works in thinking mode: a zero budget ("off") is a 400 there, so
# "off" sends no budget to it (the model's dynamic default applies).
_ALWAYS_THINKS = re.compile(r"gemini-2\.5-pro")
# The JSON Schema subset `FunctionDeclaration.parameters` (an OpenAPI 3.0 Schema) takes.
# Anything else is dropped: `$schema`, `$id`, `$comment`, `additionalProperties`,
# `unevaluatedProperties`, `patternProperties`, `dependentRequired`, `not`, `if`/`then`/
# `else`, `examples`, `default`, `title`, `readOnly`/`writeOnly`, `contentEncoding`...
# `$ref` to local `$defs`/`definitions` is inlined (a cycle becomes an untyped schema),
# `const` becomes a one-value enum, `oneOf` becomes `anyOf`, `type: [T, "null"]` and a null
# branch of `anyOf` become `nullable`, and `allOf` is merged.
_SCHEMA_SCALARS = (
    "description",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
)
# `format` is refused unless it is one the API knows for that type.
_FORMATS = {
    "STRING": frozenset({"enum", "date-time"}),
    "NUMBER": frozenset({"float", "double"}),
    "INTEGER": frozenset({"int32", "int64"}),
}
_SCHEMA_TYPES = frozenset({"STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"})
# Nesting past this is not a tool schema but a runaway one; deeper levels are left untyped.
MAX_SCHEMA_DEPTH = 32


# --- tool schemas ------------------------------------------------------------------------


def gemini_schema(schema: Any) -> dict[str, Any]:
    """A JSON Schema → the Schema subset Gemini accepts (see the module's list)."""
    root = schema if isinstance(schema, Mapping) else {}
    defs: dict[str, Any] = {}
    for key in ("$defs", "definitions"):
        if isinstance(root.get(key), Mapping):
            defs.update({f"#/{key}/{name}": value for name, value in root[key].items()})
    return _convert(root, defs, (), 0)


def _convert(node: Any, defs: Mapping[str, Any], seen: tuple[str, ...], depth: int) -> dict:
    if not isinstance(node, Mapping) or depth > MAX_SCHEMA_DEPTH:
        return {}
    ref = node.get("$ref")
    if isinstance(ref, str):
        target = defs.get(ref)
        if target is None or ref in seen:
            out: dict[str, Any] = {}
        else:
            out = _convert(target, defs, (*seen, ref), depth + 1)
        if isinstance(node.get("description"), str):
            out["description"] = node["description"]
        return out
    node = _merge_all_of(node)
    out = {}
    nullable = False
    kind: Any = node.get("type")
    if isinstance(kind, list):
        nullable = "null" in kind
        rest = [t for t in kind if t != "null"]
        if len(rest) > 1:
            variants = [_convert({**node, "type": t}, defs, seen, depth + 1) for t in rest]
            return {"anyOf": variants, **({"nullable": True} if nullable else {})}
        kind = rest[0] if rest else "null"
    variants = node.get("anyOf") or node.get("oneOf")
    if isinstance(variants, list):
        branches = [v for v in variants if isinstance(v, Mapping)]
        if any(v.get("type") == "null" for v in branches):
            nullable = True
            branches = [v for v in branches if v.get("type") != "null"]
        converted = [_convert(v, defs, seen, depth + 1) for v in branches]
        if len(converted) == 1:
            out.update(converted[0])
        elif converted:
            out["anyOf"] = converted
    if isinstance(kind, str) and kind.upper() in _SCHEMA_TYPES:
        out["type"] = kind.upper()
    for key in _SCHEMA_SCALARS:
        if key in node and not isinstance(node[key], Mapping | list):
            out[key] = node[key]
    enum = [node["const"]] if "const" in node else node.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        out["enum"] = list(enum)
        out.setdefault("type", "STRING")
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt in _FORMATS.get(out.get("type", ""), ()):
        out["format"] = fmt
    properties = node.get("properties")
    if isinstance(properties, Mapping) and properties:
        out["properties"] = {
            str(name): _convert(value, defs, seen, depth + 1) for name, value in properties.items()
        }
        required = [r for r in node.get("required") or [] if r in properties]
        if required:
            out["required"] = required
    items = node.get("items")
    if isinstance(items, Mapping):
        out["items"] = _convert(items, defs, seen, depth + 1)
    if nullable or node.get("nullable") is True:
        out["nullable"] = True
    return out


def _merge_all_of(node: Mapping[str, Any]) -> Mapping[str, Any]:
    """Fold `allOf` branches into the node: their properties and required lists join."""
    branches = node.get("allOf")
    if not isinstance(branches, list):
        return node
    merged: dict[str, Any] = {k: v for k, v in node.items() if k != "allOf"}
    for branch in branches:
        if not isinstance(branch, Mapping):
            continue
        for key, value in branch.items():
            if key == "properties" and isinstance(value, Mapping):
                merged["properties"] = {**(merged.get("properties") or {}), **value}
            elif key == "required" and isinstance(value, list):
                merged["required"] = [*(merged.get("required") or []), *value]
            else:
                merged.setdefault(key, value)
    return merged


def _build_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Canonical tools → one `functionDeclarations` tool. `cache_control` has no meaning
    here (Gemini caches out of band) and is dropped. A declaration without parameters
    omits them: the API refuses an OBJECT whose `properties` is empty."""
    declarations = []
    for tool in tools:
        declaration: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description"):
            declaration["description"] = tool["description"]
        parameters = gemini_schema(tool.get("parameters"))
        if parameters.get("properties"):
            declaration["parameters"] = parameters
        declarations.append(declaration)
    return [{"functionDeclarations": declarations}]


# --- Context → request -------------------------------------------------------------------


def _inline(media_type: str, data: str) -> dict[str, Any]:
    return {"inlineData": {"mimeType": media_type, "data": data}}


def _user_parts(content: Any) -> list[dict[str, Any]]:
    """Canonical parts → text and `inlineData` parts (images and PDFs travel inline).

    An image given by http(s) URL becomes a text note: the API reads only inline bytes and
    its own uploaded files, and fetching arbitrary URLs here would bypass the SSRF guard.
    """
    parts: list[dict[str, Any]] = []
    for part in content_parts(content):
        kind = part.get("type")
        if kind == "text" and part.get("text"):
            parts.append({"text": part["text"]})
        elif kind == "image_url":
            image = part.get("image_url") or {}
            url = image.get("url") if isinstance(image, Mapping) else image
            parsed = parse_data_url(url or "")
            if parsed is not None:
                parts.append(_inline(*parsed))
            elif url:
                parts.append({"text": f"[image: {url}]"})
        elif kind == "file":
            file = part.get("file") or {}
            file_data = file.get("file_data") or ""
            parsed = parse_data_url(file_data)
            data = parsed[1] if parsed is not None else file_data
            if data:
                parts.append(_inline("application/pdf", data))
    return parts


def _arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    arguments = call.get("arguments")
    if isinstance(arguments, str):
        arguments, _ = parse_tool_arguments(arguments)
    return dict(arguments or {})


def is_generated_id(call_id: str, name: str) -> bool:
    """True for the ids this module makes up when the API gives none (`call_<n>_<name>`)."""
    prefix, _, rest = (call_id or "").partition("_")
    number, _, tail = rest.partition("_")
    return prefix == "call" and number.isdigit() and tail == name


def _sidecar(message: Mapping[str, Any]) -> Mapping[str, Any]:
    sidecar = (message.get("extras") or {}).get(SIDECAR)
    return sidecar if isinstance(sidecar, Mapping) else {}


def _model_parts(message: Mapping[str, Any], model: str) -> list[dict[str, Any]]:
    """An assistant message → its `model` parts: text first, then one part per call, with
    the signatures re-attached when `model` produced them (see the module docstring)."""
    parts: list[dict[str, Any]] = []
    text = content_text(message.get("content"))
    if text:
        parts.append({"text": text})
    sidecar = _sidecar(message)
    send_ids = bool(sidecar.get("api_ids"))
    calls = message.get("tool_calls") or []
    for call in calls:
        function: dict[str, Any] = {"name": call["name"], "args": _arguments(call)}
        if send_ids and call.get("id") and not is_generated_id(call["id"], call["name"]):
            function["id"] = call["id"]
        parts.append({"functionCall": function})
    own = sidecar.get("model") == model
    if own:
        _attach_signatures(parts, sidecar.get("signatures") or [])
    if calls and not any("thoughtSignature" in p for p in parts if "functionCall" in p):
        first = next(p for p in parts if "functionCall" in p)
        first["thoughtSignature"] = FOREIGN_SIGNATURE
    return parts


def _part_kind(part: Mapping[str, Any]) -> str:
    if "functionCall" in part:
        return "call"
    return "text" if part.get("text") else "empty"


def _attach_signatures(parts: list[dict[str, Any]], signatures: list[Any]) -> None:
    entries = [s for s in signatures if isinstance(s, Mapping) and s.get("signature")]
    for entry in sorted(entries, key=lambda s: int(s.get("position", 0))):
        position, kind = int(entry.get("position", 0)), entry.get("kind")
        if kind == "empty" and 0 <= position <= len(parts):
            parts.insert(position, {"text": "", "thoughtSignature": entry["signature"]})
        elif 0 <= position < len(parts) and _part_kind(parts[position]) == kind:
            parts[position]["thoughtSignature"] = entry["signature"]


def _function_response(message: Mapping[str, Any], name: str, call_id: str | None) -> dict:
    """A tool message → a `functionResponse` part. The API reads an `output` key as the
    function's result and an `error` key as its failure."""
    text = content_text(message.get("content"))
    key = "error" if message.get("is_error") else "output"
    response: dict[str, Any] = {"name": name, "response": {key: text}}
    if call_id:
        response["id"] = call_id
    return {"functionResponse": response}


def _build_contents(ctx: Context, *, model: str) -> list[dict[str, Any]]:
    """Canonical dialogue → `contents`. Consecutive tool results share one `user` content
    (the API wants as many responses as the calling turn had calls, together); a user
    message after them is a content of its own."""
    out: list[dict[str, Any]] = []
    calls: dict[str, tuple[str, bool]] = {}
    previous_role: str | None = None
    for message in ctx.messages:
        role = message.get("role")
        if role == "user":
            parts = _user_parts(message.get("content"))
            if parts:
                out.append({"role": "user", "parts": parts})
        elif role == "assistant":
            api_ids = bool(_sidecar(message).get("api_ids"))
            for call in message.get("tool_calls") or []:
                calls[call.get("id") or ""] = (call["name"], api_ids)
            parts = _model_parts(message, model)
            if parts:
                out.append({"role": "model", "parts": parts})
        elif role == "tool":
            call_id = message.get("tool_call_id") or ""
            name, api_ids = calls.get(call_id, (message.get("name") or call_id, False))
            send_id = call_id if api_ids and not is_generated_id(call_id, name) else None
            part = _function_response(message, name, send_id)
            if previous_role == "tool" and out and out[-1]["role"] == "user":
                out[-1]["parts"].append(part)
            else:
                out.append({"role": "user", "parts": [part]})
        previous_role = role
    return out


def _thinking_config(
    model: str, settings: Mapping[str, Any], capabilities: ModelCapabilities | None
) -> dict[str, Any] | None:
    """`thinkingConfig` for a model known to think; None for the others (a model without
    thinking refuses the field). Thought summaries are always asked for (display only).

    The effort goes by the shape the model declares (`providers.reasoning`): Gemini 3
    ("effort") takes `thinkingLevel` with the level's name, Gemini 2.5 ("budget") takes
    `thinkingBudget` from the shared table, and sending the other one is a 400. "off" is a
    zero budget on 2.5 (no thoughts to include then) and nothing on Gemini 3, which has no
    level that switches thinking off on every model. Unknown shape: no effort field.
    """
    if capabilities is None or capabilities.reasoning is not True:
        return None
    config: dict[str, Any] = {"includeThoughts": True}
    level = reasoning.effort_from(settings)
    shape = capabilities.thinking
    if level is None:
        return config
    if shape == reasoning.THINKING_EFFORT and level != reasoning.OFF:
        # The SDK's own spelling of the enum (LOW, MEDIUM, HIGH).
        config["thinkingLevel"] = level.upper()
    elif shape == reasoning.THINKING_BUDGET:
        if level != reasoning.OFF:
            config["thinkingBudget"] = reasoning.thinking_budget(level)
        elif not _ALWAYS_THINKS.search(model):
            config = {"includeThoughts": False, "thinkingBudget": 0}
    return config


def build_request(
    ctx: Context,
    *,
    model: str,
    settings: Mapping[str, Any],
    capabilities: ModelCapabilities | None = None,
) -> dict[str, Any]:
    """The JSON body for `generateContent` / `streamGenerateContent` (the same for both).
    Key order is stable: instructions and tools before the growing conversation."""
    body: dict[str, Any] = {}
    if ctx.system_prompt:
        body["systemInstruction"] = {"parts": [{"text": ctx.system_prompt}]}
    if ctx.tools:
        body["tools"] = _build_tools(ctx.tools)
    body["contents"] = _build_contents(ctx, model=model)
    generation: dict[str, Any] = {}
    if settings.get("max_tokens"):
        generation["maxOutputTokens"] = int(settings["max_tokens"])
    if settings.get("temperature") is not None:
        generation["temperature"] = settings["temperature"]
    thinking = _thinking_config(model, settings, capabilities)
    if thinking is not None:
        generation["thinkingConfig"] = thinking
    if generation:
        body["generationConfig"] = generation
    return body


def request_headers(descriptor: ProviderDescriptor, api_key: str | None) -> dict[str, str]:
    """The key as `x-goog-api-key`; refuses before any I/O when it is missing."""
    if descriptor.requires_key and not api_key:
        name = descriptor.label or descriptor.name
        raise errors.AuthenticationError(
            f"no API key configured for {name}",
            friendly=f"No API key is configured for {name}. Add one in your provider settings.",
        )
    return {"x-goog-api-key": api_key} if api_key else {}


def model_path(model: str) -> str:
    """The model segment of the URL: `models/` is implied, the rest is escaped."""
    return quote(model.removeprefix("models/"), safe="-._~")


# --- Reply → canonical --------------------------------------------------------------------


# One step of an RFC 9535 normalized path: `.name`, `['name']` / `["name"]`, or `[n]`.
_PATH_STEP = re.compile(
    r"""\.(?P<name>[A-Za-z_][\w-]*)"""
    r"""|\[(?P<index>\d+)\]"""
    r"""|\['(?P<single>(?:[^'\\]|\\.)*)'\]"""
    r"""|\["(?P<double>(?:[^"\\]|\\.)*)"\]"""
)
# Keys of a part that are about the part, not what it holds.
_PART_METADATA = frozenset({"thought", "thoughtSignature", "partMetadata", "mediaResolution"})
_PARTIAL_VALUE_KEYS = ("stringValue", "numberValue", "boolValue", "nullValue")


def json_path_steps(path: str) -> list[str | int] | None:
    """`$.items[1].price` → ["items", 1, "price"]; None for a path that is not a plain
    normalized path (filters, wildcards, slices: the API streams none of them)."""
    if not path.startswith("$"):
        return None
    steps: list[str | int] = []
    position = 1
    while position < len(path):
        match = _PATH_STEP.match(path, position)
        if match is None:
            return None
        if match["index"] is not None:
            steps.append(int(match["index"]))
        else:
            quoted = match["single"] if match["single"] is not None else match["double"]
            name = match["name"] if quoted is None else re.sub(r"\\(.)", r"\1", quoted)
            steps.append(name)
        position = match.end()
    return steps


class StreamedArguments:
    """The arguments of one Gemini 3 call streamed as `partialArgs`: each fragment sets
    the value at its `jsonPath` (objects and arrays are made on the way), and a string
    fragment whose predecessor at the same path said `willContinue` is appended to it."""

    def __init__(self, initial: Mapping[str, Any] | None = None) -> None:
        self.value: dict[str, Any] = dict(initial or {})
        self._continuing: set[str] = set()

    def apply(self, fragment: Mapping[str, Any]) -> bool:
        """Apply one `PartialArg`; False (nothing changed) for one that cannot be read."""
        path = fragment.get("jsonPath")
        steps = json_path_steps(path) if isinstance(path, str) else None
        if not steps or not any(key in fragment for key in _PARTIAL_VALUE_KEYS):
            return False
        if "stringValue" in fragment:
            value: Any = str(fragment["stringValue"] or "")
            if path in self._continuing:
                previous = _get(self.value, steps)
                value = (previous if isinstance(previous, str) else "") + value
        elif "numberValue" in fragment:
            value = fragment["numberValue"]
        elif "boolValue" in fragment:
            value = bool(fragment["boolValue"])
        else:
            value = None
        if not _set(self.value, steps, value):
            return False
        if fragment.get("willContinue"):
            self._continuing.add(str(path))
        else:
            self._continuing.discard(str(path))
        return True


def _get(root: Any, steps: list[str | int]) -> Any:
    node = root
    for step in steps:
        if isinstance(step, int):
            if not isinstance(node, list) or step >= len(node):
                return None
            node = node[step]
        else:
            if not isinstance(node, dict):
                return None
            node = node.get(step)
    return node


def _set(root: dict[str, Any], steps: list[str | int], value: Any) -> bool:
    """Set `value` at `steps` under `root`, making the objects and arrays on the way (an
    array is padded with nulls up to the index). False when a step contradicts what is
    already there (an index into an object, a key into a string): nothing is overwritten."""
    node: Any = root
    for position, step in enumerate(steps):
        last = position == len(steps) - 1
        following: Any = None if last else ([] if isinstance(steps[position + 1], int) else {})
        if isinstance(step, int):
            if not isinstance(node, list):
                return False
            while len(node) <= step:
                node.append(None)
            if last:
                node[step] = value
            elif node[step] is None:
                node[step] = following
            node = node[step]
        else:
            if not isinstance(node, dict):
                return False
            if last:
                node[step] = value
            elif node.get(step) is None:
                node[step] = following
            node = node[step]
    return True


def usage_from_gemini(usage: Mapping[str, Any] | None) -> TokenUsage | None:
    """Map `usageMetadata`. `promptTokenCount` INCLUDES `cachedContentTokenCount`, so fresh
    input is what is left; `toolUsePromptTokenCount` (results of built-in tools) is prompt
    read on top of it and billed as input. Thinking is billed as output:
    `thoughtsTokenCount` is added to `candidatesTokenCount`. None when nothing reported."""
    if not isinstance(usage, Mapping):
        return None
    fields = ("promptTokenCount", "candidatesTokenCount", "thoughtsTokenCount")
    if not any(usage.get(name) is not None for name in fields):
        return None
    cached = _int(usage.get("cachedContentTokenCount"))
    prompt = _int(usage.get("promptTokenCount")) + _int(usage.get("toolUsePromptTokenCount"))
    return TokenUsage(
        input=max(0, prompt - cached),
        output=_int(usage.get("candidatesTokenCount")) + _int(usage.get("thoughtsTokenCount")),
        cache_read=cached,
    )


def _int(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


class GeminiStreamParser:
    """Accumulates `GenerateContentResponse` chunks into deltas and one final turn.

    `feed(event)` takes one SSE event, `feed_payload(payload)` one parsed response (the
    whole reply of `generateContent` is one). Only candidate 0 is read. Text parts become
    text, parts with `thought: true` reasoning, `functionCall` parts tool calls (one delta
    each, carrying the full arguments JSON). A Gemini 3 call with streamed arguments opens
    with `name` and `willContinue: true`, goes on in nameless `partialArgs` parts and closes
    with a `functionCall` that no longer continues (`{}`), a new call, or the finishReason
    (the API may leave out the closing part): it comes out once, when closed, with the
    assembled arguments. `usageMetadata` is cumulative: the last wins.
    There is no terminal event: `finish()` raises StreamError with the partial turn unless
    a `finishReason` (or a prompt `blockReason`) arrived. An `error` object in the stream
    raises the matching ProviderError at once.
    """

    def __init__(self, *, model: str) -> None:
        self.model = model
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[ToolCall] = []
        # A call whose arguments are still streaming (`willContinue`): (id, name, args).
        self._open: tuple[str, str, StreamedArguments] | None = None
        self._api_ids = False
        # (kind, calls seen before it, signature) in arrival order; see replay_layout.
        self._signatures: list[tuple[str, int, str]] = []
        self._finish: str | None = None
        self._usage: Mapping[str, Any] | None = None
        self._raw: dict[str, Any] = {}

    def feed(self, event: Any) -> list[StreamChunk]:
        data = (event.data or "").strip()
        if not data:
            return []
        try:
            payload = json.loads(data)
        except ValueError:
            raise self._stream_error(f"malformed stream chunk from {self.model}") from None
        if not isinstance(payload, Mapping):
            return []
        return self.feed_payload(payload)

    def feed_payload(self, payload: Mapping[str, Any]) -> list[StreamChunk]:
        if payload.get("error"):
            raise self._error(payload)
        for key in ("responseId", "modelVersion"):
            if payload.get(key) and key not in self._raw:
                self._raw[key] = payload[key]
        if isinstance(payload.get("usageMetadata"), Mapping):
            self._usage = payload["usageMetadata"]
        feedback = payload.get("promptFeedback") or {}
        if isinstance(feedback, Mapping) and feedback.get("blockReason"):
            self._finish = str(feedback["blockReason"])
        chunks: list[StreamChunk] = []
        for candidate in payload.get("candidates") or []:
            if not isinstance(candidate, Mapping) or candidate.get("index", 0) != 0:
                continue
            content = candidate.get("content") or {}
            for part in content.get("parts") or [] if isinstance(content, Mapping) else []:
                if isinstance(part, Mapping):
                    chunks.extend(self._part(part))
            if candidate.get("finishReason"):
                chunks.extend(self._close_open())
                self._finish = str(candidate["finishReason"])
        return chunks

    def _part(self, part: Mapping[str, Any]) -> list[StreamChunk]:
        signature = part.get("thoughtSignature")
        call = part.get("functionCall")
        if isinstance(call, Mapping):
            return self._function_call(call, signature)
        text = part.get("text")
        if not isinstance(text, str):
            if not signature:
                kinds = sorted(k for k in part if k not in _PART_METADATA)
                logger.debug("gemini: skipped a part of kind %s", kinds)
            text = ""
        if part.get("thought"):
            if signature:
                self._signatures.append(("empty", self._call_count(), str(signature)))
            if text:
                self._reasoning.append(text)
                return [StreamChunk(reasoning=text)]
            return []
        if signature:
            kind = "text" if text else "empty"
            self._signatures.append((kind, self._call_count(), str(signature)))
        if text:
            self._text.append(text)
            return [StreamChunk(text=text)]
        return []

    def _function_call(self, call: Mapping[str, Any], signature: Any) -> list[StreamChunk]:
        """One `functionCall` part: a whole call, the start, a piece or the end of a call
        with streamed arguments (see the class docstring)."""
        name = str(call.get("name") or "")
        fragments = call.get("partialArgs")
        fragments = (
            [f for f in fragments if isinstance(f, Mapping)] if isinstance(fragments, list) else []
        )
        if not name:
            if self._open is None:
                if fragments or call.get("args"):
                    logger.debug("gemini: skipped argument fragments of no open call")
                return []
            arguments = self._open[2]
            for fragment in fragments:
                if not arguments.apply(fragment):
                    logger.debug("gemini: skipped an unreadable partialArgs entry")
            if signature:
                self._signatures.append(("call", len(self._calls), str(signature)))
            return [] if call.get("willContinue") else self._close_open()
        chunks = self._close_open()
        ordinal = len(self._calls)
        call_id = call.get("id")
        if call_id:
            self._api_ids = True
        else:
            call_id = f"call_{ordinal}_{name}"
        initial = call.get("args")
        arguments = StreamedArguments(initial if isinstance(initial, Mapping) else None)
        for fragment in fragments:
            arguments.apply(fragment)
        if signature:
            self._signatures.append(("call", ordinal, str(signature)))
        self._open = (str(call_id), name, arguments)
        if not call.get("willContinue"):
            chunks.extend(self._close_open())
        return chunks

    def _close_open(self) -> list[StreamChunk]:
        """Close the call whose arguments were streaming: into the turn, out as a delta."""
        if self._open is None:
            return []
        call = self._open_call()
        self._open = None
        ordinal = len(self._calls)
        self._calls.append(call)
        delta = {
            "index": ordinal,
            "id": call.id,
            "name": call.name,
            "arguments": json.dumps(call.arguments, ensure_ascii=False),
        }
        return [StreamChunk(tool_call_delta=delta)]

    def _call_count(self) -> int:
        return len(self._calls) + (self._open is not None)

    def _open_call(self) -> ToolCall:
        assert self._open is not None
        call_id, name, arguments = self._open
        return ToolCall(id=call_id, name=name, arguments=json.loads(json.dumps(arguments.value)))

    def _error(self, payload: Mapping[str, Any]) -> errors.ProviderError:
        error = payload.get("error")
        code = error.get("code") if isinstance(error, Mapping) else None
        body = json.dumps(dict(payload), ensure_ascii=False)
        if isinstance(code, int) and code >= 400:
            exc = errors.error_from_response(code, body, model=self.model)
            exc.partial = self.partial_turn()
            return exc
        return errors.error_from_event(dict(payload), model=self.model, partial=self.partial_turn())

    def replay_layout(self) -> list[dict[str, Any]]:
        """The sidecar's signature list, positioned in the parts `_model_parts` rebuilds:
        the text (if any) first, then the calls in order, with a signature that came on an
        empty or thought part as a signature-only part after the calls that preceded it.
        Positions are final: replaying them in ascending order rebuilds the layout."""
        text_signature: str | None = None
        call_signatures: dict[int, str] = {}
        alone: dict[int, list[str]] = {}
        for kind, calls_before, signature in self._signatures:
            if kind == "text":
                text_signature = signature  # one text part on replay: the last one wins
            elif kind == "call":
                call_signatures[calls_before] = signature
            else:
                alone.setdefault(calls_before, []).append(signature)
        slots: list[tuple[str, str | None]] = []
        if "".join(self._text):
            slots.append(("text", text_signature))
        count = self._call_count()
        for ordinal in range(count + 1):
            slots.extend(("empty", signature) for signature in alone.get(ordinal, []))
            if ordinal < count:
                slots.append(("call", call_signatures.get(ordinal)))
        return [
            {"position": position, "kind": kind, "signature": signature}
            for position, (kind, signature) in enumerate(slots)
            if signature
        ]

    def partial_turn(self) -> AssistantTurn:
        extras: dict[str, Any] = {}
        signatures = self.replay_layout()
        if signatures or self._api_ids:
            extras[SIDECAR] = {
                "model": self.model,
                "signatures": signatures,
                "api_ids": self._api_ids,
            }
        calls = list(self._calls)
        if self._open is not None:
            calls.append(self._open_call())
        return AssistantTurn(
            text="".join(self._text) or None,
            tool_calls=calls,
            finish_reason=self._finish,
            raw=self._raw or None,
            reasoning="".join(self._reasoning) or None,
            extras=extras,
            usage=usage_from_gemini(self._usage),
        )

    def finish(self) -> AssistantTurn:
        if self._finish is None:
            raise self._stream_error(f"the reply from {self.model} ended without a finishReason")
        return self.partial_turn()

    def _stream_error(self, message: str) -> errors.StreamError:
        return errors.StreamError(message, model=self.model, partial=self.partial_turn())


def parse_response(payload: Mapping[str, Any], *, model: str) -> AssistantTurn:
    """A whole `GenerateContentResponse` → AssistantTurn."""
    parser = GeminiStreamParser(model=model)
    parser.feed_payload(payload)
    return parser.finish()


# --- The client ---------------------------------------------------------------------------


class GeminiClient(HttpProviderClient):
    """A `ProviderClient` for the Gemini API. Receives BARE model names. Owns `transport`:
    `close()` closes it. Streams have no terminal event: the parser reads to the end of
    the body, and `finish()` wants a finishReason."""

    def url(self, model: str, *, stream: bool) -> str:
        path = STREAM_PATH if stream else GENERATE_PATH
        return self.base_url + path.format(model=model_path(model))

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
            settings=settings,
            capabilities=self._capabilities(model),
        )
        return self.url(model, stream=stream), headers, body

    def _parse(self, payload: dict[str, Any], *, model: str) -> AssistantTurn:
        return parse_response(payload, model=model)

    def _stream_parser(self, model: str) -> GeminiStreamParser:
        return GeminiStreamParser(model=model)
