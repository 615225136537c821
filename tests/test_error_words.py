"""A failed turn is told in plain words per failure class, never the transport's own
text (sessions.presenters.error_view): the footer of the chat page and of its reload."""

from __future__ import annotations

import pytest

from sessions.presenters import ERROR_WORDS, error_view

CASES = [
    ("no_access", "This API key does not have access to the model 'x'.", "no_access"),
    ("no_quota", "The provider account for this key is out of credit or quota.", "no_quota"),
    ("rate_limited", "The provider is rate-limiting requests. Try again in 12 s.", "rate_limited"),
    ("unavailable", "The provider could not be reached: HTTP 500", "upstream"),
    ("unavailable", "The provider could not be reached: Internal server error", "upstream"),
    (
        "unavailable",
        "The provider could not be reached: [Errno 111] Connection refused",
        "unreachable",
    ),
    (
        "unavailable",
        "The provider could not be reached: All connection attempts failed",
        "unreachable",
    ),
    ("unavailable", "The provider could not be reached: timed out: ReadTimeout", "timed_out"),
    ("stream", "The reply stream broke off: no data from the upstream for 60 s", "timed_out"),
    ("stream", "The reply stream broke off: the connection was lost mid-stream", "stream"),
    ("interrupted", "The worker running this reply stopped. Retry to continue.", "interrupted"),
    ("something_new", "Traceback (most recent call last): KeyError", "internal"),
]


@pytest.mark.parametrize(("kind", "error", "expected"), CASES)
def test_each_failure_class_gets_its_own_plain_words(kind: str, error: str, expected: str) -> None:
    view = error_view(kind, error, "failed")
    assert view["class"] == expected
    assert view["words"] == ERROR_WORDS[expected]
    for raw in ("Errno", "HTTP", "Traceback", "KeyError", "ReadTimeout", "Connection refused"):
        assert raw not in view["words"]


def test_rate_limited_carries_the_seconds_to_wait() -> None:
    assert error_view("rate_limited", "Try again in 12 s.", "failed")["retry_in"] == 12
    assert error_view("rate_limited", "Try again in a moment.", "failed")["retry_in"] is None


def test_a_stopped_turn_says_stopped_and_an_interrupted_one_without_a_kind_is_interrupted() -> None:
    assert error_view("", "", "cancelled")["words"] == "Stopped."
    assert error_view("", "", "interrupted")["class"] == "interrupted"
