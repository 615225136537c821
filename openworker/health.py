"""Reachability checks behind /healthz: each returns (ok, detail) and never raises."""

from __future__ import annotations

import asyncio

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection

from openworker.celery import app

CHECK_TIMEOUT_SECONDS = 3.0


def check_database() -> tuple[bool, str]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:
        return False, type(exc).__name__
    return True, connection.vendor


async def _channel_layer_roundtrip() -> None:
    layer = get_channel_layer()
    channel = await layer.new_channel("healthz.")
    await layer.send(channel, {"type": "healthz.ping"})
    message = await asyncio.wait_for(layer.receive(channel), CHECK_TIMEOUT_SECONDS)
    if message.get("type") != "healthz.ping":
        raise RuntimeError("unexpected message")


def check_channel_layer() -> tuple[bool, str]:
    try:
        async_to_sync(_channel_layer_roundtrip)()
    except Exception as exc:
        return False, type(exc).__name__
    return True, type(get_channel_layer()).__name__


def check_broker() -> tuple[bool, str]:
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=CHECK_TIMEOUT_SECONDS)
    except Exception as exc:
        return False, type(exc).__name__
    return True, "redis"


def health_report() -> dict:
    checks = {"database": check_database(), "channel_layer": check_channel_layer()}
    if settings.DISTRIBUTED:
        checks["broker"] = check_broker()
    ok = all(result for result, _ in checks.values())
    return {
        "status": "ok" if ok else "fail",
        "mode": settings.RUN_MODE,
        "checks": {
            name: {"ok": result, "detail": detail} for name, (result, detail) in checks.items()
        },
    }
