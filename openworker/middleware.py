"""Request-wide rules: a strict Content-Security-Policy on every response, and one check
of every text input before any view sees it.

No inline script and no remote content: model and tool output are data, never code, so
even a sanitiser bug cannot run script or beacon a transcript to another host.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.shortcuts import render

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        # data: and blob: for attachment previews; remote images are never loaded.
        "img-src 'self' data: blob:",
        "connect-src 'self'",
        "font-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response


# --- one check of every text input ------------------------------------------------------

# Above any form field a person types (titles, model ids, search, admin text areas) and
# far below what would hurt the database or the renderer.
MAX_FIELD_CHARS = 100_000
# A multipart body larger than this is an upload (attachments, imports): its files are
# checked by their own code, and reading it here would defeat the view's size refusal
# before the body is read.
MULTIPART_INSPECT_BYTES = 1024 * 1024
_SURROGATES = re.compile("[\ud800-\udfff]")
_FIELD_LABEL_CHARS = 40


def answers_json(view: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a view whose callers read JSON: its input errors are `{"error": ...}`."""
    view.answers_json = True  # type: ignore[attr-defined]
    return view


def text_problem(label: str, value: str) -> str | None:
    """Why `value` is not acceptable text, or None. Pure: the one rule for every input."""
    if "\x00" in value:
        return f"{label} contains a NUL character."
    if _SURROGATES.search(value):
        return f"{label} contains characters that are not valid text."
    if len(value) > MAX_FIELD_CHARS:
        return f"{label} is longer than {MAX_FIELD_CHARS:,} characters."
    return None


def _label(name: str) -> str:
    shown = "".join(ch for ch in name if ch.isprintable())[:_FIELD_LABEL_CHARS]
    return f"The field {shown!r}" if shown else "A field"


def _pairs(request: HttpRequest, kwargs: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for name, value in kwargs.items():
        if isinstance(value, str):
            yield name, value
    for data in (request.GET, _post(request)):
        for name, values in data.lists():
            yield "field name", name
            for value in values:
                yield name, value


def _post(request: HttpRequest) -> Any:
    if request.method != "POST":
        return QueryDict()
    if request.content_type == "multipart/form-data":
        size = int(request.META.get("CONTENT_LENGTH") or 0)
        if size > MULTIPART_INSPECT_BYTES:
            return QueryDict()
    return request.POST


def request_input_problem(request: HttpRequest, kwargs: dict[str, Any]) -> str | None:
    """The first unacceptable text input of a request (query, form, URL parts), if any."""
    for name, value in _pairs(request, kwargs):
        label = "A field name" if name == "field name" else _label(name)
        problem = text_problem(label, value)
        if problem is not None:
            return problem
    return None


class InputValidationMiddleware:
    """Every text input of every view, checked once before the view runs: NUL characters,
    unpaired surrogates and oversize values are a 400 that says which field (JSON for
    views marked `answers_json`), in both run modes, instead of a database error."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_view(
        self,
        request: HttpRequest,
        view_func: Callable[..., Any],
        view_args: tuple[Any, ...],
        view_kwargs: dict[str, Any],
    ) -> HttpResponse | None:
        problem = request_input_problem(request, view_kwargs)
        if problem is None:
            return None
        if getattr(view_func, "answers_json", False):
            return JsonResponse({"error": problem}, status=400)
        return render(request, "400.html", {"reason": problem}, status=400)
