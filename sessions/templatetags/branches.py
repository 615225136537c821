"""Template filters of the transcript as a tree (issue 19): a message's place among its
siblings, for the "< 2 / 3 >" switcher. Presentation only: the tree lives in the model."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.filter
def branch_nav(message: dict[str, Any]) -> dict[str, Any] | None:
    """`{index, count, prev, next}` (1-based index, neighbours' seqs or None) for a
    message view with more than one sibling; None otherwise (nothing to switch to)."""
    siblings = message.get("siblings") or []
    seq = message.get("seq")
    if len(siblings) < 2 or seq not in siblings:
        return None
    at = siblings.index(seq)
    return {
        "index": at + 1,
        "count": len(siblings),
        "prev": siblings[at - 1] if at > 0 else None,
        "next": siblings[at + 1] if at + 1 < len(siblings) else None,
    }
