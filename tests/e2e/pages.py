"""What the journeys do on a page, in the product's words: sign in, send, wait for the
socket or a committed reply. Selectors live here so a template change is fixed once."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import pytest

# A page waits this long (ms) for what a streamed reply or a socket should bring.
LIVE_TIMEOUT_MS = 20_000

MODEL = "anthropic:claude-e2e"
# Distinctive so a leak is unmistakable; pages may show only its last four characters.
API_KEY = "sk-ant-e2e-secret-9f3kQWXYZ"
ALICE_PASSWORD = "alice-pass-123"
BOB_PASSWORD = "bob-pass-123"
ROOT_PASSWORD = "root-pass-123"

# The viewports and colour schemes the journeys run in (desktop and phone, light and dark).
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
LOOKS = [
    pytest.param(DESKTOP, "light", id="desktop-light"),
    pytest.param(DESKTOP, "dark", id="desktop-dark"),
    pytest.param(PHONE, "light", id="phone-light"),
    pytest.param(PHONE, "dark", id="phone-dark"),
]

# axe-core (vendored) and a run of it that returns its serious and critical findings.
AXE = "/static/vendor/axe-core/axe.min.js"
RUN_AXE = """async () => {
  const result = await axe.run(document, { resultTypes: ["violations"] });
  return result.violations.filter((v) => v.impact === "serious" || v.impact === "critical")
    .map((v) => `${v.id}: ${v.nodes.slice(0, 3).map((n) => n.target.join(" ")).join(", ")}`);
}"""


def sign_in(page: Any, base_url: str, username: str, password: str) -> None:
    """Sign in through the form, as a person would; ends on the page after sign-in."""
    page.goto(f"{base_url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button:has-text('Sign in')")
    page.wait_for_selector(".topbar .who")


def sign_in_admin(page: Any, base_url: str, username: str, password: str) -> None:
    """Sign in through the admin's own form."""
    page.goto(f"{base_url}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_selector("#user-tools")


def save_anthropic_settings(page: Any, base_url: str, *, api_key: str, upstream: str) -> None:
    """The signed-in user's own Anthropic key, pointed at `upstream` (a fake), through
    the Settings page."""
    page.goto(f"{base_url}/settings/")
    page.get_by_role("link", name="Add your Anthropic settings").click()
    page.fill("#id_api_key", api_key)
    page.fill("#id_base_url", upstream)
    page.click("button:has-text('Save')")


def wait_connected(page: Any) -> None:
    """The chat page's socket is open (static/js/chat.js marks its state)."""
    page.wait_for_selector("[data-connection][data-state=open]", state="attached")


def send(page: Any, message: str) -> None:
    page.fill("[data-composer-text]", message)
    page.press("[data-composer-text]", "Enter")


def transcript_text(page: Any) -> str:
    return page.inner_text("#transcript")


def wait_streamed(page: Any, words: str) -> None:
    """`words` are visible in the reply being streamed (not yet committed)."""
    page.wait_for_function(
        "(words) => (document.querySelector('[data-live] .streamed-text')?.textContent || '')"
        ".includes(words)",
        arg=words,
        timeout=LIVE_TIMEOUT_MS,
    )


def assistant_with(page: Any, words: str) -> Any:
    """The committed (server-rendered) assistant message containing `words`."""
    locator = page.locator("[data-items] article.msg-assistant[data-seq]", has_text=words)
    locator.first.wait_for(timeout=LIVE_TIMEOUT_MS)
    return locator


def tiny_png() -> bytes:
    """A valid 1x1 PNG (attachments are sniffed by content, not by name)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00")
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )
