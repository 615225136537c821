"""Users and teams in the admin: deactivation (sign-in, browser sessions, sockets, running
turns), invite and reset links (signed, expiring, single-use), per-user limits and tool
policies."""

from __future__ import annotations

from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.sessions.models import Session as BrowserSession
from django.test import Client

from openworker.asgi import application
from openworker.runtime.agent.engine import _tool_policy_overrides
from openworker.runtime.turns import commands, runner
from sessions import services
from sessions.accounts import set_password_path, user_deactivate
from sessions.models import AuditLog, Session, ToolPolicy, Turn, UserLimits

NEW_PASSWORD = "a-fresh-Passw0rd-42"


def signed_in_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- deactivation ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_deactivating_closes_the_users_open_socket(admin_user, owner):
    session = await Session.objects.acreate(owner=owner)
    client = await sync_to_async(signed_in_client)(owner)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    ws = WebsocketCommunicator(
        application,
        f"/ws/sessions/{session.pk}/",
        headers=[
            (b"origin", b"http://127.0.0.1:8000"),
            (b"host", b"127.0.0.1:8000"),
            (b"cookie", cookie),
        ],
    )
    connected, _ = await ws.connect(timeout=5)
    assert connected
    await ws.receive_json_from(timeout=5)

    admin = await sync_to_async(signed_in_client)(admin_user)
    response = await sync_to_async(admin.post)(
        f"/admin/auth/user/{owner.pk}/deactivate/", {"reason": "left the company"}
    )
    assert response.status_code == 302
    assert await ws.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}


@pytest.mark.django_db(transaction=True)
def test_deactivating_signs_out_stops_turns_and_is_audited(admin_client, admin_user, owner):
    browser = signed_in_client(owner)
    assert browser.get("/").status_code == 200
    session = Session.objects.create(owner=owner)
    running = Turn.objects.create(session=session, model="m", status=Turn.Status.RUNNING)
    other = Session.objects.create(owner=owner)
    queued = Turn.objects.create(session=other, model="m", status=Turn.Status.QUEUED)

    response = admin_client.post(
        f"/admin/auth/user/{owner.pk}/deactivate/", {"reason": "left the company"}
    )
    assert response.status_code == 302
    owner.refresh_from_db()
    assert owner.is_active is False
    assert not [
        s
        for s in BrowserSession.objects.all()
        if s.get_decoded().get("_auth_user_id") == str(owner.pk)
    ]
    assert browser.get("/").status_code == 302  # sent to sign-in
    running.refresh_from_db()
    queued.refresh_from_db()
    assert running.cancel_requested is True
    assert queued.status == Turn.Status.CANCELLED
    audit = AuditLog.objects.get(action="deactivate")
    assert (audit.actor, audit.target_user, audit.reason) == (admin_user, owner, "left the company")
    assert not signed_in_client(owner).login(username="alice", password="alice-pass-123")


@pytest.mark.django_db
def test_deactivation_leaves_other_users_signed_in(admin_user, owner, teammate):
    bystander = signed_in_client(teammate)
    user_deactivate(actor=admin_user, user=owner)
    assert bystander.get("/").status_code == 200


@pytest.mark.django_db
def test_the_bulk_action_deactivates_but_never_the_acting_admin(admin_client, admin_user, owner):
    admin_client.post(
        "/admin/auth/user/",
        {"action": "deactivate_users", "_selected_action": [owner.pk, admin_user.pk]},
    )
    owner.refresh_from_db()
    admin_user.refresh_from_db()
    assert owner.is_active is False and admin_user.is_active is True


# --- invite and reset links ------------------------------------------------------------------


@pytest.mark.django_db
def test_an_invite_creates_an_account_that_cannot_sign_in_until_the_link_is_used(
    admin_client, admin_user
):
    team = Group.objects.create(name="research")
    page = admin_client.post(
        "/admin/auth/user/invite/",
        {"username": "carol", "email": "carol@example.com", "groups": [team.pk]},
    )
    assert page.status_code == 200
    carol = get_user_model().objects.get(username="carol")
    assert not carol.has_usable_password() and list(carol.groups.all()) == [team]
    link = page.context["link"]
    assert link.startswith("http://testserver/accounts/set-password/")
    assert AuditLog.objects.get(action="invite").target_user == carol

    public = Client()
    assert public.get(link).status_code == 200
    done = public.post(link, {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    assert done.status_code == 302 and done["Location"] == "/accounts/login/"
    assert Client().login(username="carol", password=NEW_PASSWORD)
    # Single use: the token hashed the old (unusable) password.
    assert public.get(link).status_code == 400
    again = public.post(
        link, {"new_password1": "x" + NEW_PASSWORD, "new_password2": "x" + NEW_PASSWORD}
    )
    assert again.status_code == 400
    assert Client().login(username="carol", password=NEW_PASSWORD)


@pytest.mark.django_db
def test_an_invite_for_an_existing_username_is_refused(admin_client, owner):
    page = admin_client.post("/admin/auth/user/invite/", {"username": "ALICE"})
    assert page.status_code == 200 and page.context["link"] is None


@pytest.mark.django_db
def test_links_expire(owner, settings):
    path = set_password_path(owner)
    settings.PASSWORD_RESET_TIMEOUT = -1
    assert Client().get(path).status_code == 400


@pytest.mark.django_db
def test_a_tampered_link_is_refused(owner):
    path = set_password_path(owner)
    assert Client().get(path[:-3] + "abc/").status_code == 400
    assert Client().get("/accounts/set-password/zzz/abc-def/").status_code == 400


@pytest.mark.django_db
def test_a_deactivated_user_cannot_use_a_link(admin_user, owner):
    path = set_password_path(owner)
    user_deactivate(actor=admin_user, user=owner)
    assert Client().get(path).status_code == 400


@pytest.mark.django_db
def test_the_reset_link_lets_the_user_choose_a_new_password(admin_client, owner):
    page = admin_client.post(f"/admin/auth/user/{owner.pk}/reset-link/")
    link = page.context["link"]
    assert AuditLog.objects.filter(action="password_reset", target_user=owner).exists()
    Client().post(link, {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    assert Client().login(username="alice", password=NEW_PASSWORD)


@pytest.mark.django_db
def test_the_user_pages_offer_the_actions_and_djangos_password_change(admin_client, owner):
    change = admin_client.get(f"/admin/auth/user/{owner.pk}/change/")
    assert b"Password link" in change.content and b"Deactivate" in change.content
    assert b"Invite by link" in admin_client.get("/admin/auth/user/").content
    set_pw = admin_client.post(
        f"/admin/auth/user/{owner.pk}/password/",
        {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD, "usable_password": "true"},
    )
    assert set_pw.status_code == 302
    assert Client().login(username="alice", password=NEW_PASSWORD)


@pytest.mark.django_db
def test_staff_without_user_permissions_cannot_deactivate(owner):
    staff = get_user_model().objects.create_user("staff", password="x-pass-123", is_staff=True)
    client = signed_in_client(staff)
    assert client.post(f"/admin/auth/user/{owner.pk}/deactivate/").status_code == 403
    assert client.post("/admin/auth/user/invite/", {"username": "eve"}).status_code == 403
    owner.refresh_from_db()
    assert owner.is_active


# --- limits and tool policies ------------------------------------------------------------------


@pytest.fixture
def no_runner(monkeypatch):
    monkeypatch.setattr(runner, "turn_enqueue", lambda turn_id: None)


@pytest.mark.django_db
def test_a_users_limits_row_overrides_the_concurrency_setting(owner, settings, no_runner):
    settings.MAX_CONCURRENT_TURNS_PER_USER = 1
    UserLimits.objects.create(user=owner, max_concurrent_turns=2)
    first = Session.objects.create(owner=owner)
    second = Session.objects.create(owner=owner)
    third = Session.objects.create(owner=owner)
    commands.turn_start(session=first, text="one")
    commands.turn_start(session=second, text="two")
    with pytest.raises(services.TurnRefused, match="already have 2"):
        commands.turn_start(session=third, text="three")


@pytest.mark.django_db
def test_the_monthly_budget_is_checked_before_a_turn_starts(owner, teammate, no_runner):
    UserLimits.objects.create(user=owner, monthly_budget=Decimal("1.00"))
    session = Session.objects.create(owner=owner)
    Turn.objects.create(session=session, model="m", status="completed", cost=Decimal("0.60"))
    commands.turn_start(session=session, text="under budget")
    Turn.objects.filter(session=session, status="queued").update(
        status="completed", cost=Decimal("0.40")
    )
    with pytest.raises(services.TurnRefused, match="spending limit"):
        commands.turn_start(session=session, text="over budget")
    # Other users, and turns from previous months, are not counted.
    theirs = Session.objects.create(owner=teammate)
    Turn.objects.create(session=theirs, model="m", status="completed", cost=Decimal("50"))
    assert commands.user_month_spend(user_id=teammate.pk) == Decimal("50")
    assert commands.user_month_spend(user_id=owner.pk) == Decimal("1.00")


@pytest.mark.django_db
def test_limits_are_edited_inline_on_the_user_page(admin_client, owner):
    page = admin_client.get(f"/admin/auth/user/{owner.pk}/change/")
    assert b"limits-0-max_concurrent_turns" in page.content


@pytest.mark.django_db
def test_tool_policies_from_the_admin_reach_the_engine(admin_client, settings):
    settings.TOOL_POLICY_OVERRIDES = {"fetch_url": "ask"}
    response = admin_client.post(
        "/admin/chat_sessions/toolpolicy/add/", {"tool": "write_file", "policy": "deny"}
    )
    assert response.status_code == 302
    assert _tool_policy_overrides() == {"fetch_url": "ask", "write_file": "deny"}
    ToolPolicy.objects.create(tool="fetch_url", policy="allow")
    assert _tool_policy_overrides()["fetch_url"] == "allow"


@pytest.mark.django_db
def test_a_policy_for_an_unknown_tool_is_refused(admin_client):
    admin_client.post("/admin/chat_sessions/toolpolicy/add/", {"tool": "rm_rf", "policy": "allow"})
    assert not ToolPolicy.objects.exists()


@pytest.mark.django_db
def test_compaction_settings_are_one_validated_row(admin_client):
    listing = admin_client.get("/admin/chat_sessions/compactionsettings/")
    assert listing.status_code == 302
    url = listing["Location"]
    bad = admin_client.post(
        url,
        {
            "enabled": "on",
            "threshold_pct": "1.5",
            "cap_tokens": "100000",
            "keep_recent_fraction": "0.25",
            "summary_model": "",
        },
    )
    assert bad.status_code == 200
    good = admin_client.post(
        url,
        {
            "enabled": "on",
            "threshold_pct": "0.7",
            "cap_tokens": "100000",
            "keep_recent_fraction": "0.25",
            "summary_model": "",
        },
    )
    assert good.status_code == 302
    from sessions.models import CompactionSettings

    assert CompactionSettings.load().threshold_pct == 0.7
    assert CompactionSettings.objects.count() == 1


@pytest.mark.django_db
def test_limits_set_on_the_user_page_are_saved(admin_client, owner):
    page = admin_client.get(f"/admin/auth/user/{owner.pk}/change/")
    form = page.context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k != "password"}
    data.update(
        {
            "date_joined_0": owner.date_joined.strftime("%Y-%m-%d"),
            "date_joined_1": owner.date_joined.strftime("%H:%M:%S"),
            "is_active": "on",
            "limits-TOTAL_FORMS": "1",
            "limits-INITIAL_FORMS": "0",
            "limits-MIN_NUM_FORMS": "0",
            "limits-MAX_NUM_FORMS": "1",
            "limits-0-max_concurrent_turns": "3",
            "limits-0-monthly_budget": "",
        }
    )
    data.pop("groups", None)
    data.pop("user_permissions", None)
    data.pop("last_login", None)
    data.pop("date_joined", None)
    response = admin_client.post(f"/admin/auth/user/{owner.pk}/change/", data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert UserLimits.objects.get(user=owner).max_concurrent_turns == 3
