"""AWS Signature Version 4 request signing, for Bedrock's access-key credentials.

Written by hand (a few dozen lines of hashing) rather than pulling botocore into the
product for one function; it is checked against AWS's published signing test suite
(`tests/providers/test_aws_sigv4.py`) and against botocore's signer in the tests.

The four steps, each a function so a failure points at one of them:
1. `canonical_request`: method, canonical URI, canonical query, canonical headers,
   signed header names, payload hash, joined by newlines;
2. `string_to_sign`: algorithm, timestamp, credential scope, hash of step 1;
3. `signing_key`: HMAC chain secret → date → region → service → "aws4_request";
4. the signature: HMAC of step 2 with step 3, hex, in the `Authorization` header.

Contract of `sign`: it signs exactly the bytes given as `body` and exactly the headers
given (plus `host`, `x-amz-date`, and `x-amz-content-sha256` / `x-amz-security-token`
when they apply), and returns the headers to add. The caller must then send those bytes
and those header values unchanged: the wire module signs `transport.encode_body(body)`,
the very serializer the transport sends with.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlsplit

ALGORITHM = "AWS4-HMAC-SHA256"
TIMESTAMP_FORMAT = "%Y%m%dT%H%M%SZ"
SCOPE_TERMINATOR = "aws4_request"
# RFC 3986 unreserved characters are the only ones left unescaped in canonical forms.
_UNRESERVED = "-_.~"
_DEFAULT_PORTS = {"http": 80, "https": 443}
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class AwsCredentials:
    """An access key pair, with the session token of temporary (STS) credentials."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode("utf-8"), hashlib.sha256).digest()


def _encode(value: str, *, safe: str = "") -> str:
    return quote(value, safe=_UNRESERVED + safe)


def canonical_uri(path: str) -> str:
    """The path with every segment URI-encoded once more (non-S3 services).

    The path is taken as sent, so an already escaped character is escaped again: a
    Bedrock model id `a:0` travels as `a%3A0` and is signed as `a%253A0`, which is what
    the service (and botocore) computes. Dot segments are not resolved: our paths never
    carry any, and the raw path is what the server sees.
    """
    if not path:
        return "/"
    return "/".join(_encode(segment) for segment in path.split("/"))


def canonical_query(query: str) -> str:
    """Query pairs decoded, re-encoded strictly, sorted by name then value."""
    if not query:
        return ""
    pairs = []
    for item in query.split("&"):
        if not item:
            continue
        name, _, value = item.partition("=")
        pairs.append((_encode(unquote(name)), _encode(unquote(value))))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


def _host(url_host: str, scheme: str, port: int | None) -> str:
    """The Host header as the HTTP client writes it (IPv6 literals in brackets)."""
    if ":" in url_host:
        url_host = f"[{url_host}]"
    if port is None or port == _DEFAULT_PORTS.get(scheme):
        return url_host
    return f"{url_host}:{port}"


def canonical_headers(headers: Mapping[str, str]) -> tuple[str, str]:
    """(canonical header block, signed header names): names lower-cased and sorted,
    values trimmed with inner runs of spaces collapsed to one."""
    merged: dict[str, list[str]] = {}
    for name, value in headers.items():
        merged.setdefault(name.strip().lower(), []).append(_SPACES.sub(" ", str(value).strip()))
    names = sorted(merged)
    block = "".join(f"{name}:{','.join(merged[name])}\n" for name in names)
    return block, ";".join(names)


def canonical_request(
    method: str, url: str, headers: Mapping[str, str], payload_hash: str
) -> tuple[str, str]:
    """(canonical request, signed header names) for `headers` as they will be sent."""
    parts = urlsplit(url)
    block, signed = canonical_headers(headers)
    text = "\n".join(
        [
            method.upper(),
            canonical_uri(parts.path),
            canonical_query(parts.query),
            block,
            signed,
            payload_hash,
        ]
    )
    return text, signed


def credential_scope(date: str, region: str, service: str) -> str:
    return f"{date}/{region}/{service}/{SCOPE_TERMINATOR}"


def string_to_sign(timestamp: str, scope: str, canonical: str) -> str:
    return "\n".join([ALGORITHM, timestamp, scope, sha256_hex(canonical.encode("utf-8"))])


def signing_key(secret_access_key: str, date: str, region: str, service: str) -> bytes:
    key = _hmac(f"AWS4{secret_access_key}".encode(), date)
    key = _hmac(key, region)
    key = _hmac(key, service)
    return _hmac(key, SCOPE_TERMINATOR)


def sign(
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    credentials: AwsCredentials,
    region: str,
    service: str,
    now: dt.datetime | None = None,
    sign_content_sha256: bool = True,
) -> dict[str, str]:
    """The headers that make this request signed: `X-Amz-Date`, `Authorization`, and
    `X-Amz-Content-Sha256` / `X-Amz-Security-Token` when they apply.

    Every header in `headers` is signed, so pass only headers that reach the server
    unchanged (not ones a proxy or the HTTP client may rewrite). `Host` is derived from
    the URL as the HTTP client derives it. `sign_content_sha256=False` leaves the payload
    hash header out, as AWS's published test vectors do.
    """
    moment = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    timestamp = moment.strftime(TIMESTAMP_FORMAT)
    date = timestamp[:8]
    parts = urlsplit(url)
    payload_hash = sha256_hex(body)

    added: dict[str, str] = {"X-Amz-Date": timestamp}
    if sign_content_sha256:
        added["X-Amz-Content-Sha256"] = payload_hash
    if credentials.session_token:
        added["X-Amz-Security-Token"] = credentials.session_token

    to_sign = {name: value for name, value in headers.items() if name.lower() not in _OWN_HEADERS}
    to_sign["host"] = _host(parts.hostname or "", parts.scheme, parts.port)
    to_sign.update(added)
    canonical, signed = canonical_request(method, url, to_sign, payload_hash)
    scope = credential_scope(date, region, service)
    signature = hmac.new(
        signing_key(credentials.secret_access_key, date, region, service),
        string_to_sign(timestamp, scope, canonical).encode("utf-8"),
        hashlib.sha256,
    ).hexdigest()
    added["Authorization"] = (
        f"{ALGORITHM} Credential={credentials.access_key_id}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
    return added


# Headers `sign` derives itself; a caller's copy is ignored rather than signed twice.
_OWN_HEADERS = frozenset(
    {"host", "authorization", "x-amz-date", "x-amz-content-sha256", "x-amz-security-token"}
)
