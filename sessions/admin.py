"""The admin of the product's data: sessions (review only, behind a reason), export jobs,
the audit log (read-only), tool policies, compaction settings, per-user limits, users and
teams, and the usage dashboard. Custom pages live in `sessions.admin_views`.

No page here shows key material or a transcript without an audited reason.
"""

from __future__ import annotations

from functools import partial, update_wrapper
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from openworker.runtime.agent.tools.registry import default_registry
from sessions import admin_views
from sessions.accounts import user_deactivate
from sessions.models import (
    AuditLog,
    CompactionSettings,
    ExportJob,
    Session,
    ToolPolicy,
    UsageReport,
    UserLimits,
)


def _view(model_admin: admin.ModelAdmin, view: Any) -> Any:
    """A custom view behind the admin's staff check, handed the admin site."""
    wrapped = partial(view, admin_site=model_admin.admin_site)

    def inner(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return wrapped(request, *args, **kwargs)

    return model_admin.admin_site.admin_view(update_wrapper(inner, view))


class ReadOnlyAdmin(admin.ModelAdmin):
    """Listed and viewable; never added, changed or deleted through the admin."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Session)
class SessionAdmin(ReadOnlyAdmin):
    """Sessions by title and owner; the transcript opens only through the review page."""

    list_display = ("title_or_id", "owner", "model", "created_at", "updated_at", "review")
    list_filter = ("model", "archived")
    search_fields = ("title", "owner__username")
    fields = ("id", "title", "owner", "model", "archived", "created_at", "updated_at")
    readonly_fields = fields
    list_select_related = ("owner",)

    @admin.display(description="session")
    def title_or_id(self, obj: Session) -> str:
        return str(obj)

    @admin.display(description="transcript")
    def review(self, obj: Session) -> str:
        url = reverse("admin:chat_sessions_session_review", args=[obj.pk])
        return format_html('<a href="{}">Review…</a>', url)

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<uuid:session_id>/review/",
                _view(self, admin_views.review_session),
                name="chat_sessions_session_review",
            ),
            *super().get_urls(),
        ]


@admin.register(AuditLog)
class AuditLogAdmin(ReadOnlyAdmin):
    """Admins read the trail; nobody edits or deletes it here."""

    list_display = ("created_at", "actor_username", "action", "target_username", "reason")
    list_filter = ("action",)
    search_fields = ("actor_username", "target_username", "reason")
    date_hierarchy = "created_at"
    fields = (
        "created_at",
        "actor_username",
        "action",
        "target_username",
        "target_session_id",
        "reason",
        "detail",
    )
    readonly_fields = fields


@admin.register(ExportJob)
class ExportJobAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "requested_by", "status", "progress", "user", "group")
    list_filter = ("status",)
    change_list_template = "admin/openworker/exportjob_change_list.html"

    @admin.display(description="progress")
    def progress(self, obj: ExportJob) -> str:
        url = reverse("admin:chat_sessions_exportjob_status", args=[obj.pk])
        return format_html(
            '<a href="{}">{} / {} ({}%)</a>', url, obj.rows_done, obj.rows_total, obj.percent
        )

    def change_view(self, request: HttpRequest, object_id: str, *args: Any, **kwargs: Any) -> Any:
        return HttpResponseRedirect(
            reverse("admin:chat_sessions_exportjob_status", args=[object_id])
        )

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "start/",
                _view(self, admin_views.export_start),
                name="chat_sessions_exportjob_start",
            ),
            path(
                "<uuid:job_id>/status/",
                _view(self, admin_views.export_status),
                name="chat_sessions_exportjob_status",
            ),
            path(
                "<uuid:job_id>/download/<str:kind>/",
                _view(self, admin_views.export_download),
                name="chat_sessions_exportjob_download",
            ),
            *super().get_urls(),
        ]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Exports start from the "New export" page (filters + reason), not the model form.
        return False


@admin.register(UsageReport)
class UsageReportAdmin(admin.ModelAdmin):
    """The usage dashboard in place of a change list."""

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        return admin_views.usage_dashboard(request, admin_site=self.admin_site)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("chat_sessions.view_usagereport")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ToolPolicy)
class ToolPolicyAdmin(admin.ModelAdmin):
    list_display = ("tool", "policy", "default_policy", "updated_at")
    list_editable = ("policy",)

    @admin.display(description="built-in default")
    def default_policy(self, obj: ToolPolicy) -> str:
        tool = default_registry().get(obj.tool)
        return tool.default_policy if tool is not None else "unknown tool (deny)"

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "tool":
            names = sorted(tool.name for tool in default_registry())
            return forms.ChoiceField(choices=[(n, n) for n in names], label="Tool")
        return super().formfield_for_dbfield(db_field, request, **kwargs)


@admin.register(CompactionSettings)
class CompactionSettingsAdmin(admin.ModelAdmin):
    """One row: the change list opens it directly. Validated by the model's validators;
    read at the start of every model call, so a save applies to the next turn."""

    fields = ("enabled", "threshold_pct", "cap_tokens", "keep_recent_fraction", "summary_model")

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        row = CompactionSettings.load()
        return HttpResponseRedirect(
            reverse("admin:chat_sessions_compactionsettings_change", args=[row.pk])
        )

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class UserLimitsInline(admin.StackedInline):
    model = UserLimits
    can_delete = True
    # One blank form: saving it untouched creates no row (the site defaults apply).
    extra = 1
    max_num = 1
    fields = ("max_concurrent_turns", "monthly_budget")


User = get_user_model()
if admin.site.is_registered(User):
    admin.site.unregister(User)


@admin.register(User)
class UserAdmin(BaseUserAdmin):
    """Django's user admin plus limits, invite by link, reset link and deactivation."""

    inlines = (*BaseUserAdmin.inlines, UserLimitsInline)
    change_form_template = "admin/openworker/user_change_form.html"
    change_list_template = "admin/openworker/user_change_list.html"
    actions = ("deactivate_users",)

    @admin.action(description="Deactivate selected users", permissions=["change"])
    def deactivate_users(self, request: HttpRequest, queryset: Any) -> None:
        done = 0
        for user in queryset.filter(is_active=True).exclude(pk=request.user.pk):
            user_deactivate(actor=request.user, user=user, reason="admin action")
            done += 1
        self.message_user(request, f"Deactivated {done} user(s).")

    def get_urls(self) -> list[URLPattern]:
        return [
            path("invite/", _view(self, admin_views.user_invite), name="auth_user_invite"),
            path(
                "<int:user_id>/reset-link/",
                _view(self, admin_views.user_reset_link),
                name="auth_user_reset_link",
            ),
            path(
                "<int:user_id>/deactivate/",
                _view(self, admin_views.user_deactivate),
                name="auth_user_deactivate",
            ),
            *super().get_urls(),
        ]
