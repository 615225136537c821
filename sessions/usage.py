"""Usage for the admin dashboard: tokens and cost by user, model and day, plus the
geometry of server-rendered SVG bar charts (no script, so the strict CSP holds).

Usage lives in `Turn.usage` (JSON: the non-overlapping TokenUsage buckets), so sums are
taken in Python over one query of the period's turns: portable across SQLite and
PostgreSQL. A turn whose cost is unknown adds its tokens but no cost, and the group is
flagged `cost_partial` rather than shown as complete.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

from django.utils import timezone

from sessions.models import Turn

BUCKETS = ("input", "output", "cache_read", "cache_write")
# Chart size in SVG user units; the SVG scales to its container.
CHART_WIDTH = 640
BAR_AREA_HEIGHT = 160
LABEL_WIDTH = 160
ROW_HEIGHT = 22
# Top-N rows in the by-user / by-model charts: the table below lists everyone.
CHART_TOP = 12


@dataclass
class UsageRow:
    key: str
    turns: int = 0
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0))
    cost: Decimal = Decimal(0)
    cost_partial: bool = False

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens.values())

    def add(self, usage: dict[str, Any] | None, cost: Decimal | None) -> None:
        self.turns += 1
        for bucket in BUCKETS:
            self.tokens[bucket] += int((usage or {}).get(bucket) or 0)
        if cost is None:
            if usage:
                self.cost_partial = True
        else:
            self.cost += cost


@dataclass
class UsageReport:
    start: date
    end: date
    by_user: list[UsageRow]
    by_model: list[UsageRow]
    by_day: list[UsageRow]
    total: UsageRow


def usage_report(*, start: date, end: date) -> UsageReport:
    """Usage of turns created from `start` to `end` inclusive (local dates)."""
    turns = Turn.objects.filter(created_at__date__gte=start, created_at__date__lte=end).values_list(
        "session__owner__username", "model", "created_at", "usage", "cost"
    )
    users: dict[str, UsageRow] = {}
    models: dict[str, UsageRow] = {}
    days = {
        (start + timedelta(days=n)).isoformat(): UsageRow((start + timedelta(days=n)).isoformat())
        for n in range((end - start).days + 1)
    }
    total = UsageRow("total")
    for username, model, created_at, usage, cost in turns.iterator():
        day = timezone.localtime(created_at).date().isoformat()
        for table, key in ((users, username), (models, model or "(none)")):
            table.setdefault(key, UsageRow(key)).add(usage, cost)
        days.setdefault(day, UsageRow(day)).add(usage, cost)
        total.add(usage, cost)

    def ranked(table: dict[str, UsageRow]) -> list[UsageRow]:
        return sorted(table.values(), key=lambda r: (-r.total_tokens, r.key))

    return UsageReport(
        start=start,
        end=end,
        by_user=ranked(users),
        by_model=ranked(models),
        by_day=[days[key] for key in sorted(days)],
        total=total,
    )


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    x: float
    y: float
    width: float
    height: float
    title: str
    # Where the row's label and value text sit (horizontal charts).
    text_y: float = 0
    value_x: float = 0


def column_chart(rows: list[UsageRow], *, metric: str) -> dict[str, Any]:
    """Vertical bars, one per row (days), scaled to the largest value."""
    values = [_metric(row, metric) for row in rows]
    peak = max(values, default=0) or 1
    slot = CHART_WIDTH / max(len(rows), 1)
    bars = []
    for index, (row, value) in enumerate(zip(rows, values, strict=True)):
        height = BAR_AREA_HEIGHT * value / peak
        bars.append(
            Bar(
                label=row.key,
                value=value,
                x=round(index * slot + slot * 0.1, 2),
                y=round(BAR_AREA_HEIGHT - height, 2),
                width=round(slot * 0.8, 2),
                height=round(height, 2),
                title=f"{row.key}: {_fmt(value, metric)}",
            )
        )
    return {
        "width": CHART_WIDTH,
        "height": BAR_AREA_HEIGHT + 20,
        "baseline": BAR_AREA_HEIGHT,
        "bars": bars,
        "peak": _fmt(peak if values and max(values) else 0, metric),
        "first": rows[0].key if rows else "",
        "last": rows[-1].key if rows else "",
    }


def bar_chart(rows: list[UsageRow], *, metric: str) -> dict[str, Any]:
    """Horizontal bars with labels (users, models), the top `CHART_TOP` rows."""
    rows = rows[:CHART_TOP]
    values = [_metric(row, metric) for row in rows]
    peak = max(values, default=0) or 1
    span = CHART_WIDTH - LABEL_WIDTH - 90
    bars = [
        Bar(
            label=row.key,
            value=value,
            x=LABEL_WIDTH,
            y=index * ROW_HEIGHT,
            width=round(span * value / peak, 2),
            height=ROW_HEIGHT - 6,
            title=_fmt(value, metric),
            text_y=index * ROW_HEIGHT + ROW_HEIGHT - 10,
            value_x=round(LABEL_WIDTH + span * value / peak + 4, 2),
        )
        for index, (row, value) in enumerate(zip(rows, values, strict=True))
    ]
    return {
        "width": CHART_WIDTH,
        "height": max(len(bars), 1) * ROW_HEIGHT,
        "label_x": LABEL_WIDTH - 6,
        "bars": bars,
    }


def _metric(row: UsageRow, metric: str) -> float:
    return float(row.cost) if metric == "cost" else float(row.total_tokens)


def _fmt(value: float, metric: str) -> str:
    return f"{value:,.4f}" if metric == "cost" else f"{int(value):,}"
