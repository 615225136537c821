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
