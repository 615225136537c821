"""Bulk export of transcripts: a background job that writes JSONL (one session a line:
canonical messages, turns with usage and cost) and a CSV of per-turn usage.

Contract:
- Filters: owner, team (auth group), session creation date range (inclusive, local time).
- Progress: `rows_total` sessions, `rows_done` written so far, saved every
  `PROGRESS_EVERY` sessions so the admin page can show a bar without a write per row.
- No key material: provider profiles are never read into the output, and any stored API
  key that a user pasted into a conversation is replaced by `REDACTED` before a line is
  written.
- CSV cells that a spreadsheet would run as a formula (leading = + - @, tab or carriage
  return) are prefixed with a single quote (OWASP "CSV injection").
"""

from __future__ import annotations

import csv
import json
import tempfile
from collections.abc import Iterable, Iterator
from datetime import date
from decimal import Decimal
from typing import Any

from django.core.files import File
from django.db.models import QuerySet
from django.utils import timezone

from providers.edge.crypto import DecryptionError
from providers.edge.models import ProviderProfile
from sessions.models import ExportJob, Message, Session, Turn

# Write progress every this many sessions: a visible bar without a row write per session.
PROGRESS_EVERY = 20
REDACTED = "[redacted]"
# Keys shorter than this are not searched for: a short string would redact ordinary words.
MIN_SECRET_LENGTH = 8
# Characters that make a spreadsheet treat a cell as a formula.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
CSV_COLUMNS = [
    "session_id",
    "session_title",
    "owner",
    "turn_id",
    "turn_created_at",
    "model",
    "status",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cost",
]


def csv_safe(value: Any) -> str:
    """The cell text, quoted with a leading `'` when a spreadsheet would run it."""
    text = "" if value is None else str(value)
    if text.startswith(FORMULA_PREFIXES):
        return "'" + text
    return text


def export_sessions(
    *,
    user_id: int | None = None,
    group_id: int | None = None,
    date_from: date | None = None,
    date_to: date | None = None,
) -> QuerySet[Session]:
    """The sessions an export with these filters covers, oldest first."""
    sessions = Session.objects.select_related("owner").order_by("created_at", "id")
    if user_id is not None:
        sessions = sessions.filter(owner_id=user_id)
    if group_id is not None:
        sessions = sessions.filter(owner__groups__id=group_id)
    if date_from is not None:
        sessions = sessions.filter(created_at__date__gte=date_from)
    if date_to is not None:
        sessions = sessions.filter(created_at__date__lte=date_to)
    return sessions.distinct()


def export_job_run(*, job_id: Any) -> ExportJob:
    """Run one export job to completion (or failure), updating its progress as it goes."""
    job = ExportJob.objects.get(pk=job_id)
    if job.status == ExportJob.Status.COMPLETED:
        return job  # a redelivered task: the files are already there
    sessions = export_sessions(
        user_id=job.user_id, group_id=job.group_id, date_from=job.date_from, date_to=job.date_to
    )
    total = sessions.count()
    ExportJob.objects.filter(pk=job.pk).update(
        status=ExportJob.Status.RUNNING, rows_total=total, rows_done=0, error=""
    )
    try:
        secrets = _known_secrets()
        with (
            tempfile.TemporaryFile("w+", encoding="utf-8") as jsonl,
            tempfile.TemporaryFile("w+", encoding="utf-8", newline="") as table,
        ):
            writer = csv.writer(table)
            writer.writerow(CSV_COLUMNS)
            done = 0
            for session in sessions.iterator():
                record = session_record(session)
                jsonl.write(_redact(json.dumps(record, ensure_ascii=False), secrets) + "\n")
                for row in _csv_rows(record):
                    writer.writerow([csv_safe(_redact(str(cell), secrets)) for cell in row])
                done += 1
                if done % PROGRESS_EVERY == 0:
                    ExportJob.objects.filter(pk=job.pk).update(rows_done=done)
            stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
            job.refresh_from_db()
            jsonl.seek(0)
            job.jsonl_file.save(f"transcripts-{stamp}.jsonl", File(jsonl), save=False)
            table.seek(0)
            job.csv_file.save(f"usage-{stamp}.csv", File(table), save=False)
        job.rows_done = done
        job.status = ExportJob.Status.COMPLETED
        job.finished_at = timezone.now()
        job.save(update_fields=["jsonl_file", "csv_file", "rows_done", "status", "finished_at"])
    except Exception as exc:
        ExportJob.objects.filter(pk=job.pk).update(
            status=ExportJob.Status.FAILED,
            error=f"The export failed ({type(exc).__name__}).",
            finished_at=timezone.now(),
        )
        raise
    return job


def session_record(session: Session) -> dict[str, Any]:
    """One JSONL line: the session, its canonical transcript and its turns' usage and cost."""
    turns = list(Turn.objects.filter(session=session).order_by("created_at"))
    messages = Message.objects.filter(session=session).order_by("seq")
    costs = [t.cost for t in turns if t.cost is not None]
    return {
        "session_id": str(session.pk),
        "title": session.title,
        "owner": session.owner.get_username(),
        "model": session.model,
        "created_at": session.created_at.isoformat(),
        "messages": [_canonical(m) for m in messages],
        "turns": [
            {
                "turn_id": str(t.pk),
                "model": t.model,
                "status": t.status,
                "created_at": t.created_at.isoformat(),
                "usage": t.usage,
                "cost": _money(t.cost),
            }
            for t in turns
        ],
        "usage": _usage_total(t.usage for t in turns),
        # Unknown when any turn's cost is unknown: a partial sum would under-report.
        "cost": _money(sum(costs, Decimal(0))) if len(costs) == len(turns) else None,
    }


def _canonical(message: Message) -> dict[str, Any]:
    out = {"seq": message.seq, **message.to_canonical()}
    if message.model:
        out["model"] = message.model
    out["created_at"] = message.created_at.isoformat()
    return out


def _usage_total(usages: Iterable[dict[str, Any] | None]) -> dict[str, int]:
    total = {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0}
    for usage in usages:
        for bucket in total:
            total[bucket] += int((usage or {}).get(bucket) or 0)
    return total


def _money(value: Decimal | None) -> str | None:
    return None if value is None else format(value, "f")


def _csv_rows(record: dict[str, Any]) -> Iterator[list[Any]]:
    for turn in record["turns"]:
        usage = turn["usage"] or {}
        yield [
            record["session_id"],
            record["title"],
            record["owner"],
            turn["turn_id"],
            turn["created_at"],
            turn["model"],
            turn["status"],
            usage.get("input", ""),
            usage.get("output", ""),
            usage.get("cache_read", ""),
            usage.get("cache_write", ""),
            turn["cost"] if turn["cost"] is not None else "",
        ]


def _known_secrets() -> list[str]:
    """Every stored provider key (and its JSON-escaped form), longest first."""
    found: set[str] = set()
    for profile in ProviderProfile.objects.exclude(api_key_encrypted=""):
        try:
            key = profile.api_key()
        except DecryptionError:
            continue
        if len(key) >= MIN_SECRET_LENGTH:
            found.add(key)
            found.add(json.dumps(key)[1:-1])
    return sorted(found, key=len, reverse=True)


def _redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text
