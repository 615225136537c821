from __future__ import annotations

from django.urls import path

from sessions.sso import views

app_name = "sso"

urlpatterns = [
    path("sso/<slug:slug>/start/", views.SsoStartView.as_view(), name="start"),
    path("sso/callback/", views.SsoCallbackView.as_view(), name="callback"),
]
