"""The audit trail: who read or exported whose data, when and why.

`audit_record` is the only writer of `AuditLog`; the admin shows the rows read-only.
Rows carry ids, filters and counts, never transcript text or key material.
"""

from __future__ import annotations

import uuid
from typing import Any

from sessions.models import AuditLog


def audit_record(
    *,
    actor: Any,
    action: str,
    reason: str = "",
    target_user: Any = None,
    target_session_id: uuid.UUID | str | None = None,
    detail: dict[str, Any] | None = None,
) -> AuditLog:
    """Append one audit row. `action` is an `AuditLog.Action` value."""
    if action not in AuditLog.Action.values:
        raise ValueError(f"unknown audit action {action!r}")
    return AuditLog.objects.create(
        actor=actor,
        actor_username=getattr(actor, "get_username", lambda: "")() if actor else "",
        action=action,
        reason=reason.strip(),
        target_user=target_user,
        target_username=target_user.get_username() if target_user is not None else "",
        target_session_id=target_session_id,
        detail=detail or {},
    )
