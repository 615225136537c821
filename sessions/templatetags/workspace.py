"""Template tags of the chat workspace: the sidebar and the user's theme."""

from __future__ import annotations

from typing import Any

from django import template

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
    request = context.get("request")
    return selectors.user_theme(user=request.user) if request is not None else "system"
