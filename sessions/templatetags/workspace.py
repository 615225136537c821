"""Template tags of the chat workspace: the sidebar and the user's theme."""

from __future__ import annotations

from typing import Any

from django import template
from django.db import DatabaseError

from sessions import selectors

register = template.Library()


@register.inclusion_tag("sessions/_sidebar.html", takes_context=True)
def sidebar(context: Any, current: Any = None) -> dict[str, Any]:
    request = context["request"]
    return {
        "request": request,
        "csrf_token": context.get("csrf_token"),
        "groups": selectors.sidebar_groups(user=request.user),
        "current": str(current.pk) if current is not None else "",
        "query": request.GET.get("q", "") if request.resolver_match.url_name == "home" else "",
    }


@register.simple_tag(takes_context=True)
def user_theme(context: Any) -> str:
    """The signed-in user's theme, else "system" (follow the browser). Error pages use it
    too, where the request may have no user (a disallowed host) or the database may be
    what failed: they fall back rather than fail again."""
    user = getattr(context.get("request"), "user", None)
    if user is None:
        return "system"
    try:
        return selectors.user_theme(user=user)
    except DatabaseError:
        return "system"
