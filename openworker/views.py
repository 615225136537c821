from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from openworker.health import health_report


@require_GET
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    report = health_report()
    return JsonResponse(report, status=200 if report["status"] == "ok" else 503)
