"""The web process's access log: every request is logged, no query string is (OAuth and
SSO callbacks carry an authorization code and state there)."""

from __future__ import annotations

import time

import httpx

from openworker.web_server import REDACTED_QUERY, path_without_query
from tests.support import embedded

SECRET_CODE = "c0de-0f-the-callback-Zq81"
LAST = "/last-request-of-the-test"


def test_a_query_string_is_replaced_by_a_marker_and_a_plain_path_is_kept():
    assert path_without_query("/sso/callback?code=a&state=b") == "/sso/callback" + REDACTED_QUERY
    assert path_without_query("/sessions/?q=") == "/sessions/" + REDACTED_QUERY
    assert path_without_query("/healthz") == "/healthz"


def test_the_access_log_keeps_requests_and_leaves_their_query_strings_out(tmp_path):
    env = embedded.embedded_env(tmp_path)
    embedded.manage(env, "migrate", "--noinput")
    with embedded.daphne(env) as (base, proc):
        for path in (
            f"/healthz?code={SECRET_CODE}",
            f"/mcp/oauth/callback?code={SECRET_CODE}&state={SECRET_CODE}",
            f"/accounts/sso/callback/?code={SECRET_CODE}&state=s",
            LAST,
        ):
            httpx.get(base + path, timeout=10)
        # Daphne writes a request's line just after its response: wait for the last one.
        deadline = time.monotonic() + 10
        while LAST not in (output := proc.output()) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert f'"GET /healthz{REDACTED_QUERY}" 200' in output
    assert f'"GET {LAST}" 404' in output  # a request without a query, as Daphne logs it
    assert SECRET_CODE not in output
