"""A fake Gemini API (`generativelanguage.googleapis.com/v1beta`).

`POST /v1beta/models/{model}:streamGenerateContent?alt=sse` (data-only SSE events, each a
`GenerateContentResponse` chunk, the last one carrying `finishReason` and the full
`usageMetadata`), `POST /v1beta/models/{model}:generateContent` (one response) and
`GET /v1beta/models`, with the key checked in `x-goog-api-key` (as the `google-genai` SDK
sends it). Errors have the API's `{"error": {"code", "message", "status"}}` shape; an
in-stream error is a `data:` event with that object, then the end of the body.

Request bodies are checked against the `google-genai` SDK's pydantic types (camelCase
aliases, unknown keys refused) and against rules the real API enforces: as many function
responses as the calling turn had calls, right after it; `thinkingLevel` and
`thinkingBudget` never together; and, like Gemini 3, the first function call of every
model turn after the last user text must carry a thought signature. Signatures are an
HMAC of the model and the part they sign, so a signature edited, moved to another part
or replayed to another model is refused ("Corrupted thought signature.").
`base_url` is what our client takes (`.../v1beta`); the SDK takes `root_url`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
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
)
from .server import (
    Event,
    Exchange,
    FakeServer,
    RecordedRequest,
    ResolvedUsage,
    pieces,
)
from .validate import gemini_request_problem

API_VERSION = "v1beta"
DEFAULT_MODELS = ("gemini-fake",)
SIGNING_KEY = b"openworker-fake-gemini-thought-signature"
# Google's documented placeholder for calls the model did not make itself.
FOREIGN_SIGNATURES = frozenset(
    {"skip_thought_signature_validator", "context_engineering_is_the_way_to_go"}
)
# Words per streamed text chunk: the real API streams a few tokens per event.
WORDS_PER_CHUNK = 3
_FINISH = {STOP_END: "STOP", STOP_TOOL_USE: "STOP", STOP_MAX_TOKENS: "MAX_TOKENS"}

# kind -> (status, status name, message); {model} is filled in.
_ERRORS: dict[str, tuple[int, str, str]] = {
    "rate_limit": (429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."),
    "quota": (
        429,
        "RESOURCE_EXHAUSTED",
        "You exceeded your current quota, please check your plan and billing details. For "
        "more information on this error, head to: https://ai.google.dev/gemini-api/docs/"
        "rate-limits.",
    ),
    "overloaded": (503, "UNAVAILABLE", "The model is overloaded. Please try again later."),
    "context_length": (
        400,
        "INVALID_ARGUMENT",
        "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
    ),
    "model_not_found": (
        404,
        "NOT_FOUND",
        "models/{model} is not found for API version v1beta, or is not supported for "
        "generateContent. Call ListModels to see the list of available models and their "
        "supported methods.",
    ),
    "auth": (400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key."),
    "permission": (403, "PERMISSION_DENIED", "The caller does not have permission"),
    "invalid_request": (400, "INVALID_ARGUMENT", "Request contains an invalid argument."),
    "server": (500, "INTERNAL", "An internal error has occurred. Please retry."),
}
_KIND_BY_STATUS = {
    400: "invalid_request",
    403: "permission",
    404: "model_not_found",
    429: "rate_limit",
    503: "overloaded",
}


def error_body(status: int, name: str, message: str, *, reason: str | None = None) -> dict:
    """Google's error envelope (with an ErrorInfo detail when a reason is given)."""
    error: dict[str, Any] = {"code": status, "message": message, "status": name}
    if reason:
        error["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": reason,
                "domain": "googleapis.com",
            }
        ]
    return {"error": error}


def sign(model: str, anchor: str) -> str:
    digest = hmac.new(SIGNING_KEY, f"{model}\x00{anchor}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def call_anchor(name: str, args: Any) -> str:
    return "call:" + name + ":" + json.dumps(args or {}, sort_keys=True, separators=(",", ":"))


def text_anchor(parts: list[Any]) -> str:
    return "text:" + "".join(
        p.get("text", "") for p in parts if isinstance(p, dict) and not p.get("thought")
    )


class GeminiFake(FakeServer):
    """Fake Gemini server. `require_signatures` (default on) enforces Gemini 3's rule."""

    api_prefix = "/" + API_VERSION
    provider = "gemini"

    def __init__(
        self,
        *,
        require_signatures: bool = True,
        stream_arguments: bool = False,
        close_streamed_calls: bool = True,
        **options: Any,
    ) -> None:
        """`stream_arguments`: stream each call's arguments as Gemini 3 does with
        `streamFunctionCallArguments` (see `streamed_call_parts`); `close_streamed_calls`
        False leaves out the closing empty `functionCall`, as the API sometimes does."""
        super().__init__(**options)
        self.require_signatures = require_signatures
        self.stream_arguments = stream_arguments
        self.close_streamed_calls = close_streamed_calls

    def prompt_parts(self, body: dict[str, Any]) -> list[Any]:
        return [body.get("systemInstruction"), body.get("contents"), body.get("tools")]

    # -- routing --------------------------------------------------------------------

    def handle(self, exchange: Exchange) -> None:
        request = exchange.request
        prefix = f"/{API_VERSION}/models"
        if not self._check_key(exchange):
            return
        if request.method == "GET" and request.path == prefix:
            models = sorted(self.models) if self.models is not None else list(DEFAULT_MODELS)
            exchange.send_json(200, {"models": [_model(m) for m in models]})
            return
        model, _, method = request.path.removeprefix(prefix + "/").partition(":")
        if (
            request.method != "POST"
            or not request.path.startswith(prefix + "/")
            or method not in ("generateContent", "streamGenerateContent")
        ):
            self._error(exchange, 404, "NOT_FOUND", f"Method not found: {request.path}")
            return
        stream = method == "streamGenerateContent"
        if stream and "alt=sse" not in exchange._handler.path.partition("?")[2]:
            # Without alt=sse the API streams one JSON array: not what this fake speaks.
            self._error(exchange, 400, "INVALID_ARGUMENT", "this fake streams only with alt=sse")
            return
        if self.models is not None and model not in self.models:
            status, body = self._error_for(HttpError(None, kind="model_not_found"), model)
            exchange.send_json(status, body)
            return
        problem = self.check_request(request.body, model=model)
        if problem is not None and self.validate:
            self._error(exchange, 400, "INVALID_ARGUMENT", problem)
            return
        body = request.body if isinstance(request.body, dict) else {}
        reply = self.script.next_reply(last_user_text(body.get("contents") or []))
        renderer = GeminiRenderer(self, request, reply, model)
        self.play(
            exchange,
            reply,
            renderer,
            stream=stream,
            error_response=lambda err: self._error_response(err, model),
        )

    def _check_key(self, exchange: Exchange) -> bool:
        if self.api_key is None:
            return True
        key = exchange.request.headers.get("x-goog-api-key")
        if not key:
            self._error(
                exchange,
                403,
                "PERMISSION_DENIED",
                "Method doesn't allow unregistered callers (callers without established "
                "identity). Please use API Key or other form of API consumer identity to "
                "call this API.",
            )
            return False
        if key != self.api_key:
            status, name, message = _ERRORS["auth"]
            exchange.send_json(status, error_body(status, name, message, reason="API_KEY_INVALID"))
            return False
        return True

    # -- errors ---------------------------------------------------------------------

    def _error(self, exchange: Exchange, status: int, name: str, message: str) -> None:
        exchange.send_json(status, error_body(status, name, message))

    def _error_for(self, err: HttpError, model: str) -> tuple[int, dict[str, Any]]:
        kind = err.kind or _KIND_BY_STATUS.get(err.status or 500, "server")
        status, name, message = _ERRORS.get(kind, _ERRORS["server"])
        reason = "API_KEY_INVALID" if kind == "auth" else None
        text = err.message or message.format(model=model)
        return err.status or status, error_body(err.status or status, name, text, reason=reason)

    def _error_response(
        self, err: HttpError, model: str
    ) -> tuple[int, dict[str, Any] | str, dict[str, str]]:
        status, body = self._error_for(err, model)
        if err.body is not None:
            return status, err.body, dict(err.headers)
        return status, body, dict(err.headers)

    # -- validation -----------------------------------------------------------------

    def check_request(self, body: Any, *, model: str) -> str | None:
        """The message of the 400 the real API would answer, or None."""
        if not isinstance(body, dict):
            return "Invalid JSON payload received."
        problem = gemini_request_problem(body) or _signature_problem(body)
        if problem is not None:
            return problem
        thinking = (body.get("generationConfig") or {}).get("thinkingConfig") or {}
        if "thinkingLevel" in thinking and "thinkingBudget" in thinking:
            return "You can only set only one of thinking budget and thinking level."
        contents = body.get("contents") or []
        if not contents:
            return "* GenerateContentRequest.contents: contents is not specified"
        return self._check_turns(contents, model)

    def _check_turns(self, contents: list[dict[str, Any]], model: str) -> str | None:
        last_user_text = max(
            (
                i
                for i, c in enumerate(contents)
                if c.get("role") == "user" and any("text" in p for p in c.get("parts") or [])
            ),
            default=-1,
        )
        pending = 0
        for position, content in enumerate(contents):
            parts = content.get("parts") or []
            if not parts:
                return f"* GenerateContentRequest.contents[{position}].parts: must not be empty"
            responses = sum(1 for p in parts if "functionResponse" in p)
            if responses and responses != pending:
                return (
                    "Please ensure that the number of function response parts is equal to "
                    "the number of function call parts of the function call turn."
                )
            calls = [p for p in parts if "functionCall" in p]
            pending = len(calls) if content.get("role") == "model" else 0
            if content.get("role") != "model":
                continue
            for part in parts:
                problem = self._check_signature(part, parts, model)
                if problem:
                    return problem
            current = position > last_user_text
            if (
                self.require_signatures
                and current
                and calls
                and not calls[0].get("thoughtSignature")
            ):
                name = calls[0]["functionCall"].get("name")
                return (
                    "Function call is missing a thought_signature in functionCall parts. "
                    "This is required for tools to work correctly, and missing "
                    "thought_signature may lead to degraded model performance. Additional "
                    f"data, function call `default_api:{name}` , position {position + 1}. "
                    "Please refer to https://ai.google.dev/gemini-api/docs/thought-signatures "
                    "for more details."
                )
        return None

    def _check_signature(self, part: dict[str, Any], parts: list[Any], model: str) -> str | None:
        signature = part.get("thoughtSignature")
        if not signature or signature in FOREIGN_SIGNATURES:
            return None
        call = part.get("functionCall")
        if call is not None:
            anchor = call_anchor(call.get("name", ""), call.get("args"))
        else:
            anchor = text_anchor(parts)
        if not hmac.compare_digest(str(signature), sign(model, anchor)):
            return "Corrupted thought signature."
        return None


def _signature_problem(body: dict[str, Any]) -> str | None:
    for content in body.get("contents") or []:
        if content.get("role") not in ("user", "model"):
            return f"Please use a valid role: user, model (got {content.get('role')!r})."
        for part in content.get("parts") or []:
            signature = part.get("thoughtSignature")
            if signature and signature not in FOREIGN_SIGNATURES:
                try:
                    base64.b64decode(signature, validate=True)
                except (binascii.Error, ValueError):
                    return "Invalid value at 'thought_signature' (TYPE_BYTES): invalid base64"
    return None


class GeminiRenderer:
    """Renders one reply as `GenerateContentResponse` chunks or one whole response."""

    def __init__(self, fake: GeminiFake, request: RecordedRequest, reply: Reply, model: str):
        self.fake = fake
        self.reply = reply
        self.model = model
        self.id = secrets.token_urlsafe(16)
        self.usage: ResolvedUsage = fake.resolve_usage(request, reply)
        self.parts: list[dict[str, Any]] = []
        self.thinks = any(isinstance(s, Reasoning) for s in reply.steps) or model.startswith(
            "gemini-3"
        )

    # -- stream ---------------------------------------------------------------------

    def start_events(self) -> list[Event]:
        return []

    def step_events(self, step: Step) -> list[Event]:
        if isinstance(step, Text):
            self._append({"text": step.text})
            words = pieces(step.text)
            return [
                self._chunk([{"text": "".join(words[i : i + WORDS_PER_CHUNK])}])
                for i in range(0, len(words), WORDS_PER_CHUNK)
            ]
        if isinstance(step, Reasoning):
            self._append({"text": step.text, "thought": True})
            return [self._chunk([{"text": step.text, "thought": True}])]
        if isinstance(step, ToolCall):
            function: dict[str, Any] = {"name": step.name, "args": step.arguments}
            if step.id:
                function["id"] = step.id
            part: dict[str, Any] = {"functionCall": function}
            first_call = not any("functionCall" in p for p in self.parts)
            if self.thinks and first_call:
                part["thoughtSignature"] = sign(self.model, call_anchor(step.name, step.arguments))
            self.parts.append(part)
            if self.fake.stream_arguments:
                parts = streamed_call_parts(part, close=self.fake.close_streamed_calls)
                return [self._chunk([p]) for p in parts]
            return [self._chunk([part])]
        return []

    def error_events(self, step: ErrorEvent) -> list[Event]:
        _, body = self.fake._error_for(
            HttpError(None, kind=step.kind, message=step.message), self.model
        )
        return [(None, body)]

    def finish_events(self) -> list[Event]:
        parts = []
        signature = self._text_signature()
        if signature:
            parts.append({"text": "", "thoughtSignature": signature})
        return [self._chunk(parts, final=True)]

    # -- whole response -------------------------------------------------------------

    def message(self) -> dict[str, Any]:
        parts = [dict(p) for p in self.parts]
        signature = self._text_signature()
        if signature:
            texts = [p for p in parts if p.get("text") and not p.get("thought")]
            texts[-1]["thoughtSignature"] = signature
        return self._response(parts, final=True)

    # -- internals ------------------------------------------------------------------

    def _append(self, part: dict[str, Any]) -> None:
        last = self.parts[-1] if self.parts else None
        same = (
            last is not None
            and "text" in last
            and bool(last.get("thought")) == bool(part.get("thought"))
        )
        if same:
            last["text"] += part["text"]
        else:
            self.parts.append(dict(part))

    def _text_signature(self) -> str | None:
        """A thinking reply without calls signs its text (as the last, or an empty, part)."""
        if not self.thinks or any("functionCall" in p for p in self.parts):
            return None
        if not any(p.get("text") and not p.get("thought") for p in self.parts):
            return None
        return sign(self.model, text_anchor(self.parts))

    @property
    def finish_reason(self) -> str:
        if self.reply.stop is not None:
            return _FINISH.get(self.reply.stop, self.reply.stop)
        return "STOP"

    def _usage(self, final: bool) -> dict[str, Any]:
        usage = self.usage
        prompt = usage.input + usage.cache_read
        metadata: dict[str, Any] = {"promptTokenCount": prompt}
        if usage.cache_read:
            metadata["cachedContentTokenCount"] = usage.cache_read
        if final:
            thoughts = min(usage.reasoning or 0, usage.output)
            metadata["candidatesTokenCount"] = usage.output - thoughts
            if thoughts:
                metadata["thoughtsTokenCount"] = thoughts
            metadata["totalTokenCount"] = prompt + usage.output
        else:
            metadata["totalTokenCount"] = prompt
        return metadata

    def _response(self, parts: list[dict[str, Any]], *, final: bool) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
        if final:
            candidate["finishReason"] = self.finish_reason
        return {
            "candidates": [candidate],
            "usageMetadata": self._usage(final),
            "modelVersion": self.model,
            "responseId": self.id,
        }

    def _chunk(self, parts: list[dict[str, Any]], *, final: bool = False) -> Event:
        return (None, self._response(parts, final=final))


# Characters per streamed string fragment: short enough that a value spans several parts.
STRING_FRAGMENT_CHARS = 4
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def streamed_call_parts(part: dict[str, Any], *, close: bool = True) -> list[dict[str, Any]]:
    """One whole `functionCall` part as Gemini 3 streams it with argument streaming: the
    name (and id, and the thought signature) with `willContinue`, then one part per
    `partialArgs` entry (each leaf at its JSON path, strings in several pieces), then an
    empty `functionCall` that closes the call (left out when `close` is False)."""
    call = part["functionCall"]
    opening: dict[str, Any] = {"name": call["name"], "willContinue": True}
    if call.get("id"):
        opening["id"] = call["id"]
    first: dict[str, Any] = {"functionCall": opening}
    if part.get("thoughtSignature"):
        first["thoughtSignature"] = part["thoughtSignature"]
    out = [first]
    for path, value in _leaves(call.get("args") or {}, "$"):
        for entry in _partial_args(path, value):
            out.append({"functionCall": {"partialArgs": [entry], "willContinue": True}})
    if close:
        out.append({"functionCall": {}})
    return out


def _leaves(value: Any, path: str) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        found: list[tuple[str, Any]] = []
        for key, item in value.items():
            step = f".{key}" if _IDENTIFIER.fullmatch(key) else "[" + json.dumps(key) + "]"
            found.extend(_leaves(item, path + step))
        return found
    if isinstance(value, list):
        return [leaf for i, item in enumerate(value) for leaf in _leaves(item, f"{path}[{i}]")]
    return [(path, value)]


def _partial_args(path: str, value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        size = STRING_FRAGMENT_CHARS
        pieces_ = [value[i : i + size] for i in range(0, len(value), size)] or [""]
        return [
            {"jsonPath": path, "stringValue": piece, "willContinue": i < len(pieces_) - 1}
            for i, piece in enumerate(pieces_)
        ]
    if isinstance(value, bool):
        return [{"jsonPath": path, "boolValue": value}]
    if isinstance(value, int | float):
        return [{"jsonPath": path, "numberValue": value}]
    return [{"jsonPath": path, "nullValue": "NULL_VALUE"}]


def last_user_text(contents: list[Any]) -> str:
    """Text of the last user content; function responses count when there is no text."""
    for content in reversed(contents):
        if not isinstance(content, dict) or content.get("role") != "user":
            continue
        texts: list[str] = []
        for part in content.get("parts") or []:
            if not isinstance(part, dict):
                continue
            if "text" in part:
                texts.append(str(part["text"]))
            elif "functionResponse" in part:
                response = part["functionResponse"].get("response") or {}
                value = response.get("output", response.get("error", ""))
                texts.append(value if isinstance(value, str) else json.dumps(value))
        return "".join(texts)
    return ""


def _model(model_id: str) -> dict[str, Any]:
    return {
        "name": f"models/{model_id}",
        "displayName": model_id,
        "inputTokenLimit": 1_048_576,
        "outputTokenLimit": 65_536,
        "supportedGenerationMethods": ["generateContent", "countTokens"],
    }
