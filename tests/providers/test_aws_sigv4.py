"""SigV4 against AWS's published signing test suite, and against botocore's signer.

Vectors: the 2015 `aws-sig-v4-test-suite` (AWS General Reference), as vendored by
awslabs/aws-c-auth under tests/aws-signing-test-suite/v4/<name>/ (header-signed-request,
context.json). Every vector signs at 2015-08-30T12:36:00Z in us-east-1 for service
"service" with the example key pair below, and none signs x-amz-content-sha256.
"""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from providers.aws_sigv4 import (
    AwsCredentials,
    canonical_request,
    credential_scope,
    sign,
    string_to_sign,
)

SUITE_KEY = AwsCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
SUITE_TOKEN = "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267"
SUITE_TIME = dt.datetime(2015, 8, 30, 12, 36, tzinfo=dt.UTC)
EMPTY_HASH = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
URL = "https://example.amazonaws.com/"

# name → (method, url, headers, body, session token, SignedHeaders, Signature)
VECTORS = {
    "get-vanilla": (
        "GET",
        URL,
        {},
        b"",
        None,
        "host;x-amz-date",
        "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
    ),
    "post-vanilla": (
        "POST",
        URL,
        {},
        b"",
        None,
        "host;x-amz-date",
        "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b",
    ),
    "get-vanilla-query-order-key-case": (
        "GET",
        URL + "?Param2=value2&Param1=value1",
        {},
        b"",
        None,
        "host;x-amz-date",
        "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
    ),
    "post-x-www-form-urlencoded": (
        "POST",
        URL,
        {"Content-Type": "application/x-www-form-urlencoded"},
        b"Param1=value1",
        None,
        "content-type;host;x-amz-date",
        "ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a",
    ),
    "get-header-value-trim": (
        "GET",
        URL,
        {"My-Header1": " value1", "My-Header2": ' "a   b   c"'},
        b"",
        None,
        "host;my-header1;my-header2;x-amz-date",
        "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736",
    ),
    "get-vanilla-with-session-token": (
        "GET",
        URL,
        {},
        b"",
        SUITE_TOKEN,
        "host;x-amz-date;x-amz-security-token",
        "07ec1639c89043aa0e3e2de82b96708f198cceab042d4a97044c66dd9f74e7f8",
    ),
}


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_the_published_suite_vectors_sign_identically(name):
    method, url, headers, body, token, signed, signature = VECTORS[name]
    credentials = AwsCredentials(SUITE_KEY.access_key_id, SUITE_KEY.secret_access_key, token)

    added = sign(
        method,
        url,
        headers,
        body,
        credentials=credentials,
        region="us-east-1",
        service="service",
        now=SUITE_TIME,
        sign_content_sha256=False,
    )

    assert added["X-Amz-Date"] == "20150830T123600Z"
    assert added["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
    if token:
        assert added["X-Amz-Security-Token"] == token


def test_post_vanilla_canonical_request_and_string_to_sign_match_the_suite():
    headers = {"host": "example.amazonaws.com", "x-amz-date": "20150830T123600Z"}
    canonical, signed = canonical_request("POST", URL, headers, EMPTY_HASH)

    assert canonical == (
        "POST\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n"
        f"host;x-amz-date\n{EMPTY_HASH}"
    )
    assert signed == "host;x-amz-date"
    scope = credential_scope("20150830", "us-east-1", "service")
    assert string_to_sign("20150830T123600Z", scope, canonical) == (
        "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
        "553f88c9e4d10fc9e109e2aeb65f030801b70c2f6468faca261d401ae622fc87"
    )


def _botocore_signature(
    url: str, headers: dict[str, str], body: bytes, credentials: AwsCredentials, region: str
) -> str:
    """botocore's signature for the request as sent (its `Host` derived from the URL)."""
    request = AWSRequest(method="POST", url=url, data=body, headers=headers)
    request.context["timestamp"] = headers["X-Amz-Date"]
    signer = SigV4Auth(
        Credentials(
            credentials.access_key_id, credentials.secret_access_key, credentials.session_token
        ),
        "bedrock",
        region,
    )
    canonical = signer.canonical_request(request)
    return signer.signature(signer.string_to_sign(request, canonical), request)


@pytest.mark.parametrize("token", [None, "FQoGZXIvYXdzEXAMPLETOKEN"])
def test_a_bedrock_request_signs_as_botocore_does_with_the_model_id_escaped_twice(token):
    url = (
        "https://bedrock-runtime.eu-central-1.amazonaws.com/model/"
        "anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse-stream"
    )
    body = b'{"messages":[{"role":"user","content":[{"text":"Gr\xc3\xbcezi"}]}]}'
    headers = {"Content-Type": "application/json"}
    credentials = AwsCredentials("AKIDBEDROCK", "bedrock/secret/key", token)
    added = sign(
        "POST",
        url,
        headers,
        body,
        credentials=credentials,
        region="eu-central-1",
        service="bedrock",
    )
    sent = {**headers, **{k: v for k, v in added.items() if k != "Authorization"}}

    expected = _botocore_signature(url, sent, body, credentials, "eu-central-1")

    assert added["Authorization"].endswith(f"Signature={expected}")
    assert added["X-Amz-Content-Sha256"] == hashlib.sha256(body).hexdigest()
    signed = "content-type;host;x-amz-content-sha256;x-amz-date"
    if token:
        signed += ";x-amz-security-token"
    assert f"SignedHeaders={signed}," in added["Authorization"]


def test_a_non_default_port_is_part_of_the_signed_host():
    url = "http://127.0.0.1:8123/model/m/converse"
    added = sign(
        "POST", url, {}, b"{}", credentials=SUITE_KEY, region="us-east-1", service="bedrock"
    )
    sent = {k: v for k, v in added.items() if k != "Authorization"}

    expected = _botocore_signature(url, sent, b"{}", SUITE_KEY, "us-east-1")

    assert added["Authorization"].endswith(f"Signature={expected}")


def test_the_secret_and_token_never_appear_in_the_credentials_repr():
    credentials = AwsCredentials("AKIDEXAMPLE", "very-secret-key", "session-token-value")
    assert "very-secret-key" not in repr(credentials)
    assert "session-token-value" not in repr(credentials)


def test_a_callers_own_authorization_or_date_header_is_replaced_not_signed_twice():
    added = sign(
        "GET",
        URL,
        {"Authorization": "Bearer stale", "X-Amz-Date": "19990101T000000Z"},
        b"",
        credentials=SUITE_KEY,
        region="us-east-1",
        service="service",
        now=SUITE_TIME,
        sign_content_sha256=False,
    )
    assert added["Authorization"].endswith(VECTORS["get-vanilla"][-1])
