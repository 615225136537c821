from __future__ import annotations

from django.contrib import admin

from sessions.models import Session


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = ("title", "owner", "model", "updated_at")
    list_filter = ("model",)
    search_fields = ("title", "owner__username")
    readonly_fields = ("id", "created_at", "updated_at")
