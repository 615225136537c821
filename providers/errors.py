"""Provider failures, translated into a small stable set the engine and the UI understand.

Matching is on the error BODY text (error codes/types), not just the HTTP status (seed 000):
a 404 also means "wrong base_url" and a 429 also means "slow down", and neither of those
should be dressed up as an access problem. Whatever is not recognised keeps the upstream's
own message, so nothing useful is hidden behind a vague "something went wrong".

Every error carries:
- `status`: the HTTP status, None for failures without one (stream events, timeouts);
- `raw_message`: the upstream's own words, clipped, with anything key-like redacted;
- `friendly`: plain words for a user;
- `retryable`: whether the same request may succeed if sent again later;
- `partial`: the `AssistantTurn` streamed before a stream failed, so its text is kept;
- `kind`: a short stable string used on the socket and in the UI.
"""

from __future__ import annotations

import email.utils
import html
import json
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from .types import AssistantTurn

_NO_ACCESS = (
    "model_not_found",
    "does not exist or you do not have access",
    "does not have access to model",
    "permission_error",
    "permission denied",
    # Gemini's status for a key whose project may not use the API or the model.
    "permission_denied",
)
_NO_QUOTA = (
    "insufficient_quota",
    "exceeded your current quota",
    "credit balance is too low",
    "billing hard limit",
    # Bedrock's daily token quota (a 429 ThrottlingException): retrying within seconds
    # cannot help, so it must be known as a quota before the transport decides to retry.
    "too many tokens per day",
)
# OpenAI's code, Anthropic's phrase, and the generic wording most compatible servers copy.
_CONTEXT_TOO_LONG = (
    "context_length_exceeded",
    "prompt is too long",
    "maximum context length",
    "exceeds the context window",
    "input is too long for requested model",
    # Gemini: "The input token count (N) exceeds the maximum number of tokens allowed (M)."
    "exceeds the maximum number of tokens allowed",
)
_AUTH_TYPES = frozenset({"authentication_error", "invalid_api_key"})
# Gemini answers a bad key with 400 INVALID_ARGUMENT, recognisable only by its reason/words.
_AUTH_PHRASES = ("api_key_invalid", "api key not valid")
_RATE_LIMIT_TYPES = frozenset({"rate_limit_error", "rate_limit_exceeded"})
_OVERLOADED_TYPES = frozenset({"overloaded_error"})
_OVERLOADED_STATUSES = (503, 529)
# Upstream messages are shown to users and stored; a paragraph is plenty.
MAX_RAW_MESSAGE_CHARS = 1000
# Secrets shorter than this are too likely to collide with ordinary words to redact safely.
MIN_SECRET_CHARS = 8
# Key shapes that an upstream may echo back (OpenAI/Anthropic `sk-...`, Google `AIza...`).
_KEY_LIKE = re.compile(r"(sk-[A-Za-z0-9_\-]{16,}|AIza[0-9A-Za-z_\-]{20,}|Bearer\s+[^\s\"']+)")
REDACTED = "[redacted]"
# A proxy's or captive portal's error page is markup, not a message: users are shown its
# title (or its text, this long at most), never the tags.
MAX_MARKUP_SUMMARY_CHARS = 200
_MARKUP_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_MARKUP_TAG = re.compile(r"<[^>]*>?")


class ProviderError(Exception):
    """Base of every provider failure. Subclasses fix `kind`, `retryable` and `friendly`."""

    kind = "error"
    default_retryable = False

    def __init__(
        self,
        raw_message: str = "",
        *,
        status: int | None = None,
        friendly: str | None = None,
        retryable: bool | None = None,
        partial: AssistantTurn | None = None,
        model: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.raw_message = raw_message or (f"HTTP {status}" if status else self.kind)
        self.status = status
        self.model = model
        self.retryable = self.default_retryable if retryable is None else retryable
        self.partial = partial
        # Seconds the upstream asked us to wait (Retry-After), when it said so.
        self.retry_after = retry_after
        self.friendly = friendly or self._friendly()
        super().__init__(str(self))

    def _friendly(self) -> str:
        return f"The provider returned an error: {self.raw_message}"

    def __str__(self) -> str:
        prefix = f"HTTP {self.status}: " if self.status else ""
        return f"{prefix}{self.raw_message}"

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only constructor arguments defeat Exception's default pickling.
        return (_rebuild, (type(self), dict(self.__dict__)))


def _rebuild(cls: type[ProviderError], state: dict[str, Any]) -> ProviderError:
    error = cls.__new__(cls)
    Exception.__init__(error, state.get("raw_message", ""))
    error.__dict__.update(state)
    return error


class AuthenticationError(ProviderError):
    kind = "auth"

    def _friendly(self) -> str:
        return "The provider rejected the API key. Check the key in your provider settings."


class NoAccessError(ProviderError):
    kind = "no_access"

    def _friendly(self) -> str:
        name = f" '{self.model}'" if self.model else ""
        return f"This API key does not have access to the model{name}."


class QuotaError(ProviderError):
    kind = "no_quota"

    def _friendly(self) -> str:
        return "The provider account for this key is out of credit or quota."


class RateLimitError(ProviderError):
    kind = "rate_limited"
    default_retryable = True

    def _friendly(self) -> str:
        when = f" in {self.retry_after:.0f} s" if self.retry_after else " in a moment"
        return f"The provider is rate-limiting requests. Try again{when}."


class OverloadedError(ProviderError):
    kind = "overloaded"
    default_retryable = True

    def _friendly(self) -> str:
        return "The provider is overloaded right now. Try again shortly."


class ContextTooLongError(ProviderError):
    kind = "context_too_long"

    def _friendly(self) -> str:
        return "The conversation is too long for this model's context window."


class BadRequestError(ProviderError):
    kind = "bad_request"

    def _friendly(self) -> str:
        return f"The provider refused the request: {self.raw_message}"


class UpstreamUnavailableError(ProviderError):
    kind = "unavailable"
    default_retryable = True

    def _friendly(self) -> str:
        return f"The provider could not be reached: {self.raw_message}"


class StreamError(ProviderError):
    kind = "stream"
    default_retryable = True

    def _friendly(self) -> str:
        return f"The reply stream broke off: {self.raw_message}"


class OutboundBlockedError(ProviderError):
    kind = "blocked"

    def _friendly(self) -> str:
        return f"Requests to this address are not allowed: {self.raw_message}"


class RequestCancelled(ProviderError):
    kind = "cancelled"

    def _friendly(self) -> str:
        return "The request was cancelled."


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every given secret and every key-shaped token replaced."""
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET_CHARS:
            text = text.replace(secret, REDACTED)
    return _KEY_LIKE.sub(REDACTED, text)


def _clip(text: str) -> str:
    text = text.strip()
    if len(text) <= MAX_RAW_MESSAGE_CHARS:
        return text
    return text[: MAX_RAW_MESSAGE_CHARS - 1] + "…"


def _markup_summary(body: str) -> str | None:
    """Plain words for an HTML/XML body (`<html>... 502 Bad Gateway ...`), or None when
    `body` is not markup. The error text reaches the chat page and the admin: a page of
    tags there reads as a crash, and the title says all the user can act on."""
    if not body.lstrip().startswith("<"):
        return None
    title = _MARKUP_TITLE.search(body)
    source = title.group(1) if title else body
    words = " ".join(html.unescape(_MARKUP_TAG.sub(" ", source)).split())
    words = words.replace("<", "").replace(">", "")[:MAX_MARKUP_SUMMARY_CHARS]
    if not words:
        return "the upstream answered with a web page instead of an API reply"
    return f"the upstream answered with a web page instead of an API reply ({words})"


def _error_fields(payload: Any) -> tuple[str | None, frozenset[str]]:
    """(message, its type/code/status names lowercased) from the JSON error shapes vendors use."""
    if isinstance(payload, list) and payload:
        payload = payload[0]
    if not isinstance(payload, dict):
        return None, frozenset()
    inner = payload.get("error", payload)
    if isinstance(inner, str):
        return inner, frozenset()
    if not isinstance(inner, dict):
        return None, frozenset()
    message = inner.get("message") or inner.get("detail") or payload.get("message")
    names = frozenset(
        str(inner[key]).lower() for key in ("type", "code", "status") if inner.get(key) is not None
    )
    return (message if isinstance(message, str) else None), names


def _classify(
    text: str, *, status: int | None, names: frozenset[str], model: str
) -> type[ProviderError] | None:
    if any(phrase in text for phrase in _NO_QUOTA):
        return QuotaError
    if any(phrase in text for phrase in _NO_ACCESS):
        return NoAccessError
    # Anthropic's 404 body is just "model: <id>" under type not_found_error; require both
    # halves so unrelated 404s (bad base_url, deleted resource) keep their raw message.
    if "not_found_error" in text and f"model: {model.split(':')[-1].lower()}" in text:
        return NoAccessError
    # Gemini's 404 names the model ("models/<id> is not found for API version v1beta...").
    if f"models/{model.split(':')[-1].lower()} is not found" in text:
        return NoAccessError
    if any(phrase in text for phrase in _CONTEXT_TOO_LONG):
        return ContextTooLongError
    if status == 401 or names & _AUTH_TYPES or any(p in text for p in _AUTH_PHRASES):
        return AuthenticationError
    if status == 429 or names & _RATE_LIMIT_TYPES:
        return RateLimitError
    if status in _OVERLOADED_STATUSES or names & _OVERLOADED_TYPES:
        return OverloadedError
    if status is None:
        return None
    if status in (408, 409) or status >= 500:
        return UpstreamUnavailableError
    if 300 <= status < 500:
        return BadRequestError
    return ProviderError


def parse_retry_after(
    headers: Mapping[str, str] | None, *, now: float | None = None
) -> float | None:
    """Seconds to wait from `retry-after-ms`, or `Retry-After` (seconds or an HTTP date).

    None when absent or unparseable; never negative.
    """
    if not headers:
        return None
    lowered = {k.lower(): v for k, v in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis:
        try:
            return max(float(millis) / 1000.0, 0.0)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    current = time.time() if now is None else now
    return max(when.timestamp() - current, 0.0)


def error_from_response(
    status: int,
    body: str,
    *,
    model: str,
    headers: Mapping[str, str] | None = None,
    secrets: Iterable[str] = (),
) -> ProviderError:
    """The error for a non-2xx HTTP answer. `secrets` (the request's key) are redacted."""
    secrets = tuple(secrets)
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    message, names = _error_fields(parsed)
    text = body.lower()
    if 300 <= status < 400:
        location = (headers or {}).get("location") or (headers or {}).get("Location") or "?"
        raw = f"upstream answered {status} redirect to {location}; redirects are not followed"
        return BadRequestError(redact(_clip(raw), secrets), status=status, model=model)
    raw = redact(_clip(message or _markup_summary(body) or body or ""), secrets)
    cls = _classify(text, status=status, names=names, model=model) or ProviderError
    retryable = None
    if cls is UpstreamUnavailableError:
        retryable = status in (408, 409, 500, 502, 503, 504)
    return cls(
        raw,
        status=status,
        model=model,
        retryable=retryable,
        retry_after=parse_retry_after(headers),
    )


def error_from_event(
    payload: Mapping[str, Any] | str,
    *,
    model: str,
    partial: AssistantTurn | None = None,
    secrets: Iterable[str] = (),
) -> ProviderError:
    """The error for an `error` event inside a stream that began with HTTP 200.

    Recognised failures (overloaded, rate limit, quota, access, context) keep their kind;
    anything else is a `StreamError`. `partial` is what was streamed before the event.
    """
    if isinstance(payload, str):
        try:
            parsed: Any = json.loads(payload)
        except ValueError:
            parsed = {"error": {"message": payload}}
        body = payload
    else:
        parsed = dict(payload)
        body = json.dumps(parsed, ensure_ascii=False)
    message, names = _error_fields(parsed)
    raw = redact(_clip(message or body), tuple(secrets))
    cls = _classify(body.lower(), status=None, names=names, model=model) or StreamError
    return cls(raw, model=model, partial=partial)
