"""The Celery app. Configuration lives in settings (CELERY_* names)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "openworker.settings")

app = Celery("openworker")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
