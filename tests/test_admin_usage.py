"""The usage dashboard: tokens and cost by user, model and day, as server-rendered SVG
charts beside tables; plus a sweep of every admin page for key material."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from providers.edge.models import ProviderProfile
from sessions import usage
from sessions.models import Message, Session, Turn

pytestmark = pytest.mark.django_db
CANARY = "sk-CANARY-pages-0123456789abcdef"


def turn(owner, model: str, *, usage_: dict | None, cost: str | None, days_ago: int = 0) -> Turn:
    session = Session.objects.create(owner=owner, model=model)
    row = Turn.objects.create(
        session=session,
        model=model,
        status="completed",
        usage=usage_,
        cost=Decimal(cost) if cost is not None else None,
    )
    if days_ago:
        Turn.objects.filter(pk=row.pk).update(created_at=timezone.now() - timedelta(days=days_ago))
    return row


@pytest.fixture
def traffic(owner, teammate):
    turn(owner, "openai:a", usage_={"input": 1000, "output": 200}, cost="0.5")
    turn(owner, "openai:b", usage_={"input": 10, "cache_read": 90}, cost="0.25", days_ago=1)
    turn(teammate, "openai:a", usage_={"input": 100, "output": 0}, cost="0.1")
    turn(teammate, "ollama:x", usage_={"input": 7, "output": 3}, cost=None)
    turn(owner, "openai:a", usage_={"input": 5000}, cost="9", days_ago=90)  # outside the period


def test_report_sums_tokens_and_cost_by_user_model_and_day(traffic):
    today = timezone.localdate()
    report = usage.usage_report(start=today - timedelta(days=29), end=today)
    by_user = {row.key: row for row in report.by_user}
    assert by_user["alice"].total_tokens == 1300 and by_user["alice"].cost == Decimal("0.75")
    assert by_user["bob"].total_tokens == 110 and by_user["bob"].cost_partial is True
    by_model = {row.key: row for row in report.by_model}
    assert by_model["openai:a"].turns == 2 and by_model["openai:a"].tokens["input"] == 1100
    assert len(report.by_day) == 30
    assert report.by_day[-1].total_tokens == 1310 and report.by_day[-2].total_tokens == 100
    assert report.total.turns == 4


def test_charts_scale_bars_to_the_largest_value(traffic):
    today = timezone.localdate()
    report = usage.usage_report(start=today - timedelta(days=1), end=today)
    chart = usage.column_chart(report.by_day, metric="tokens")
    tallest = max(chart["bars"], key=lambda b: b.height)
    assert tallest.height == usage.BAR_AREA_HEIGHT and tallest.label == today.isoformat()
    bars = usage.bar_chart(report.by_user, metric="cost")["bars"]
    assert bars[0].label == "alice" and bars[0].width > bars[1].width


def test_an_empty_period_draws_empty_charts_without_dividing_by_zero():
    today = timezone.localdate()
    report = usage.usage_report(start=today, end=today)
    assert usage.column_chart(report.by_day, metric="cost")["bars"][0].height == 0
    assert usage.bar_chart(report.by_user, metric="tokens")["bars"] == []


def test_the_dashboard_renders_svg_charts_beside_tables(admin_client, traffic):
    page = admin_client.get("/admin/chat_sessions/usagereport/")
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count('<svg role="img"') == 5
    assert "Tokens by day" in html and "Cost by user" in html
    assert "<table>" in html and "openai:a" in html and "alice" in html
    assert "(partial)" in html
    assert "<script" not in html.split('id="content"')[-1]


def test_the_dashboard_takes_a_date_range(admin_client, traffic):
    today = timezone.localdate()
    start = (today - timedelta(days=100)).isoformat()
    page = admin_client.get(f"/admin/chat_sessions/usagereport/?start={start}&end={today}")
    assert page.context["report"].total.turns == 5


def test_no_admin_page_shows_key_material(admin_client, owner):
    org = ProviderProfile(provider="openai")
    org.set_api_key(CANARY)
    org.save()
    mine = ProviderProfile(owner=owner, provider="anthropic")
    mine.set_api_key(CANARY + "-user")
    mine.save()
    session = Session.objects.create(owner=owner, title="t")
    Message.objects.create(session=session, seq=1, role="user", content="hi")
    urls = [
        "/admin/",
        "/admin/providers/providerprofile/",
        f"/admin/providers/providerprofile/{org.pk}/change/",
        "/admin/providers/providerprofile/add/",
        "/admin/providers/matrixmodel/",
        "/admin/chat_sessions/session/",
        f"/admin/chat_sessions/session/{session.pk}/change/",
        f"/admin/chat_sessions/session/{session.pk}/review/",
        "/admin/chat_sessions/auditlog/",
        "/admin/chat_sessions/exportjob/",
        "/admin/chat_sessions/exportjob/start/",
        "/admin/chat_sessions/usagereport/",
        "/admin/chat_sessions/toolpolicy/",
        "/admin/auth/user/",
        f"/admin/auth/user/{owner.pk}/change/",
        "/admin/auth/user/invite/",
    ]
    for url in urls:
        page = admin_client.get(url, follow=True)
        assert page.status_code == 200, url
        assert b"CANARY" not in page.content, url
        assert org.api_key_encrypted.encode() not in page.content, url
    reviewed = admin_client.post(
        f"/admin/chat_sessions/session/{session.pk}/review/",
        {"reason": "checking the canary sweep"},
    )
    assert b"CANARY" not in reviewed.content
