"""The admin-managed curated matrix as the provider layer sees it: `{full_id: CuratedModel}`.

The table is read once per process and kept until it changes: every save or delete of a
`MatrixModel` row (or a change of its groups) bumps a version number in Django's cache,
and a reader whose copy carries an older version reloads. Where the cache is not shared
between processes (the local-memory default), a copy also expires after
`MAX_STALENESS_SECONDS`, so a worker process converges on an admin's edit made in
another process without a query per model call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from django.core.cache import DEFAULT_CACHE_ALIAS, BaseCache, caches
from django.db.models import Q
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.dispatch import receiver

from providers.capabilities import CuratedModel, Prices
from providers.edge.models import MatrixModel
from providers.types import ModelCapabilities

VERSION_KEY = "openworker:matrix:version"
# Bound on how long a process may serve a copy when the cache cannot tell it about a
# change (per-process caches): long enough to skip the query on every model call of a
# turn, short enough that an admin's edit is live within a minute everywhere.
MAX_STALENESS_SECONDS = 60.0

_lock = threading.Lock()
_memo: dict[str, Any] = {"version": None, "loaded_at": 0.0, "table": {}}
_shared: dict[str, BaseCache] = {}


def _cache() -> BaseCache:
    """One cache client for the process. `django.core.cache.cache` is one per thread and,
    under asgiref, one per async context: every turn's database calls (`sync_to_async`)
    made a client of their own, and so a new Redis connection per turn start (py-spy of a
    worker in a burst of 500: a fifth of its database thread's time). Django's Redis
    client is thread-safe (redis-py's pool); the local-memory one keeps its entries per
    location, which every instance of it shares."""
    found = _shared.get("cache")
    if found is None:
        with _lock:
            found = _shared.setdefault("cache", caches.create_connection(DEFAULT_CACHE_ALIAS))
    return found


def row_to_curated(row: MatrixModel) -> CuratedModel:
    """One table row as the provider layer's `CuratedModel` (None stays None)."""
    return CuratedModel(
        id=row.model_id,
        label=row.label,
        provider=row.provider,
        caps=ModelCapabilities(
            vision=row.vision,
            pdf=row.pdf,
            tools=row.tools,
            reasoning=row.reasoning,
            context_window=row.context_window,
            max_output_tokens=row.max_output_tokens,
            thinking=row.thinking or None,
            curated=True,
        ),
        prices=Prices(
            input=row.price_input,
            output=row.price_output,
            cache_read=row.price_cache_read,
            cache_write=row.price_cache_write,
        ),
        enabled=row.enabled,
    )


def _version() -> int:
    return _cache().get_or_set(VERSION_KEY, 1, timeout=None) or 1


def curated_matrix() -> dict[str, CuratedModel]:
    """Every row, enabled or not (a disabled model still answers for sessions using it)."""
    version = _version()
    now = time.monotonic()
    with _lock:
        fresh = now - _memo["loaded_at"] < MAX_STALENESS_SECONDS
        if _memo["version"] == version and fresh:
            return _memo["table"]
    table = {row.model_id: row_to_curated(row) for row in MatrixModel.objects.all()}
    with _lock:
        _memo.update(version=version, loaded_at=now, table=table)
    return table


def invalidate() -> None:
    """Make every process reload the table on its next read."""
    try:
        _cache().incr(VERSION_KEY)
    except ValueError:  # not set yet (or evicted): any new value differs from the memo's
        _cache().set(VERSION_KEY, int(time.time() * 1000), timeout=None)
    with _lock:
        _memo.update(version=None, loaded_at=0.0, table={})


def models_for_user(user: Any) -> list[MatrixModel]:
    """Enabled rows this user may pick: rows with no groups are for everyone."""
    rows = MatrixModel.objects.filter(enabled=True)
    group_ids: Iterable[int] = user.groups.values_list("id", flat=True)
    rows = rows.filter(Q(groups__isnull=True) | Q(groups__in=list(group_ids))).distinct()
    return list(rows.order_by("order", "label"))


@receiver(post_save, sender=MatrixModel)
@receiver(post_delete, sender=MatrixModel)
@receiver(m2m_changed, sender=MatrixModel.groups.through)
def _matrix_changed(**kwargs: object) -> None:
    """Any change to the matrix makes every process reload it."""
    invalidate()
