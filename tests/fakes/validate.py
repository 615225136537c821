"""Check request bodies and stream events against the official SDKs' published types.

The provider clients talk httpx, not the SDKs; validating what they send against the
SDKs' request TypedDicts (and what the fakes emit against the SDKs' event models) is a
cheap check of wire fidelity that does not depend on our own reading of the docs.

Request checks forbid unknown keys at every level (a misspelt field fails) and expand
the SDKs' lazily validated `Iterable[...]` fields, so nested messages are checked too.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model


class RequestValidationError(AssertionError):
    """A request body that the SDK's types reject; the message lists every problem."""


@functools.cache
def _wrapper(params_type: Any) -> type[BaseModel]:
    # TypeAdapter refuses a config for a TypedDict; a model field inherits the model's
    # config down into nested TypedDicts that declare none, which the SDK's don't.
    return create_model(
        "RequestBody",
        __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=True),
        body=(params_type, ...),
    )


def _expand(value: Any) -> Any:
    """Consume pydantic's lazy ValidatorIterators (validating their items): plain data."""
    if isinstance(value, Iterator):
        return [_expand(item) for item in value]
    if isinstance(value, dict):
        return {key: _expand(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_expand(item) for item in value]
    return value


def _validate(params_type: Any, body: dict[str, Any], extra_fields: Iterable[str]) -> None:
    extras = set(extra_fields)
    trimmed = {key: value for key, value in body.items() if key not in extras}
    try:
        _expand(_wrapper(params_type).model_validate({"body": trimmed}).body)
    except ValidationError as exc:
        raise RequestValidationError(str(exc)) from exc


def validate_openai_chat_request(body: dict[str, Any], *, extra_fields: Iterable[str] = ()) -> None:
    """Raise RequestValidationError unless `body` is a valid Chat Completions request.

    `extra_fields` names vendor extensions the SDK doesn't type (DeepSeek `thinking`,
    OpenRouter `reasoning`, Ollama `options`...) that are allowed at the top level.
    """
    from openai.types.chat import completion_create_params as params

    params_type = (
        params.CompletionCreateParamsStreaming
        if body.get("stream")
        else params.CompletionCreateParamsNonStreaming
    )
    _validate(params_type, body, extra_fields)


def validate_anthropic_request(body: dict[str, Any], *, extra_fields: Iterable[str] = ()) -> None:
    """Raise RequestValidationError unless `body` is a valid Messages request."""
    from anthropic.types import message_create_params as params

    params_type = (
        params.MessageCreateParamsStreaming
        if body.get("stream")
        else params.MessageCreateParamsNonStreaming
    )
    _validate(params_type, body, extra_fields)


def validate_openai_responses_request(
    body: dict[str, Any], *, extra_fields: Iterable[str] = ()
) -> None:
    """Raise RequestValidationError unless `body` is a valid Responses API request."""
    from openai.types.responses import response_create_params as params

    params_type = (
        params.ResponseCreateParamsStreaming
        if body.get("stream")
        else params.ResponseCreateParamsNonStreaming
    )
    _validate(params_type, body, extra_fields)


@functools.cache
def _adapter(kind: str) -> TypeAdapter[Any]:
    if kind == "anthropic":
        from anthropic.types import RawMessageStreamEvent

        return TypeAdapter(RawMessageStreamEvent)
    from openai.types.chat import ChatCompletionChunk

    return TypeAdapter(ChatCompletionChunk)


def validate_anthropic_event(event: dict[str, Any]) -> None:
    """Validate one streamed event (`ping` and `error` are outside the SDK union)."""
    if event.get("type") in ("ping", "error"):
        if event["type"] == "error":
            from anthropic.types import ErrorResponse

            ErrorResponse.model_validate(event)
        return
    _adapter("anthropic").validate_python(event)


def validate_openai_chunk(chunk: dict[str, Any]) -> None:
    _adapter("openai").validate_python(chunk)


@functools.cache
def _responses_event_adapter() -> TypeAdapter[Any]:
    from openai.types.responses import ResponseStreamEvent

    return TypeAdapter(ResponseStreamEvent)


def validate_openai_responses_event(event: dict[str, Any]) -> None:
    """Validate one streamed Responses event against the SDK's `ResponseStreamEvent`."""
    _responses_event_adapter().validate_python(event)


# Top-level fields of a generateContent request (the SDK builds them from its config, so it
# has no single request type to validate against).
GEMINI_REQUEST_KEYS = frozenset(
    {
        "contents",
        "tools",
        "toolConfig",
        "safetySettings",
        "systemInstruction",
        "generationConfig",
        "cachedContent",
    }
)


def gemini_request_problem(body: dict[str, Any]) -> str | None:
    """What the `google-genai` types refuse in a generateContent body (camelCase, as on the
    wire), or None: unknown top-level keys, then `contents` and `systemInstruction` as
    `Content`, `tools` as `Tool`, `generationConfig` as `GenerationConfig` (every SDK
    model forbids unknown keys)."""
    from google.genai import types

    unknown = sorted(set(body) - GEMINI_REQUEST_KEYS)
    if unknown:
        return f'Invalid JSON payload received. Unknown name "{unknown[0]}": Cannot find field.'
    try:
        for content in body.get("contents") or []:
            types.Content.model_validate(content)
        if body.get("systemInstruction") is not None:
            types.Content.model_validate(body["systemInstruction"])
        for tool in body.get("tools") or []:
            types.Tool.model_validate(tool)
        if body.get("generationConfig") is not None:
            types.GenerationConfig.model_validate(body["generationConfig"])
    except ValidationError as exc:
        return f"Invalid JSON payload received. {exc}"
    return None


def validate_gemini_request(body: dict[str, Any]) -> None:
    """Raise RequestValidationError unless `body` is a valid generateContent request."""
    problem = gemini_request_problem(body)
    if problem is not None:
        raise RequestValidationError(problem)


def validate_gemini_response(chunk: dict[str, Any]) -> None:
    """Validate one streamed chunk (or a whole reply) as a `GenerateContentResponse`.

    The SDK's models forbid unknown keys, so a misspelt field fails here too.
    """
    from google.genai import types

    types.GenerateContentResponse.model_validate(chunk)


def mistral_request_problem(body: dict[str, Any]) -> str | None:
    """What the `mistralai` SDK's request TypedDict refuses in a chat completion body
    (unknown keys at every level, `stream_options` among them), or None."""
    from mistralai.client import models

    params_type = (
        models.ChatCompletionStreamRequestTypedDict
        if body.get("stream")
        else models.ChatCompletionRequestTypedDict
    )
    try:
        _validate(params_type, body, ())
    except RequestValidationError as exc:
        return str(exc)
    return None


def validate_mistral_request(body: dict[str, Any]) -> None:
    """Raise RequestValidationError unless `body` is a valid Mistral chat request."""
    problem = mistral_request_problem(body)
    if problem is not None:
        raise RequestValidationError(problem)


def validate_mistral_chunk(chunk: dict[str, Any]) -> None:
    """Validate one streamed chunk as the SDK's `CompletionChunk`."""
    from mistralai.client import models

    models.CompletionChunk.model_validate(chunk)
