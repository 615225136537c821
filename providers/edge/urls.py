from __future__ import annotations

from django.urls import path

from providers.edge import views

urlpatterns = [
    path("settings/", views.settings_page, name="provider_settings"),
    path("settings/default-model", views.default_model, name="provider_default_model"),
    path("settings/providers/<slug:provider>/", views.profile_edit, name="provider_edit"),
    path("settings/providers/<slug:provider>/test", views.profile_test, name="provider_test"),
    path("settings/providers/<slug:provider>/delete", views.profile_delete, name="provider_delete"),
]
