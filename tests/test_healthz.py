from __future__ import annotations

from unittest import mock


def test_healthz_reports_database_and_channel_layer(client, db):
    response = client.get("/healthz")
    assert response.status_code == 200
    data = response.json()
    assert data["status"] == "ok"
    assert data["checks"]["database"]["ok"] is True
    assert data["checks"]["channel_layer"]["ok"] is True


def test_healthz_is_503_when_the_database_is_down(client, db):
    with mock.patch("openworker.health.check_database", return_value=(False, "OperationalError")):
        response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["checks"]["database"] == {"ok": False, "detail": "OperationalError"}
