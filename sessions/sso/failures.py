"""Why a single sign-on did not happen, in plain words for the error page.

Each reason carries the HTTP status of its page and a sentence a person can act on; the
technical detail goes to the log, never to the page (it can name endpoints or claims).
"""

from __future__ import annotations

from enum import Enum


class Failure(Enum):
    PROVIDER_DOWN = (
        502,
        "We couldn't reach {provider}. It may be down, or unreachable from this server. "
        "Please try again in a few minutes.",
    )
    CLIENT_REJECTED = (
        502,
        "{provider} refused this application's sign-in settings (the client id or secret "
        "configured here). Your administrator needs to correct them.",
    )
    DENIED = (
        403,
        "Sign-in was cancelled or refused at {provider}, so you are not signed in.",
    )
    BAD_STATE = (
        400,
        "This sign-in attempt has expired or was already used. Please start again from "
        "the sign-in page.",
    )
    BAD_TOKEN = (
        400,
        "{provider}'s answer could not be verified, so you were not signed in. Please "
        "try again; if it keeps happening, tell your administrator.",
    )
    DEACTIVATED = (403, "This account is deactivated here. Ask your administrator.")
    LINK_NOT_ALLOWED = (
        403,
        "An account with this email address already exists here, and it can't be joined "
        "to your {provider} sign-in automatically. Ask your administrator.",
    )
    MISCONFIGURED = (
        503,
        "Sign-in with {provider} isn't set up correctly here (its stored secret can't be "
        "read). Your administrator needs to enter it again.",
    )
    UNKNOWN_PROVIDER = (404, "This sign-in option doesn't exist or has been turned off.")

    @property
    def status(self) -> int:
        return self.value[0]

    def message(self, provider_name: str) -> str:
        return self.value[1].format(provider=provider_name or "the identity provider")


class SignInRefused(Exception):
    def __init__(self, failure: Failure, detail: str = "") -> None:
        super().__init__(detail or failure.name)
        self.failure = failure
