"""Output safety: the XSS corpus through every way text reaches a page, in headless Chromium.

The corpus (`xss_corpus.py`, 114 payloads) enters through:

- user input: typed into the composer of a live session, and stored user messages;
- model output: streamed by the fake upstream in a real turn (Daphne + Celery + Redis +
  PostgreSQL) and audited mid-stream (the page renders streamed Markdown live), and stored
  assistant messages;
- reasoning: streamed and stored;
- tool output: a live tool call to a tool named by the payload (the engine's "no tool
  named ..." result quotes it), and stored tool results with hostile tool names;
- tool-call names and arguments (the chat page's tool cards);
- file names: attachment names on user messages;
- session titles (the session list, the chat header, the admin changelist) and a failed
  turn's error text (the turn footer);
- exports: Markdown, JSON and the zip are downloads (`Content-Disposition: attachment`,
  never `text/html`, `nosniff`), checked by header and by Chromium downloading them.

Pages: the owner's chat view (live, then reloaded), the session list, and the admin's
review page (after giving a reason) and session changelist. On every page a trap is
installed before any script runs: `window.__xss(n)` and `alert/confirm/prompt` record a
hit, dialogs are recorded, CSP violations are counted. After the page settles (every
`<details>` opened so toggles fire) we assert: no hit, no dialog, no element with an
`on*` attribute, no `javascript:`/`vbscript:`/`data:text/html` URL in any URL attribute,
no script but our own static files and the JSON page data, no injected
iframe/object/embed/base/meta/form/style element in the content; and the
Content-Security-Policy has no `unsafe-inline` or `unsafe-eval`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest
from django.contrib.auth import get_user_model

from sessions import services
from sessions.models import Message, Session, Turn
from tests.e2e.conftest import browser, new_page, shot, stack  # noqa: F401 - fixtures
from tests.fakes import Reply, drip, reasoning, text, tool_call
from tests.security.figures import record
from tests.security.xss_corpus import payloads
from tests.support.chat import point_provider_at, session_cookie, wait_for_turn_status

pytestmark = [pytest.mark.distributed, pytest.mark.django_db(transaction=True)]

MODEL = "anthropic:claude-test-1"
PAYLOADS = payloads()
CORPUS = "\n\n".join(p for _n, p in PAYLOADS)
# How long a page gets to run whatever it would run (timers, media errors, toggles).
SETTLE_MS = 1500
# A payload's number shows up in the page text when it was rendered (as text); at least
# this share of them must, or the payloads did not reach the page and the test proves little.
MIN_VISIBLE_SHARE = 0.8
# Seconds between streamed events of the live reply: 228 events take about 7 s, so the
# mid-stream audit (SETTLE_MS) runs while the reply still streams.
STREAM_DRIP_SECONDS = 0.03

TRAP = """
window.__xssHits = [];
window.__cspViolations = [];
window.__xss = (n) => { window.__xssHits.push(String(n)); };
for (const name of ["alert", "confirm", "prompt", "print"]) {
  const original = window[name];
  window[name] = function (...args) {
    window.__xssHits.push(name + ":" + String(args[0]));
    return original ? original.apply(this, args) : undefined;
  };
}
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push(e.violatedDirective + " " + e.blockedURI);
});
"""

# Everything the DOM must not hold, wherever the text came from.
DOM_AUDIT = """
() => {
  const bad = [];
  const urlAttrs = new Set(["href", "src", "action", "formaction", "xlink:href", "data",
    "srcdoc", "background", "poster", "ping", "srcset", "content"]);
  const hostile = /^(javascript|vbscript|data:text\\/html|data:image\\/svg)/;
  for (const node of document.querySelectorAll("*")) {
    for (const attr of node.attributes) {
      const name = attr.name.toLowerCase();
      const value = attr.value.replace(/[\\u0000-\\u0020\\u200b]/g, "").toLowerCase();
      if (name.startsWith("on")) bad.push(`${node.tagName} ${name}=${attr.value}`);
      const where = `${node.tagName} ${name}=${attr.value}`;
      if (urlAttrs.has(name) && hostile.test(value)) bad.push(where);
    }
  }
  for (const script of document.querySelectorAll("script")) {
    const src = script.getAttribute("src") || "";
    const ours = src.startsWith("/static/") || script.type === "application/json";
    if (!ours) bad.push(`script ${src || script.textContent.slice(0, 80)}`);
  }
  for (const tag of ["iframe", "object", "embed", "frame", "applet", "base"]) {
    for (const node of document.querySelectorAll(tag)) bad.push(`element ${tag}`);
  }
  const content = "#transcript, .markdown, .msg, .tool-output, #content table:not(#result_list)";
  for (const root of document.querySelectorAll(content)) {
    // (Django's admin draws its own icons as inline SVG; content never may.)
    const injected = "meta, link, style, form, input, textarea, select, svg, math";
    for (const node of root.querySelectorAll(injected)) {
      bad.push(`injected ${node.tagName}`);
    }
    for (const node of root.querySelectorAll("[style]")) bad.push(`style attr ${node.tagName}`);
  }
  return bad;
}
"""


class Audit:
    """Dialogs, trap hits and DOM findings across every page the test opens."""

    def __init__(self) -> None:
        self.dialogs: list[str] = []
        self.findings: list[str] = []
        self.pages = 0
        self.csp_violations = 0
        self.csp_headers: list[str] = []

    def watch(self, page: Any) -> Any:
        page.add_init_script(TRAP)
        page.on("dialog", self._dialog)
        page.on("response", self._response)
        return page

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def _response(self, response: Any) -> None:
        if response.request.resource_type == "document":
            policy = response.headers.get("content-security-policy")
            if policy is not None:
                self.csp_headers.append(policy)

    def check(self, page: Any, where: str) -> str:
        """Settle the page, audit it, and return its visible text."""
        page.evaluate("document.querySelectorAll('details').forEach((d) => { d.open = true; })")
        page.wait_for_timeout(SETTLE_MS)
        hits = page.evaluate("window.__xssHits")
        self.csp_violations += len(page.evaluate("window.__cspViolations"))
        found = page.evaluate(DOM_AUDIT)
        self.findings += [f"{where}: hit {h}" for h in hits]
        self.findings += [f"{where}: {f}" for f in found]
        self.pages += 1
        return page.inner_text("body")


def visible_numbers(page_text: str) -> set[int]:
    return {n for n, _p in PAYLOADS if f"xss({n})" in page_text or f"alert({n})" in page_text}


def open_as(make_page: Any, audit: Audit, base: str, user: Any) -> Any:
    page = audit.watch(make_page())
    cookie = session_cookie(user).split("=", 1)[1]
    page.context.add_cookies([{"name": "sessionid", "value": cookie, "url": base}])
    return page


def attachment_part(n: int, name: str) -> dict[str, Any]:
    meta = {"id": str(uuid.uuid4()), "name": name, "mime": "application/pdf", "size": 10}
    if n % 2:
        return {"type": "file", "file": {"filename": name, "file_data": "x"}, "attachment": meta}
    meta["mime"] = "image/png"
    return {"type": "image_url", "image_url": {"url": "attachment:x"}, "attachment": meta}


def stored_sessions(owner: Any) -> list[Session]:
    """Three sessions holding the corpus as stored data, one payload per message."""
    users = Session.objects.create(owner=owner, model=MODEL, title=PAYLOADS[0][1])
    assistant = Session.objects.create(owner=owner, model=MODEL, title=PAYLOADS[1][1])
    tools = Session.objects.create(owner=owner, model=MODEL, title=PAYLOADS[2][1])
    for n, payload in PAYLOADS[:100]:
        services.message_append(
            session_id=users.pk,
            role="user",
            content=[{"type": "text", "text": payload}, attachment_part(n, payload)],
        )
        services.message_append(
            session_id=assistant.pk,
            role="assistant",
            content=payload,
            reasoning=payload,
            tool_calls=[{"id": f"call_{n}", "name": payload, "arguments": {"q": payload}}],
            model=MODEL,
        )
        services.message_append(
            session_id=tools.pk,
            role="tool",
            content=payload,
            tool_call_id=f"call_{n}",
            extras={"tool": payload, "is_error": bool(n % 2)},
        )
    for session in (users, assistant, tools):
        Turn.objects.create(session=session, model=MODEL, status="failed", error=PAYLOADS[n % 7][1])
    # The rest of the corpus, and all of it again, as session titles (the session list).
    Session.objects.bulk_create(
        [Session(owner=owner, model=MODEL, title=p[:200]) for _n, p in PAYLOADS]
    )
    return [users, assistant, tools]


# The whole corpus through five pages, now also streamed slowly enough to audit mid-stream
# (about 10 s more): past the suite's 120 s default on a loaded 2-core machine.
@pytest.mark.timeout(300)
def test_no_payload_runs_in_the_chat_view_or_the_admin_review(
    stack: str,  # noqa: F811
    new_page: Any,  # noqa: F811
    owner: Any,
    anthropic_fake: Any,
) -> None:
    base = stack
    # Control: the trap and the DOM audit do catch a payload that runs (a page without
    # our CSP or sanitiser), so silence below means nothing ran.
    control = Audit()
    probe = control.watch(new_page())
    unsafe_page = "<p>x</p><img src=x onerror=__xss(0)><a href='javascript:alert(1)'>a</a>"
    probe.route(
        f"{base}/__control", lambda route: route.fulfill(body=unsafe_page, content_type="text/html")
    )
    probe.goto(f"{base}/__control")
    control.check(probe, "control")
    assert "control: hit 0" in control.findings and len(control.findings) >= 3, control.findings
    audit = Audit()
    admin = get_user_model().objects.create_superuser("root", password="root-pass-123")
    point_provider_at(owner, "anthropic", anthropic_fake.base_url)
    stored = stored_sessions(owner)
    live = Session.objects.create(owner=owner, model=MODEL)
    hostile_tool = PAYLOADS[15][1]
    # Streamed a payload at a time, slowly enough to audit the page mid-stream: the page
    # renders streamed Markdown live (static/js/renderer.js), so the live DOM is audited too.
    pieces = [f"{p}\n\n" for _n, p in PAYLOADS]
    anthropic_fake.push(
        Reply(
            drip(STREAM_DRIP_SECONDS),
            *[reasoning(p) for p in pieces],
            *[text(p) for p in pieces],
            tool_call(hostile_tool, {"q": CORPUS}),
        ),
        Reply(text(CORPUS)),
    )

    # 1. Live: the user types the corpus; the model streams it back as reasoning, text and
    # a call to a tool named by a payload, whose error result quotes it.
    page = open_as(new_page, audit, base, owner)
    page.goto(f"{base}/sessions/{live.pk}/")
    page.fill("[data-composer-text]", CORPUS)
    page.click("[data-send]")
    turn = None
    deadline = time.monotonic() + 30
    while turn is None and time.monotonic() < deadline:
        turn = Turn.objects.filter(session=live).first()
        time.sleep(0.1)
    assert turn is not None, "the composer did not start a turn"
    page.locator("[data-live] .streamed-text .md-block").first.wait_for(timeout=20_000)
    audit.check(page, "chat streaming")
    assert page.locator("[data-live] .streaming").count() == 1, "the audit ran mid-stream"
    turn, _ = wait_for_turn_status(turn.pk, {"completed", "failed"}, timeout=60)
    assert turn.status == "completed", turn.error
    # (A locator, not wait_for_function: the page's CSP forbids the eval that needs.)
    page.locator("#transcript [data-seq]").nth(3).wait_for(timeout=20_000)
    live_text = audit.check(page, "chat live")
    roles = list(Message.objects.filter(session=live).values_list("role", flat=True))
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert "no tool named" in Message.objects.get(session=live, role="tool").content
    page.reload()
    reloaded_text = audit.check(page, "chat reloaded")
    for where, shown in (("live", live_text), ("reloaded", reloaded_text)):
        share = len(visible_numbers(shown)) / len(PAYLOADS)
        assert share >= MIN_VISIBLE_SHARE, (where, share)

    # 2. Stored: user messages with hostile attachment names, assistant messages with
    # reasoning and tool cards, tool results with hostile tool names; titles; errors.
    for session in stored:
        page.goto(f"{base}/sessions/{session.pk}/")
        shown = audit.check(page, f"chat {session.title[:20]}")
        assert len(visible_numbers(shown)) >= MIN_VISIBLE_SHARE * 100, session.title
    page.goto(f"{base}/")
    audit.check(page, "session list")

    # 3. Exports are downloads, never pages.
    cookies = {"sessionid": session_cookie(owner).split("=", 1)[1]}
    exports = 0
    for session in [live, *stored]:
        for suffix in ("export.md", "export.json"):
            url = f"{base}/sessions/{session.pk}/{suffix}"
            response = httpx.get(url, cookies=cookies, timeout=20)
            assert response.status_code == 200, url
            kind = response.headers["content-type"]
            assert kind.split(";")[0] in {"text/markdown", "application/json"}, kind
            assert response.headers["content-disposition"].startswith("attachment"), url
            assert response.headers.get("x-content-type-options") == "nosniff"
            exports += 1
        with page.expect_download() as download:
            page.evaluate(f"location.href = '/sessions/{session.pk}/export.md'")
        assert download.value.suggested_filename.endswith(".md")
    response = httpx.get(f"{base}/sessions/export.zip", cookies=cookies, timeout=30)
    assert response.headers["content-type"] == "application/zip"
    assert response.headers["content-disposition"].startswith("attachment")
    exports += 1

    # 4. The admin: every session's review (after a reason) and the session changelist.
    admin_page = open_as(new_page, audit, base, admin)
    for session in [live, *stored]:
        admin_page.goto(f"{base}/admin/chat_sessions/session/{session.pk}/review/")
        admin_page.fill("[name=reason]", "XSS corpus check")
        admin_page.click("#content [type=submit]")
        admin_page.wait_for_selector("text=Read-only.")
        shown = audit.check(admin_page, f"admin review {session.title[:20]}")
        assert len(visible_numbers(shown)) >= MIN_VISIBLE_SHARE * 100, session.title
    admin_page.goto(f"{base}/admin/chat_sessions/session/?all=")
    audit.check(admin_page, "admin sessions")

    assert audit.dialogs == []
    assert audit.findings == [], "\n".join(audit.findings)
    assert audit.csp_headers, "no document response carried a Content-Security-Policy"
    for policy in audit.csp_headers:
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy, policy
        assert "script-src 'self'" in policy or "default-src 'none'" in policy, policy

    record("xss.payloads", len(PAYLOADS), "distinct XSS payloads in the corpus")
    live_renderings = len(PAYLOADS) * 5 * 2  # typed, text x2, reasoning, tool args; reload
    stored_renderings = 100 * 8 * 2  # 8 stored channels, chat view and admin review
    record(
        "xss.renderings",
        live_renderings + stored_renderings,
        "payload renderings checked in Chromium (live turn: typed by the user, streamed "
        "text of two replies, reasoning, tool-call arguments, then reloaded; stored: user "
        "text, attachment names, assistant text, reasoning, tool-call names and arguments, "
        "tool results and tool names, in the chat view and the admin review); plus session "
        "titles (the user's list and the admin changelist) and turn errors",
    )
    record("xss.pages", audit.pages, "pages audited (trap, dialogs, DOM) with zero executions")
    record("xss.exports", exports, "exports checked as downloads (not text/html, nosniff)")
    record(
        "xss.csp_violations",
        audit.csp_violations,
        "CSP violation reports on those pages (payloads that needed the CSP to stop them)",
    )
