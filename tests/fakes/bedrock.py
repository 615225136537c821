"""A fake Amazon Bedrock Runtime speaking Converse and ConverseStream.

`POST /model/{modelId}/converse` answers one JSON object; `POST
/model/{modelId}/converse-stream` answers `application/vnd.amazon.eventstream`: binary
frames built with `providers.eventstream.encode_message` (the framing our client decodes
is produced by our encoder, so the framing itself is also checked against botocore's
decoder in tests/providers/test_eventstream.py). Events carry `:event-type`,
`:content-type` and `:message-type` headers and a JSON payload with the random `p`
padding field the real service adds; in-stream faults are `:message-type: exception`
frames (`:exception-type: throttlingException`...).

Authentication is checked the two ways Bedrock takes it: `Authorization: Bearer <API
key>`, or SigV4, recomputed here with botocore's signer from the known secret (an
implementation independent of ours) over the exact bytes and headers received. Request
bodies are validated against the bedrock-runtime service model with botocore's
parameter validator (unknown or misspelt fields fail), plus the conversation rules the
service enforces itself (user first, alternating roles, no blank text, toolResult ids
answering the previous toolUse blocks).

Reasoning blocks are signed with an HMAC of their text; a reasoningText sent back with a
signature that does not match is refused, as the real model refuses an edited block.
Errors use Bedrock's shape: a `{"message": ...}` body and an `x-amzn-errortype` header.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
import re
import secrets
import uuid
from typing import Any
from urllib.parse import unquote

from providers.eventstream import encode_message

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
)
from .server import (
    Event,
    Exchange,
    FakeServer,
    RecordedRequest,
    ResolvedUsage,
    fragments,
    pieces,
    tool_arguments_text,
)

DEFAULT_MODELS = ("anthropic.claude-fake-v1:0",)
DEFAULT_ACCESS_KEY_ID = "AKIDFAKEBEDROCK0001"
DEFAULT_SECRET_ACCESS_KEY = "fake/Secret+Access/Key0000000000000000000"
DEFAULT_REGION = "us-east-1"
SIGNING_SERVICE = "bedrock"
EVENTSTREAM_CONTENT_TYPE = "application/vnd.amazon.eventstream"
# Any per-process secret works: only this fake ever checks its own signatures.
SIGNING_KEY = b"openworker-fake-bedrock-reasoning-signature"
# The real service pads every event payload with a `p` field of random length so that
# payload sizes leak nothing; a client must ignore it.
PADDING = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0"
ERROR_TYPE_SUFFIX = ":http://internal.amazon.com/coral/com.amazon.bedrock/"
_ROUTE = re.compile(r"^/model/(?P<model>[^/]+)/(?P<op>converse|converse-stream)$")
_AUTH = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/"
    r"(?P<service>[^/]+)/aws4_request, SignedHeaders=(?P<signed>[^,]+), "
    r"Signature=(?P<signature>[0-9a-f]{64})$"
)

_STOP_REASONS = {STOP_END: "end_turn", STOP_TOOL_USE: "tool_use", STOP_MAX_TOKENS: "max_tokens"}

# kind -> (status, x-amzn-errortype, message) as Bedrock words them.
_ERRORS: dict[str, tuple[int, str, str]] = {
    "rate_limit": (
        429,
        "ThrottlingException",
        "Too many requests, please wait before trying again.",
    ),
    "quota": (
        429,
        "ThrottlingException",
        "Too many tokens per day, please wait before trying again.",
    ),
    "overloaded": (
        503,
        "ServiceUnavailableException",
        "Bedrock is unable to process your request.",
    ),
    "context_length": (400, "ValidationException", "Input is too long for requested model."),
    "model_not_found": (400, "ValidationException", "The provided model identifier is invalid."),
    "auth": (
        403,
        "UnrecognizedClientException",
        "The security token included in the request is invalid.",
    ),
    "permission": (
        403,
        "AccessDeniedException",
        "You don't have access to the model with the specified model ID.",
    ),
    "invalid_request": (
        400,
        "ValidationException",
        "Malformed input request, please reformat your input and try again.",
    ),
    "server": (
        500,
        "InternalServerException",
        "The system encountered an unexpected error during processing. Try your request again.",
    ),
}
_KIND_BY_STATUS = {
    400: "invalid_request",
    403: "permission",
    429: "rate_limit",
    500: "server",
    503: "overloaded",
}
# In-stream exception event names (the stream union's member names) per error kind.
_STREAM_EXCEPTIONS = {
    "rate_limit": "throttlingException",
    "quota": "throttlingException",
    "overloaded": "serviceUnavailableException",
    "server": "internalServerException",
    "context_length": "validationException",
    "invalid_request": "validationException",
    "model_not_found": "validationException",
}
USER_FIRST = (
    "A conversation must start with a user message. Try again with a conversation that "
    "starts with a user message."
)
ALTERNATE = (
    "A conversation must alternate between user and assistant roles. Make sure the "
    "conversation alternates between user and assistant roles and try again."
)
EMPTY_CONTENT = (
    "The content field in the Message object at {where} is empty. Add a ContentBlock "
    "object to the content field and try again."
)
BLANK_TEXT = (
    "The text field in the ContentBlock object at {where} is blank. Add text to the text "
    "field, and try again."
)
TOOL_CONFIG_REQUIRED = (
    "The toolConfig field must be defined when using toolUse and toolResult content blocks."
)
INVALID_SIGNATURE = (
    "The request signature we calculated does not match the signature you provided. Check "
    "your AWS Secret Access Key and signing method. Consult the service documentation for "
    "details."
)


def sign_reasoning(text: str) -> str:
    digest = hmac.new(SIGNING_KEY, text.encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def event_frame(event: str | None, data: dict[str, Any] | str) -> bytes:
    """One event-stream frame. An event named `exception:<type>` is an exception frame."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    if event and event.startswith("exception:"):
        headers = {
            ":exception-type": event.split(":", 1)[1],
            ":content-type": "application/json",
            ":message-type": "exception",
        }
    else:
        headers = {
            ":event-type": event or "",
            ":content-type": "application/json",
            ":message-type": "event",
        }
    return encode_message(headers, payload.encode("utf-8"))


class EventStreamExchange(Exchange):
    """An `Exchange` whose stream is event-stream frames instead of SSE."""

    @classmethod
    def adopt(cls, exchange: Exchange) -> EventStreamExchange:
        return cls(exchange.fake, exchange._handler, exchange.request, exchange._framing)

    def start_stream(self, headers: dict[str, str] | None = None) -> None:
        handler = self._handler
        handler.send_response(200)
        handler.send_header("Content-Type", EVENTSTREAM_CONTENT_TYPE)
        if self._framing == "chunked":
            handler.send_header("Transfer-Encoding", "chunked")
        else:
            handler.send_header("Connection", "close")
            handler.close_connection = True
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.end_headers()

    def send_event(self, data: dict[str, Any] | str, event: str | None = None) -> None:
        if self.events_sent and self.delay > 0:
            self.sleep(self.delay)
        elif self.client_gone():
            self._record_disconnect()
        self._write_chunk(event_frame(event, data))
        self.events_sent += 1


def verify_sigv4(
    request: RecordedRequest,
    *,
    access_key_id: str,
    secret_access_key: str,
    session_token: str | None,
    region: str,
    host: str,
) -> str | None:
    """None when the request's SigV4 signature is right; else why not (Bedrock's words).

    Recomputed with botocore's `SigV4Auth` over the received path, headers and bytes.
    """
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    headers = request.headers
    match = _AUTH.match(headers.get("authorization", ""))
    if match is None:
        return "Authorization header requires 'Credential', 'Signature' and 'SignedHeaders'."
    if match["key"] != access_key_id:
        return "The security token included in the request is invalid."
    amz_date = headers.get("x-amz-date", "")
    if match["date"] != amz_date[:8]:
        return "Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date."
    if match["region"] != region or match["service"] != SIGNING_SERVICE:
        return (
            f"Credential should be scoped to a valid region and service '{SIGNING_SERVICE}', "
            f"got '{match['region']}/{match['service']}'."
        )
    if session_token is not None and headers.get("x-amz-security-token") != session_token:
        return "The security token included in the request is invalid."
    content_hash = headers.get("x-amz-content-sha256")
    if content_hash is not None and content_hash != hashlib.sha256(request.raw).hexdigest():
        return "The provided 'x-amz-content-sha256' header does not match what was computed."
    signed = match["signed"].split(";")
    if "host" not in signed or "x-amz-date" not in signed:
        return "'Host' and 'X-Amz-Date' must be signed."
    missing = [name for name in signed if name not in headers]
    if missing:
        return f"Signed header {missing[0]!r} is missing from the request."
    aws_request = AWSRequest(
        method=request.method,
        url=f"http://{host}{request.path}",
        data=request.raw,
        headers={name: headers[name] for name in signed},
    )
    aws_request.context["timestamp"] = amz_date
    signer = SigV4Auth(
        Credentials(access_key_id, secret_access_key, session_token), SIGNING_SERVICE, region
    )
    canonical = signer.canonical_request(aws_request)
    expected = signer.signature(signer.string_to_sign(aws_request, canonical), aws_request)
    if not hmac.compare_digest(expected, match["signature"]):
        return INVALID_SIGNATURE
    return None


def _blob_problem(value: Any, where: str) -> str | None:
    if not isinstance(value, str):
        return f"{where}: expected base64 bytes"
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return f"{where}: invalid base64 bytes"
    return None


@functools.cache
def _input_shape(operation: str) -> Any:
    import botocore.session

    model = botocore.session.get_session().get_service_model("bedrock-runtime")
    return model.operation_model(operation).input_shape


def validate_converse_request(body: Any, model_id: str, *, stream: bool) -> str | None:
    """Problems botocore's validator finds against the bedrock-runtime service model
    (`ConverseRequest` / `ConverseStreamRequest`); None when the body is valid."""
    from botocore.exceptions import ParamValidationError
    from botocore.validate import validate_parameters

    if not isinstance(body, dict):
        return "Request body is not a JSON object."
    try:
        validate_parameters(
            {"modelId": model_id, **body}, _input_shape("ConverseStream" if stream else "Converse")
        )
    except ParamValidationError as exc:
        return str(exc)
    return None


class BedrockFake(FakeServer):
    """Fake Bedrock Runtime. Accepts `Bearer <api_key>` or SigV4 signed with
    (`access_key_id`, `secret_access_key`[, `session_token`]) for `region`."""

    api_prefix = ""
    provider = "bedrock"

    def __init__(
        self,
        *,
        access_key_id: str = DEFAULT_ACCESS_KEY_ID,
        secret_access_key: str = DEFAULT_SECRET_ACCESS_KEY,
        session_token: str | None = None,
        region: str = DEFAULT_REGION,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key
        self.session_token = session_token
        self.region = region

    # -- routing --------------------------------------------------------------------

    def handle(self, exchange: Exchange) -> None:
        exchange = EventStreamExchange.adopt(exchange)
        request = exchange.request
        route = _ROUTE.match(request.path)
        if request.method != "POST" or route is None:
            self._error(exchange, 404, "UnknownOperationException", "Unknown operation.")
            return
        problem = self._check_auth(exchange)
        if problem is not None:
            self._error(exchange, 403, *problem)
            return
        model = unquote(route["model"])
        stream = route["op"] == "converse-stream"
        if self.validate:
            problem_text = validate_converse_request(request.body, model, stream=stream)
            problem_text = problem_text or self.check_conversation(request.body)
            if problem_text is not None:
                self._error(exchange, 400, "ValidationException", problem_text)
                return
        body = request.body if isinstance(request.body, dict) else {}
        if self.models is not None and model not in self.models:
            self._error(exchange, *self._error_for(HttpError(None, kind="model_not_found")))
            return
        reply = self.script.next_reply(last_user_text(body.get("messages") or []))
        renderer = ConverseRenderer(self, request, reply)
        self.play(
            exchange,
            reply,
            renderer,
            stream=stream,
            error_response=self._error_response,
            headers={"x-amzn-requestid": str(uuid.uuid4())},
        )

    def _check_auth(self, exchange: Exchange) -> tuple[str, str] | None:
        request = exchange.request
        authorization = request.headers.get("authorization", "")
        if authorization.startswith("Bearer "):
            if self.api_key is None or authorization.removeprefix("Bearer ") == self.api_key:
                return None
            return (
                "UnrecognizedClientException",
                "Invalid API Key format: Must start with pre-defined prefix",
            )
        if authorization.startswith("AWS4-HMAC-SHA256 "):
            host = request.headers.get("host", "")
            problem = verify_sigv4(
                request,
                access_key_id=self.access_key_id,
                secret_access_key=self.secret_access_key,
                session_token=self.session_token,
                region=self.region,
                host=host,
            )
            if problem is None:
                return None
            kind = "InvalidSignatureException"
            if "security token" in problem:
                kind = "UnrecognizedClientException"
            return kind, problem
        if self.api_key is None:
            return None
        return ("MissingAuthenticationTokenException", "Missing Authentication Token")

    # -- errors ---------------------------------------------------------------------

    def _error(self, exchange: Exchange, status: int, error_type: str, message: str) -> None:
        exchange.send_json(status, {"message": message}, _error_headers(error_type))

    def _error_for(self, err: HttpError) -> tuple[int, str, str]:
        kind = err.kind or _KIND_BY_STATUS.get(err.status or 500, "server")
        status, error_type, message = _ERRORS.get(kind, _ERRORS["server"])
        return err.status or status, error_type, err.message or message

    def _error_response(self, err: HttpError) -> tuple[int, dict[str, Any] | str, dict[str, str]]:
        status, error_type, message = self._error_for(err)
        headers = {**_error_headers(error_type), **err.headers}
        if err.body is not None:
            return status, err.body, headers
        return status, {"message": message}, headers

    # -- validation -----------------------------------------------------------------

    def check_conversation(self, body: Any) -> str | None:
        """The conversation rules the service checks beyond the shapes; None when valid."""
        messages = body.get("messages") or []
        if not messages:
            return USER_FIRST
        uses_tools = False
        previous_uses: list[str] = []
        for position, message in enumerate(messages):
            role = message.get("role")
            if position == 0 and role != "user":
                return USER_FIRST
            if position and role == messages[position - 1].get("role"):
                return ALTERNATE
            blocks = message.get("content") or []
            if not blocks:
                return EMPTY_CONTENT.format(where=f"messages.{position}")
            results = [b["toolResult"].get("toolUseId") for b in blocks if "toolResult" in b]
            if previous_uses and sorted(results) != sorted(previous_uses):
                return (
                    f"Expected toolResult blocks at messages.{position}.content for the "
                    f"following Ids: {', '.join(previous_uses)}"
                )
            if results and not previous_uses:
                return (
                    f"The number of toolResult blocks at messages.{position}.content exceeds "
                    "the number of toolUse blocks of previous turn."
                )
            for index, block in enumerate(blocks):
                problem = _check_block(block, f"messages.{position}.content.{index}", role)
                if problem:
                    return problem
            previous_uses = [b["toolUse"].get("toolUseId") for b in blocks if "toolUse" in b]
            uses_tools = uses_tools or bool(results or previous_uses)
        if uses_tools and not body.get("toolConfig"):
            return TOOL_CONFIG_REQUIRED
        return None


def _error_headers(error_type: str) -> dict[str, str]:
    return {
        "x-amzn-errortype": error_type + ERROR_TYPE_SUFFIX,
        "x-amzn-requestid": str(uuid.uuid4()),
    }


def _check_block(block: dict[str, Any], where: str, role: str) -> str | None:
    if "text" in block and not str(block["text"]).strip():
        return BLANK_TEXT.format(where=where)
    if "image" in block:
        return _blob_problem((block["image"].get("source") or {}).get("bytes"), where)
    if "document" in block:
        return _blob_problem((block["document"].get("source") or {}).get("bytes"), where)
    if "toolUse" in block and role != "assistant":
        return f"{where}: toolUse blocks are only allowed in assistant messages."
    if "toolResult" in block and role != "user":
        return f"{where}: toolResult blocks are only allowed in user messages."
    if "reasoningContent" in block:
        if role != "assistant":
            return f"{where}: reasoningContent blocks are only allowed in assistant messages."
        content = block["reasoningContent"]
        if "redactedContent" in content:
            return _blob_problem(content["redactedContent"], where)
        thought = content.get("reasoningText") or {}
        signature = thought.get("signature")
        if not signature or not hmac.compare_digest(
            signature, sign_reasoning(thought.get("text", ""))
        ):
            return f"The signature in the reasoningContent block at {where} is invalid."
    return None


class ConverseRenderer:
    """Renders one reply as ConverseStream events or one Converse response."""

    def __init__(self, fake: BedrockFake, request: RecordedRequest, reply: Reply) -> None:
        self.fake = fake
        self.reply = reply
        self.usage: ResolvedUsage = fake.resolve_usage(request, reply)
        self.blocks: list[dict[str, Any]] = []
        self._open: int | None = None

    # -- stream ---------------------------------------------------------------------

    def start_events(self) -> list[Event]:
        return [self._event("messageStart", {"role": "assistant"})]

    def step_events(self, step: Step) -> list[Event]:
        if isinstance(step, Text):
            events = self._open_block("text", {"text": ""})
            index = len(self.blocks) - 1
            self.blocks[index]["text"] += step.text
            return events + [self._delta(index, {"text": piece}) for piece in pieces(step.text)]
        if isinstance(step, Reasoning):
            events = self._open_block(
                "reasoning", {"reasoningContent": {"reasoningText": {"text": ""}}}
            )
            index = len(self.blocks) - 1
            self.blocks[index]["reasoningContent"]["reasoningText"]["text"] += step.text
            return events + [
                self._delta(index, {"reasoningContent": {"text": piece}})
                for piece in pieces(step.text)
            ]
        if isinstance(step, RedactedThinking):
            data = base64.b64encode(step.data.encode()).decode()
            events = self._open_block(
                "redacted", {"reasoningContent": {"redactedContent": data}}, fresh=True
            )
            index = len(self.blocks) - 1
            return [*events, self._delta(index, {"reasoningContent": {"redactedContent": data}})]
        if isinstance(step, ToolCall):
            call_id = step.id or "tooluse_" + secrets.token_urlsafe(16)
            block = {"toolUse": {"toolUseId": call_id, "name": step.name, "input": step.arguments}}
            events = self._open_block("toolUse", block, fresh=True)
            index = len(self.blocks) - 1
            start = {"toolUse": {"toolUseId": call_id, "name": step.name}}
            events.append(
                self._event("contentBlockStart", {"contentBlockIndex": index, "start": start})
            )
            for fragment in fragments(tool_arguments_text(step)):
                events.append(self._delta(index, {"toolUse": {"input": fragment}}))
            return events
        return []

    def error_events(self, step: ErrorEvent) -> list[Event]:
        _, _, message = self.fake._error_for(HttpError(None, kind=step.kind, message=step.message))
        name = _STREAM_EXCEPTIONS.get(step.kind, "internalServerException")
        return [(f"exception:{name}", {"message": message})]

    def finish_events(self) -> list[Event]:
        events = self._close_open()
        events.append(self._event("messageStop", {"stopReason": self.stop_reason}))
        events.append(
            self._event("metadata", {"usage": self._usage(), "metrics": {"latencyMs": 42}})
        )
        return events

    # -- whole response -------------------------------------------------------------

    def message(self) -> dict[str, Any]:
        self._close_open()
        return {
            "output": {
                "message": {"role": "assistant", "content": [self._final(b) for b in self.blocks]}
            },
            "stopReason": self.stop_reason,
            "usage": self._usage(),
            "metrics": {"latencyMs": 42},
        }

    @property
    def stop_reason(self) -> str:
        if self.reply.stop is not None:
            return _STOP_REASONS.get(self.reply.stop, self.reply.stop)
        return "tool_use" if any("toolUse" in b for b in self.blocks) else "end_turn"

    # -- internals ------------------------------------------------------------------

    def _usage(self) -> dict[str, int]:
        usage = self.usage
        out = {
            "inputTokens": usage.input,
            "outputTokens": usage.output,
            "totalTokens": usage.input + usage.output + usage.cache_read + usage.cache_write,
        }
        if usage.cache_read:
            out["cacheReadInputTokens"] = usage.cache_read
        if usage.cache_write:
            out["cacheWriteInputTokens"] = usage.cache_write
        return out

    def _final(self, block: dict[str, Any]) -> dict[str, Any]:
        thought = (block.get("reasoningContent") or {}).get("reasoningText")
        if thought is not None:
            signed = {**thought, "signature": sign_reasoning(thought["text"])}
            return {"reasoningContent": {"reasoningText": signed}}
        return block

    def _kind(self, block: dict[str, Any]) -> str:
        if "text" in block:
            return "text"
        if "toolUse" in block:
            return "toolUse"
        return "reasoning" if "reasoningText" in block.get("reasoningContent", {}) else "redacted"

    def _open_block(self, kind: str, start: dict[str, Any], *, fresh: bool = False) -> list[Event]:
        """Continue the open block of `kind`, or close it and begin a new one."""
        if not fresh and self._open is not None and self._kind(self.blocks[self._open]) == kind:
            return []
        events = self._close_open()
        self.blocks.append(json.loads(json.dumps(start)))
        self._open = len(self.blocks) - 1
        return events

    def _close_open(self) -> list[Event]:
        if self._open is None:
            return []
        index, self._open = self._open, None
        events: list[Event] = []
        thought = (self.blocks[index].get("reasoningContent") or {}).get("reasoningText")
        if thought is not None:
            signature = sign_reasoning(thought["text"])
            events.append(self._delta(index, {"reasoningContent": {"signature": signature}}))
        events.append(self._event("contentBlockStop", {"contentBlockIndex": index}))
        return events

    def _delta(self, index: int, delta: dict[str, Any]) -> Event:
        return self._event("contentBlockDelta", {"contentBlockIndex": index, "delta": delta})

    def _event(self, name: str, payload: dict[str, Any]) -> Event:
        return (name, {**payload, "p": PADDING[: secrets.randbelow(len(PADDING)) + 1]})


def last_user_text(messages: list[Any]) -> str:
    """Text of the last user message; tool results count when there is no text."""
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        texts: list[str] = []
        for block in message.get("content") or []:
            if not isinstance(block, dict):
                continue
            if "text" in block:
                texts.append(str(block["text"]))
            elif "toolResult" in block:
                texts.extend(
                    str(inner.get("text", ""))
                    for inner in block["toolResult"].get("content") or []
                    if isinstance(inner, dict)
                )
        return "".join(texts)
    return ""
