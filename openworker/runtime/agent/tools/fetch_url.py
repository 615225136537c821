"""`fetch_url`: read a web page or text document for the model, through the SSRF guard.

The request goes out through `GuardedTransport`, which resolves the host, refuses private,
loopback, link-local and metadata addresses (unless the server's policy admits them) and
connects to the very address it checked. Redirects are not followed: the model is told
where the redirect points and may fetch that URL explicitly, so every hop is checked.
Only text types are read, at most `MAX_BODY_BYTES`, and HTML is reduced to its readable
text. The page's content is data for the model, never instructions from this server.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

import httpx
from bs4 import BeautifulSoup

from providers.errors import OutboundBlockedError, ProviderError
from providers.outbound import GuardedTransport, OutboundPolicy

from .base import Policy, Tool, ToolContext, ToolError, ToolResult

CONNECT_TIMEOUT_SECONDS = 10.0
# The whole exchange is bounded by a deadline checked between reads; one read waits at most
# READ_TIMEOUT_SECONDS, so a server dripping bytes is cut off within TOTAL + READ seconds.
TOTAL_TIMEOUT_SECONDS = 20.0
READ_TIMEOUT_SECONDS = 10.0
# Enough for any article or documentation page; beyond it the answer is a download.
MAX_BODY_BYTES = 2 * 1024 * 1024
DEFAULT_MAX_CHARS = 20_000
# ~25k tokens: a larger page would crowd out the conversation in most context windows.
MAX_MAX_CHARS = 100_000

TEXT_TYPES = frozenset(
    {"text/html", "application/xhtml+xml", "text/plain", "text/markdown", "application/json"}
)
XML_TYPES = frozenset({"text/xml", "application/xml"})
# Not content a reader sees: dropped before the text is taken.
HTML_DROP_TAGS = ("script", "style", "nav", "noscript", "template", "svg")
HTML_BLOCK_TAGS = (
    "p", "div", "section", "article", "main", "header", "footer", "aside", "li", "ul", "ol",
    "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "table", "tr", "dd", "dt", "hr",
    "figcaption", "form", "title",
)  # fmt: skip
USER_AGENT = "OpenWorker-fetch/0.1 (+https://github.com/openworker)"
ACCEPT = "text/html, text/markdown, text/plain, application/json, application/xml;q=0.9"

_SPACES = re.compile(r"[ \t\f\v\u00a0]+")
_BLANK_RUNS = re.compile(r"\n{3,}")


def tool_outbound_policy(*, environ: Mapping[str, str] | None = None) -> OutboundPolicy:
    """Where tools may connect, the same in both run modes: no loopback, private,
    link-local or metadata address unless the admin's `OPENWORKER_OUTBOUND_ALLOWLIST`
    names it. Provider base URLs keep their own rule (embedded mode admits loopback so a
    local Ollama works); a tool must not read the server's own loopback services for
    whoever asks the model to."""
    return OutboundPolicy.from_env(embedded=False, environ=environ)


def is_text_type(media_type: str) -> bool:
    return media_type in TEXT_TYPES or media_type in XML_TYPES or media_type.endswith("+xml")


def html_to_text(html: str | bytes) -> str:
    """The readable text of an HTML document: scripts, styles and navigation removed,
    one line per block, runs of blank lines collapsed. Bytes are decoded by BeautifulSoup
    (which honours a `<meta charset>`)."""
    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(HTML_DROP_TAGS):
        tag.decompose()
    for br in soup("br"):
        br.replace_with("\n")
    for block in soup(HTML_BLOCK_TAGS):
        block.insert_before("\n")
        block.insert_after("\n")
    text = soup.get_text()
    lines = (_SPACES.sub(" ", line).strip() for line in text.splitlines())
    return _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip()


class FetchUrlTool(Tool):
    name = "fetch_url"
    description = (
        "Fetch a public web page or text document (HTML, plain text, Markdown, JSON, XML) and "
        "return its readable text. Redirects are not followed: the result names the target, "
        "which you may fetch in a second call."
    )
    parameters = {
        "type": "object",
        "properties": {
            "url": {"type": "string", "description": "An http:// or https:// URL."},
            "max_chars": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_MAX_CHARS,
                "description": f"Cap on the returned text (default {DEFAULT_MAX_CHARS}).",
            },
        },
        "required": ["url"],
        "additionalProperties": False,
    }
    # Fetching reaches outside the organisation and can leak context through the URL.
    default_policy: Policy = "ask"

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult | str:
        url: str = args["url"]
        max_chars: int = args.get("max_chars", DEFAULT_MAX_CHARS)
        timeout = httpx.Timeout(READ_TIMEOUT_SECONDS, connect=CONNECT_TIMEOUT_SECONDS)
        headers = {"User-Agent": USER_AGENT, "Accept": ACCEPT}
        try:
            with httpx.Client(
                transport=GuardedTransport(ctx.outbound_policy),
                follow_redirects=False,
                timeout=timeout,
                headers=headers,
            ) as client:
                return self._fetch(client, url, max_chars)
        except OutboundBlockedError as exc:
            raise ToolError(f"refused: {exc.raw_message}") from None
        except httpx.InvalidURL as exc:
            # Raised while the URL is parsed, before the guard sees it (`0177.0.0.1`).
            raise ToolError(f"refused: not a valid URL: {exc}") from None
        except ProviderError as exc:
            raise ToolError(f"could not fetch {url}: {exc.raw_message}") from None
        except httpx.TimeoutException:
            raise ToolError(f"could not fetch {url}: timed out") from None
        except httpx.HTTPError as exc:
            raise ToolError(f"could not fetch {url}: {exc or type(exc).__name__}") from None

    def _fetch(self, client: httpx.Client, url: str, max_chars: int) -> ToolResult | str:
        deadline = time.monotonic() + TOTAL_TIMEOUT_SECONDS
        with client.stream("GET", url) as response:
            if response.is_redirect:
                location = response.headers.get("location", "")
                target = str(response.url.join(location)) if location else "(no Location)"
                return (
                    f"HTTP {response.status_code} redirect to {target}\n"
                    "Redirects are not followed automatically; call fetch_url with that URL "
                    "to read it."
                )
            if response.status_code >= 400:
                raise ToolError(f"HTTP {response.status_code} {response.reason_phrase} for {url}")
            media_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
            if not is_text_type(media_type):
                shown = media_type or "none given"
                raise ToolError(
                    f"unsupported content type ({shown}); fetch_url reads HTML, plain text, "
                    "Markdown, JSON and XML only"
                )
            body = self._read_body(response, deadline)
        if media_type in ("text/html", "application/xhtml+xml"):
            text = html_to_text(body if not response.charset_encoding else _decode(response, body))
        else:
            text = _decode(response, body)
        return _format(str(response.url), media_type, text, max_chars)

    @staticmethod
    def _read_body(response: httpx.Response, deadline: float) -> bytes:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise ToolError(_too_large(int(declared)))
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise ToolError(_too_large(None))
            chunks.append(chunk)
            if time.monotonic() > deadline:
                raise ToolError(f"timed out: no complete answer in {TOTAL_TIMEOUT_SECONDS:.0f} s")
        return b"".join(chunks)


def _too_large(declared: int | None) -> str:
    size = f" ({declared:,} bytes)" if declared is not None else ""
    return f"the response{size} is larger than the {MAX_BODY_BYTES // (1024 * 1024)} MB limit"


def _decode(response: httpx.Response, body: bytes) -> str:
    try:
        return body.decode(response.charset_encoding or "utf-8", errors="replace")
    except LookupError:  # a charset name Python does not know
        return body.decode("utf-8", errors="replace")


def _format(url: str, media_type: str, text: str, max_chars: int) -> str:
    header = f"URL: {url}\nContent-Type: {media_type}\n\n"
    if len(text) > max_chars:
        note = f"\n[truncated: the first {max_chars:,} of {len(text):,} characters are shown]"
        return header + text[:max_chars] + note
    return header + (text or "[the document has no readable text]")
