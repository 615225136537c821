from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from sessions import selectors


@login_required
def home(request: HttpRequest) -> HttpResponse:
    sessions = selectors.session_list(user=request.user)[:50]
    return render(request, "sessions/home.html", {"sessions": sessions})
