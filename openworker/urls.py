from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from openworker import views
from sessions import admin_views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(redirect_authenticated_user=True),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
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
    path("", include("providers.edge.urls")),
    path("", include("sessions.urls")),
]
