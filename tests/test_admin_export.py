"""Bulk export: filters, a background job with progress, canonical JSONL with usage and
cost, no key material, spreadsheet-safe CSV, audited start and download."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from providers.edge.models import ProviderProfile
from sessions import bulk_export
from sessions.models import AuditLog, ExportJob, Message, Session, Turn

pytestmark = pytest.mark.django_db(transaction=True)
CANARY = "sk-CANARY-export-0123456789abcdef"
REASON = "Legal hold request 2026-11 for the research team"


def conversation(owner, title: str, *, text: str = "hello", days_ago: int = 0) -> Session:
    session = Session.objects.create(owner=owner, title=title, model="openai:gpt-test")
    if days_ago:
        Session.objects.filter(pk=session.pk).update(
            created_at=timezone.now() - timedelta(days=days_ago)
        )
    turn = Turn.objects.create(
        session=session,
        model="openai:gpt-test",
        status=Turn.Status.COMPLETED,
        usage={"input": 100, "output": 20, "cache_read": 5, "cache_write": 0},
        cost=Decimal("0.001250"),
    )
    Message.objects.create(session=session, seq=1, role="user", content=text, turn=turn)
    Message.objects.create(
        session=session,
        seq=2,
        role="assistant",
        content="ok",
        turn=turn,
        usage={"input": 100, "output": 20},
        reasoning="thinking",
    )
    return session


@pytest.fixture(autouse=True)
def _media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path


@pytest.fixture
def canary_profiles(owner):
    org = ProviderProfile(provider="openai")
    org.set_api_key(CANARY)
    org.save()
    mine = ProviderProfile(owner=owner, provider="anthropic")
    mine.set_api_key(CANARY + "-user")
    mine.save()


def run(**filters) -> ExportJob:
    job = ExportJob.objects.create(reason=REASON, **filters)
    return bulk_export.export_job_run(job_id=job.pk)


def jsonl_records(job: ExportJob) -> list[dict]:
    with job.jsonl_file.open("rb") as fh:
        return [json.loads(line) for line in fh.read().decode().splitlines()]


def csv_rows(job: ExportJob) -> list[list[str]]:
    with job.csv_file.open("rb") as fh:
        return list(csv.reader(io.StringIO(fh.read().decode())))


def test_jsonl_holds_canonical_transcripts_with_usage_and_cost(owner):
    session = conversation(owner, "One")
    job = run()
    assert job.status == "completed" and (job.rows_done, job.rows_total) == (1, 1)
    [record] = jsonl_records(job)
    assert record["session_id"] == str(session.pk) and record["owner"] == "alice"
    expected = [{"seq": m.seq, **m.to_canonical()} for m in session.messages.order_by("seq")]
    assert [
        {k: v for k, v in m.items() if k not in ("created_at", "model")} for m in record["messages"]
    ] == expected
    assert record["turns"][0]["usage"]["input"] == 100
    assert record["turns"][0]["cost"] == "0.001250"
    assert record["usage"] == {"input": 100, "output": 20, "cache_read": 5, "cache_write": 0}
    assert record["cost"] == "0.001250"


def test_filters_by_user_team_and_date_range(owner, teammate):
    team = Group.objects.create(name="research")
    teammate.groups.add(team)
    conversation(owner, "alice-new")
    conversation(owner, "alice-old", days_ago=40)
    conversation(teammate, "bob-new")
    titles = lambda job: sorted(r["title"] for r in jsonl_records(job))  # noqa: E731
    assert titles(run(user=owner)) == ["alice-new", "alice-old"]
    assert titles(run(group=team)) == ["bob-new"]
    today = timezone.localdate()
    assert titles(run(date_from=today - timedelta(days=7), date_to=today)) == [
        "alice-new",
        "bob-new",
    ]
    assert titles(run(date_to=today - timedelta(days=30))) == ["alice-old"]


def test_no_key_material_reaches_the_files_even_when_pasted_into_a_chat(owner, canary_profiles):
    conversation(owner, f"title {CANARY}", text=f"my key is {CANARY}-user, please use it")
    job = run()
    for field in (job.jsonl_file, job.csv_file):
        with field.open("rb") as fh:
            data = fh.read().decode()
        assert "CANARY" not in data
    assert bulk_export.REDACTED in jsonl_records(job)[0]["messages"][0]["content"]


@pytest.mark.parametrize("prefix", ["=", "+", "-", "@", "\t", "\r"])
def test_csv_cells_a_spreadsheet_would_run_are_quoted(owner, prefix):
    conversation(owner, f'{prefix}HYPERLINK("http://evil")')
    rows = csv_rows(run())
    assert rows[0] == bulk_export.CSV_COLUMNS
    assert rows[1][1] == "'" + f'{prefix}HYPERLINK("http://evil")'


def test_csv_safe_leaves_ordinary_cells_alone():
    assert bulk_export.csv_safe("hello = world") == "hello = world"
    assert bulk_export.csv_safe(None) == ""
    assert bulk_export.csv_safe(12) == "12"


def test_unknown_cost_is_not_summed_as_zero(owner):
    session = conversation(owner, "mixed")
    Turn.objects.create(session=session, model="ollama:x", status="completed", usage=None)
    [record] = jsonl_records(run())
    assert record["cost"] is None


def test_progress_is_reported_while_the_job_runs(owner, monkeypatch):
    for n in range(5):
        conversation(owner, f"s{n}")
    seen = []
    original = bulk_export.session_record

    def spy(session):
        job = ExportJob.objects.get()
        seen.append((job.status, job.rows_done, job.rows_total))
        return original(session)

    monkeypatch.setattr(bulk_export, "PROGRESS_EVERY", 2)
    monkeypatch.setattr(bulk_export, "session_record", spy)
    job = run()
    assert seen[0] == ("running", 0, 5)
    assert seen[-1] == ("running", 4, 5)
    assert (job.rows_done, job.percent) == (5, 100)


def test_the_admin_starts_the_job_audits_it_and_serves_the_download(
    admin_client, admin_user, owner
):
    conversation(owner, "One")
    assert admin_client.get("/admin/chat_sessions/exportjob/start/").status_code == 200
    refused = admin_client.post("/admin/chat_sessions/exportjob/start/", {"reason": "short"})
    assert refused.status_code == 200 and not ExportJob.objects.exists()
    response = admin_client.post(
        "/admin/chat_sessions/exportjob/start/", {"user": owner.pk, "reason": REASON}
    )
    job = ExportJob.objects.get()
    assert response.status_code == 302
    assert response["Location"].endswith(f"/exportjob/{job.pk}/status/")
    job.refresh_from_db()
    assert job.status == "completed"  # embedded mode: the Celery task ran eagerly
    audit = AuditLog.objects.get(action="export")
    assert audit.actor == admin_user and audit.reason == REASON
    assert audit.detail["job"] == str(job.pk) and audit.detail["user"] == owner.pk

    status = admin_client.get(f"/admin/chat_sessions/exportjob/{job.pk}/status/")
    assert b"Download transcripts" in status.content and b"<progress" in status.content
    download = admin_client.get(f"/admin/chat_sessions/exportjob/{job.pk}/download/jsonl/")
    assert download.status_code == 200
    assert b'"title": "One"' in b"".join(download.streaming_content)
    assert AuditLog.objects.filter(action="export_download").count() == 1
    assert (
        admin_client.get(f"/admin/chat_sessions/exportjob/{job.pk}/download/other/").status_code
        == 404
    )


def test_a_running_job_page_refreshes_itself_and_offers_no_download(admin_client):
    job = ExportJob.objects.create(reason=REASON, status="running", rows_total=10, rows_done=3)
    page = admin_client.get(f"/admin/chat_sessions/exportjob/{job.pk}/status/")
    assert b'http-equiv="refresh"' in page.content and b"3 / 10" in page.content
    assert b"Download" not in page.content
    assert (
        admin_client.get(f"/admin/chat_sessions/exportjob/{job.pk}/download/jsonl/").status_code
        == 404
    )


def test_export_pages_show_no_key_material(admin_client, owner, canary_profiles):
    conversation(owner, "One")
    job = run()
    for url in (
        "/admin/chat_sessions/exportjob/",
        f"/admin/chat_sessions/exportjob/{job.pk}/status/",
    ):
        assert b"CANARY" not in admin_client.get(url).content
