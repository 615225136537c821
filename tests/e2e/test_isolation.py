"""User B, signed in in Chromium, cannot reach user A's session: every URL of it answers
404 (the same as a session that does not exist) and its websocket is refused at the
handshake, while B's own session page and socket work (the refusal is about ownership)."""

from __future__ import annotations

from typing import Any

import pytest

from sessions import services
from sessions.models import Session
from tests.e2e.pages import BOB_PASSWORD, MODEL, sign_in, wait_connected

pytestmark = [pytest.mark.distributed, pytest.mark.django_db(transaction=True)]

SECRET_LINE = "Alice's private plan: ship on Friday."

# Opens a websocket from the page and reports whether it opened and how it closed.
OPEN_SOCKET_JS = """
(path) => new Promise((resolve) => {
  const ws = new WebSocket(`ws://${location.host}${path}`);
  let opened = false;
  ws.onopen = () => { opened = true; ws.close(1000); };
  ws.onclose = (event) => resolve({ opened, code: event.code });
})
"""


def socket_attempt(page: Any, session: Session) -> dict[str, Any]:
    return page.evaluate(OPEN_SOCKET_JS, f"/ws/sessions/{session.pk}/")


def test_another_user_gets_404_for_the_session_and_a_refused_socket(
    stack, new_page, shot, alice, bob
):
    alices = services.session_import(
        owner=alice,
        title="Alice's secret session",
        model=MODEL,
        messages=[{"role": "user", "content": SECRET_LINE}],
    )
    bobs = Session.objects.create(owner=bob, model=MODEL, title="Bob's own session")
    page = new_page()
    sign_in(page, stack, "bob", BOB_PASSWORD)
    shot(page, "bob signed in")

    for path in ("", "export.json", "export.md", "messages?after=0"):
        response = page.goto(f"{stack}/sessions/{alices.pk}/{path}")
        assert response.status == 404, path
        assert SECRET_LINE not in page.content()
        assert "secret session" not in page.content()
    shot(page, "alice's session is a 404 for bob")

    page.goto(f"{stack}/sessions/{bobs.pk}/")
    wait_connected(page)
    assert socket_attempt(page, bobs)["opened"] is True
    refused = socket_attempt(page, alices)
    assert refused["opened"] is False
    assert refused["code"] == 1006  # the handshake failed: Daphne answered 403
    assert SECRET_LINE not in page.content()
    shot(page, "bob's socket to alice's session refused")
