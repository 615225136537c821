from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from openworker import views
from sessions import admin_views
from sessions.sso import views as sso_views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path(
        "accounts/login/",
        sso_views.SignInView.as_view(),
        name="login",
    ),
    path("accounts/logout/", sso_views.SignOutView.as_view(), name="logout"),
    path(
        "accounts/password/",
        auth_views.PasswordChangeView.as_view(),
        name="password_change",
    ),
    path(
        "accounts/password/done/",
        auth_views.PasswordChangeDoneView.as_view(),
        name="password_change_done",
    ),
    path(
        "accounts/set-password/<uidb64>/<token>/",
        admin_views.account_set_password,
        name="account_set_password",
    ),
    path("admin/", admin.site.urls),
    path("", include("sessions.sso.urls")),
    path("", include("providers.edge.urls")),
    path("", include("sessions.mcp.urls")),
    path("", include("sessions.urls")),
]
