from __future__ import annotations

import email.utils
import json
import pickle

import pytest

from providers import errors
from providers.errors import (
    AuthenticationError,
    BadRequestError,
    ContextTooLongError,
    NoAccessError,
    OutboundBlockedError,
    OverloadedError,
    ProviderError,
    QuotaError,
    RateLimitError,
    RequestCancelled,
    StreamError,
    UpstreamUnavailableError,
    error_from_event,
    error_from_response,
    parse_retry_after,
)
from providers.types import AssistantTurn


def openai_body(message: str, type_: str = "invalid_request_error", code: str | None = None):
    return json.dumps({"error": {"message": message, "type": type_, "code": code}})


def anthropic_body(type_: str, message: str) -> str:
    return json.dumps({"type": "error", "error": {"type": type_, "message": message}})


def test_kinds_are_the_stable_strings_the_ui_uses():
    kinds = {
        ProviderError: "error",
        AuthenticationError: "auth",
        NoAccessError: "no_access",
        QuotaError: "no_quota",
        RateLimitError: "rate_limited",
        OverloadedError: "overloaded",
        ContextTooLongError: "context_too_long",
        BadRequestError: "bad_request",
        UpstreamUnavailableError: "unavailable",
        StreamError: "stream",
        OutboundBlockedError: "blocked",
        RequestCancelled: "cancelled",
    }
    for cls, kind in kinds.items():
        assert cls("x").kind == kind
        assert issubclass(cls, ProviderError)


def test_openai_model_not_found_is_no_access_with_the_model_named():
    body = openai_body(
        "The model `gpt-9` does not exist or you do not have access to it.",
        code="model_not_found",
    )
    err = error_from_response(404, body, model="openai:gpt-9")
    assert isinstance(err, NoAccessError)
    assert err.status == 404
    assert "gpt-9" in err.friendly
    assert err.raw_message.startswith("The model `gpt-9` does not exist")
    assert not err.retryable


def test_anthropic_404_naming_the_requested_model_is_no_access():
    body = anthropic_body("not_found_error", "model: claude-opus-9")
    err = error_from_response(404, body, model="anthropic:Claude-Opus-9")
    assert isinstance(err, NoAccessError)


def test_anthropic_404_for_another_resource_keeps_its_raw_message():
    body = anthropic_body("not_found_error", "Not Found")
    err = error_from_response(404, body, model="anthropic:claude-opus-9")
    assert isinstance(err, BadRequestError)
    assert err.raw_message == "Not Found"


def test_a_plain_404_from_a_wrong_base_url_is_not_an_access_problem():
    err = error_from_response(404, "404 page not found", model="gpt-4o")
    assert isinstance(err, BadRequestError)
    assert err.raw_message == "404 page not found"
    assert "404 page not found" in err.friendly


def test_permission_error_is_no_access():
    body = anthropic_body("permission_error", "Your API key does not have permission.")
    assert isinstance(error_from_response(403, body, model="claude"), NoAccessError)


def test_429_with_insufficient_quota_is_a_quota_error_and_not_retryable():
    body = openai_body(
        "You exceeded your current quota, please check your plan.",
        type_="insufficient_quota",
        code="insufficient_quota",
    )
    err = error_from_response(429, body, model="gpt-4o", headers={"retry-after": "1"})
    assert isinstance(err, QuotaError)
    assert not err.retryable


def test_plain_429_is_rate_limited_and_carries_retry_after():
    body = anthropic_body("rate_limit_error", "Number of requests has exceeded your limit")
    err = error_from_response(429, body, model="claude", headers={"Retry-After": "7"})
    assert isinstance(err, RateLimitError)
    assert err.retry_after == 7.0
    assert err.retryable
    assert "7 s" in err.friendly


def test_anthropic_low_credit_400_is_a_quota_error():
    body = anthropic_body(
        "invalid_request_error", "Your credit balance is too low to access the Anthropic API."
    )
    assert isinstance(error_from_response(400, body, model="claude"), QuotaError)


@pytest.mark.parametrize(
    "body",
    [
        openai_body(
            "This model's maximum context length is 128000 tokens.", code="context_length_exceeded"
        ),
        anthropic_body(
            "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"
        ),
        json.dumps({"error": "maximum context length exceeded"}),
    ],
)
def test_context_too_long_is_recognised_from_the_body(body):
    err = error_from_response(400, body, model="m")
    assert isinstance(err, ContextTooLongError)
    assert not err.retryable


def test_401_is_an_authentication_error():
    body = openai_body("Incorrect API key provided.", code="invalid_api_key")
    err = error_from_response(401, body, model="gpt-4o")
    assert isinstance(err, AuthenticationError)
    assert "key" in err.friendly


@pytest.mark.parametrize("status", [529, 503])
def test_overloaded_statuses_are_overloaded_and_retryable(status):
    err = error_from_response(status, anthropic_body("overloaded_error", "Overloaded"), model="c")
    assert isinstance(err, OverloadedError)
    assert err.retryable


@pytest.mark.parametrize(
    ("status", "retryable"), [(500, True), (502, True), (504, True), (501, False)]
)
def test_5xx_is_unavailable_and_retryable_only_where_a_retry_can_help(status, retryable):
    err = error_from_response(status, "upstream exploded", model="m")
    assert isinstance(err, UpstreamUnavailableError)
    assert err.retryable is retryable
    assert err.raw_message == "upstream exploded"


def test_other_4xx_keeps_the_upstream_message():
    body = openai_body("Invalid value for 'temperature': must be <= 2.")
    err = error_from_response(400, body, model="gpt-4o")
    assert isinstance(err, BadRequestError)
    assert err.raw_message == "Invalid value for 'temperature': must be <= 2."


def test_vendor_message_shapes_are_all_read():
    assert (
        error_from_response(400, '{"message": "bad thing"}', model="m").raw_message == "bad thing"
    )
    assert error_from_response(400, '{"detail": "nope"}', model="m").raw_message != ""
    gemini = json.dumps(
        [{"error": {"code": 400, "message": "gem says no", "status": "INVALID_ARGUMENT"}}]
    )
    assert error_from_response(400, gemini, model="m").raw_message == "gem says no"


def test_empty_body_still_names_the_status():
    err = error_from_response(502, "", model="m")
    assert err.raw_message == "HTTP 502"
    assert str(err) == "HTTP 502: HTTP 502"


def test_long_non_json_bodies_are_clipped():
    err = error_from_response(500, "<html>" + "x" * 10_000, model="m")
    assert len(err.raw_message) <= errors.MAX_RAW_MESSAGE_CHARS


def test_raw_message_never_contains_the_api_key():
    key = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX"
    body = openai_body(f"Incorrect API key provided: {key}.", code="invalid_api_key")
    err = error_from_response(401, body, model="m", secrets=["custom-secret-value"])
    assert key not in err.raw_message
    assert key not in str(err)
    err2 = error_from_response(
        400, "echo custom-secret-value back", model="m", secrets=["custom-secret-value"]
    )
    assert "custom-secret-value" not in err2.raw_message


def test_redirect_is_an_error_that_names_the_target():
    err = error_from_response(
        302, "", model="m", headers={"location": "https://elsewhere.example/v1"}
    )
    assert isinstance(err, BadRequestError)
    assert "https://elsewhere.example/v1" in err.raw_message
    assert "redirect" in err.raw_message


def test_anthropic_stream_error_event_is_overloaded_and_keeps_the_partial_text():
    partial = AssistantTurn(text="Half an ans")
    payload = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    err = error_from_event(payload, model="anthropic:claude", partial=partial)
    assert isinstance(err, OverloadedError)
    assert err.partial is partial
    assert err.raw_message == "Overloaded"
    assert err.status is None


def test_openai_stream_chunk_error_is_classified_from_its_body():
    payload = {
        "error": {
            "message": "Rate limit reached",
            "type": "requests",
            "code": "rate_limit_exceeded",
        }
    }
    assert isinstance(error_from_event(payload, model="gpt-4o"), RateLimitError)


def test_unrecognised_stream_error_is_a_stream_error():
    err = error_from_event(
        '{"type":"error","error":{"type":"api_error","message":"Internal"}}', model="c"
    )
    assert isinstance(err, StreamError)
    assert err.raw_message == "Internal"
    assert isinstance(error_from_event("plain words", model="c"), StreamError)
    assert error_from_event("plain words", model="c").raw_message == "plain words"


def test_responses_api_error_event_reads_its_code():
    payload = {"type": "error", "code": "context_length_exceeded", "message": "Too long."}
    assert isinstance(error_from_event(payload, model="o3"), ContextTooLongError)


def test_retry_after_accepts_seconds_milliseconds_and_http_dates():
    assert parse_retry_after({"retry-after": "2.5"}) == 2.5
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 12, usegmt=True)
    assert parse_retry_after({"Retry-After": date}, now=now) == pytest.approx(12.0)
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None
    assert parse_retry_after({"retry-after": "-3"}) == 0.0


def test_errors_survive_pickling():
    err = RateLimitError("slow down", status=429, retry_after=3.0, partial=AssistantTurn(text="a"))
    copy = pickle.loads(pickle.dumps(err))  # noqa: S301 - our own bytes
    assert type(copy) is RateLimitError
    assert copy.retry_after == 3.0
    assert copy.partial.text == "a"
    assert copy.friendly == err.friendly
    assert str(copy) == str(err)
