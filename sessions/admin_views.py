"""Admin pages where the stock Django admin falls short: transcript review behind a
reason, bulk export with progress, the usage dashboard, user invites, deactivation,
reset links, and the public page where an invited user sets a password.

The admin views are mounted by the ModelAdmins' `get_urls` (sessions/admin.py), wrapped
in `admin_site.admin_view` (staff sign-in), and each checks its own model permission.
They adapt input and call services (`sessions.accounts`, `sessions.bulk_export`,
`sessions.audit`); they never show key material.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.admin import AdminSite
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import SetPasswordForm
from django.contrib.auth.models import Group
from django.contrib.auth.tokens import default_token_generator
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.encoding import force_str
from django.utils.http import urlsafe_base64_decode
from django.views.decorators.cache import never_cache
from django.views.decorators.debug import sensitive_post_parameters

from sessions import accounts, selectors, usage
from sessions.audit import audit_record
from sessions.models import AuditLog, ExportJob, Message, Session
from sessions.tasks import export_job_task

# A reason has to say something: "ok" is not an answer an auditor can use.
MIN_REASON_LENGTH = 10
# Dashboard default period, and the longest one it will compute in a request.
DEFAULT_USAGE_DAYS = 30
MAX_USAGE_DAYS = 366
# How often the export page reloads itself while the job runs (no script: a meta refresh).
EXPORT_REFRESH_SECONDS = 2


class ReasonField(forms.CharField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("min_length", MIN_REASON_LENGTH)
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 3, "cols": 60}))
        super().__init__(**kwargs)


class ReviewForm(forms.Form):
    reason = ReasonField(help_text="Why you need to read this conversation (audit-logged).")


class ExportForm(forms.Form):
    user = forms.ModelChoiceField(
        queryset=get_user_model().objects.order_by("username"), required=False
    )
    group = forms.ModelChoiceField(
        queryset=Group.objects.order_by("name"), required=False, label="Team"
    )
    date_from = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    date_to = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    reason = ReasonField(help_text="Why these transcripts are exported (kept in the audit log).")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        start, end = data.get("date_from"), data.get("date_to")
        if start and end and start > end:
            raise forms.ValidationError("The start date is after the end date.")
        return data


class UsageForm(forms.Form):
    start = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))

    def period(self) -> tuple[Any, Any]:
        today = timezone.localdate()
        data = self.cleaned_data if self.is_valid() else {}
        end = data.get("end") or today
        start = data.get("start") or end - timedelta(days=DEFAULT_USAGE_DAYS - 1)
        if start > end:
            start, end = end, start
        if (end - start).days >= MAX_USAGE_DAYS:
            start = end - timedelta(days=MAX_USAGE_DAYS - 1)
        return start, end


class InviteForm(forms.Form):
    username = forms.CharField(max_length=150)
    email = forms.EmailField(required=False)
    groups = forms.ModelMultipleChoiceField(
        queryset=Group.objects.order_by("name"), required=False, label="Teams"
    )
    is_staff = forms.BooleanField(required=False, label="Staff (may use the admin)")

    def clean_username(self) -> str:
        username = self.cleaned_data["username"].strip()
        field = get_user_model()._meta.get_field("username")
        for validator in field.validators:
            validator(username)
        if get_user_model().objects.filter(username__iexact=username).exists():
            raise forms.ValidationError("A user with that username already exists.")
        return username


class DeactivateForm(forms.Form):
    reason = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}))


def _require(request: HttpRequest, perm: str) -> None:
    if not request.user.has_perm(perm):
        raise PermissionDenied


def _context(admin_site: AdminSite, request: HttpRequest, **extra: Any) -> dict[str, Any]:
    return {**admin_site.each_context(request), **extra}


# --- review -----------------------------------------------------------------------------


@never_cache
def review_session(request: HttpRequest, session_id: Any, *, admin_site: AdminSite) -> HttpResponse:
    """GET: the reason form (no content). POST with a reason: one audit row, then the
    transcript read-only. Every reading is a new POST and a new audit row."""
    _require(request, "chat_sessions.view_session")
    session = get_object_or_404(Session.objects.select_related("owner"), pk=session_id)
    form = ReviewForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        audit_record(
            actor=request.user,
            action=AuditLog.Action.REVIEW,
            reason=form.cleaned_data["reason"],
            target_user=session.owner,
            target_session_id=session.pk,
        )
        # Every message of every branch (append order), each marked with its parent and
        # whether it is on the path the user sees (docs/PROTOCOL.md "Branches").
        rows = Message.objects.filter(session=session).order_by("seq")
        on_path = set(
            selectors.path_rows(session_id=session.pk, leaf_seq=session.active_seq).values_list(
                "seq", flat=True
            )
        )
        return render(
            request,
            "admin/openworker/review_transcript.html",
            _context(
                admin_site,
                request,
                title=f"Review: {session}",
                session=session,
                messages_=[{**_display(m), "active": m.seq in on_path} for m in rows],
                branches=selectors.branch_count(session=session) + 1,
                turns=session.turns.order_by("created_at"),
                reason=form.cleaned_data["reason"],
            ),
        )
    return render(
        request,
        "admin/openworker/review_reason.html",
        _context(admin_site, request, title=f"Review: {session}", session=session, form=form),
    )


def _display(message: Message) -> dict[str, Any]:
    """A message as plain display pieces (text is autoescaped by the template)."""
    text: list[str] = []
    files: list[str] = []
    content = message.content
    if isinstance(content, str):
        text.append(content)
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "text":
                text.append(str(part.get("text", "")))
            else:
                # Uploads carry their display name in the part's `attachment` metadata.
                meta = part.get("attachment") if isinstance(part.get("attachment"), dict) else {}
                files.append(str(meta.get("name") or part.get("name") or part.get("type")))
    return {
        "seq": message.seq,
        "parent": message.parent_seq,
        "continuation": message.continuation,
        "role": message.role,
        "text": "\n\n".join(text),
        "files": files,
        "reasoning": message.reasoning,
        "tool_calls": message.tool_calls or [],
        "tool_call_id": message.tool_call_id,
        "model": message.model,
        "created_at": message.created_at,
    }


# --- bulk export --------------------------------------------------------------------------


def export_start(request: HttpRequest, *, admin_site: AdminSite) -> HttpResponse:
    _require(request, "chat_sessions.add_exportjob")
    form = ExportForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        with transaction.atomic():
            job = ExportJob.objects.create(
                requested_by=request.user,
                reason=data["reason"],
                user=data["user"],
                group=data["group"],
                date_from=data["date_from"],
                date_to=data["date_to"],
            )
            audit_record(
                actor=request.user,
                action=AuditLog.Action.EXPORT,
                reason=data["reason"],
                target_user=data["user"],
                detail={
                    "job": str(job.pk),
                    "user": data["user"].pk if data["user"] else None,
                    "group": data["group"].name if data["group"] else None,
                    "date_from": data["date_from"].isoformat() if data["date_from"] else None,
                    "date_to": data["date_to"].isoformat() if data["date_to"] else None,
                },
            )
            transaction.on_commit(lambda: _enqueue_export(job.pk))
        return redirect("admin:chat_sessions_exportjob_status", job.pk)
    return render(
        request,
        "admin/openworker/export_form.html",
        _context(admin_site, request, title="Export transcripts", form=form),
    )


def _enqueue_export(job_id: Any) -> None:
    export_job_task.delay(str(job_id))


@never_cache
def export_status(request: HttpRequest, job_id: Any, *, admin_site: AdminSite) -> HttpResponse:
    _require(request, "chat_sessions.view_exportjob")
    job = get_object_or_404(ExportJob, pk=job_id)
    running = job.status in (ExportJob.Status.QUEUED, ExportJob.Status.RUNNING)
    return render(
        request,
        "admin/openworker/export_status.html",
        _context(
            admin_site,
            request,
            title=f"Export {str(job.pk)[:8]}",
            job=job,
            refresh=EXPORT_REFRESH_SECONDS if running else None,
        ),
    )


def export_download(
    request: HttpRequest, job_id: Any, kind: str, *, admin_site: AdminSite
) -> FileResponse:
    _require(request, "chat_sessions.view_exportjob")
    job = get_object_or_404(ExportJob, pk=job_id, status=ExportJob.Status.COMPLETED)
    field = {"jsonl": job.jsonl_file, "csv": job.csv_file}.get(kind)
    if not field:
        raise Http404
    audit_record(
        actor=request.user,
        action=AuditLog.Action.EXPORT_DOWNLOAD,
        reason=job.reason,
        target_user=job.user,
        detail={"job": str(job.pk), "file": kind},
    )
    content_type = "application/x-ndjson" if kind == "jsonl" else "text/csv"
    return FileResponse(
        field.open("rb"),
        as_attachment=True,
        filename=field.name.rsplit("/", 1)[-1],
        content_type=content_type,
    )


# --- usage dashboard -----------------------------------------------------------------------


def usage_dashboard(request: HttpRequest, *, admin_site: AdminSite) -> HttpResponse:
    _require(request, "chat_sessions.view_usagereport")
    form = UsageForm(request.GET or None)
    start, end = form.period()
    report = usage.usage_report(start=start, end=end)
    return render(
        request,
        "admin/openworker/usage_dashboard.html",
        _context(
            admin_site,
            request,
            title="Usage",
            form=form,
            report=report,
            day_tokens=usage.column_chart(report.by_day, metric="tokens"),
            day_cost=usage.column_chart(report.by_day, metric="cost"),
            user_tokens=usage.bar_chart(report.by_user, metric="tokens"),
            model_tokens=usage.bar_chart(report.by_model, metric="tokens"),
            user_cost=usage.bar_chart(report.by_user, metric="cost"),
        ),
    )


# --- users --------------------------------------------------------------------------------


def user_invite(request: HttpRequest, *, admin_site: AdminSite) -> HttpResponse:
    _require(request, "auth.add_user")
    form = InviteForm(request.POST or None)
    link = None
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        _, path = accounts.user_invite(
            actor=request.user,
            username=data["username"],
            email=data["email"],
            groups=data["groups"],
            is_staff=data["is_staff"],
        )
        link = request.build_absolute_uri(path)
        form = InviteForm()
    return render(
        request,
        "admin/openworker/user_invite.html",
        _context(admin_site, request, title="Invite a user", form=form, link=link),
    )


def user_reset_link(request: HttpRequest, user_id: Any, *, admin_site: AdminSite) -> HttpResponse:
    """POST: make a set-password link for the user (shown once, to the admin)."""
    _require(request, "auth.change_user")
    user = get_object_or_404(get_user_model(), pk=user_id)
    link = None
    if request.method == "POST":
        link = request.build_absolute_uri(
            accounts.user_password_reset_link(actor=request.user, user=user)
        )
    return render(
        request,
        "admin/openworker/user_reset_link.html",
        _context(admin_site, request, title=f"Password link for {user}", target=user, link=link),
    )


def user_deactivate(request: HttpRequest, user_id: Any, *, admin_site: AdminSite) -> HttpResponse:
    _require(request, "auth.change_user")
    user = get_object_or_404(get_user_model(), pk=user_id)
    form = DeactivateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        if user.pk == request.user.pk:
            messages.error(request, "You cannot deactivate your own account.")
        else:
            stopped = accounts.user_deactivate(
                actor=request.user, user=user, reason=form.cleaned_data["reason"]
            )
            messages.success(
                request, f"{user} is deactivated; {stopped} running repl(ies) asked to stop."
            )
        return redirect(reverse("admin:auth_user_change", args=[user.pk]))
    return render(
        request,
        "admin/openworker/user_deactivate.html",
        _context(admin_site, request, title=f"Deactivate {user}", target=user, form=form),
    )


# --- public: set a password from an invite or reset link ----------------------------------


@never_cache
@sensitive_post_parameters("new_password1", "new_password2")
def account_set_password(request: HttpRequest, uidb64: str, token: str) -> HttpResponse:
    """The invitee's (or resetting user's) page: a valid, unexpired, unused token lets them
    choose a password; setting it spends the token (the token hashes the old password)."""
    user_model = get_user_model()
    try:
        user = user_model.objects.get(pk=force_str(urlsafe_base64_decode(uidb64)))
    except (TypeError, ValueError, OverflowError, user_model.DoesNotExist):
        user = None
    valid = user is not None and user.is_active and default_token_generator.check_token(user, token)
    form = SetPasswordForm(user, request.POST or None) if valid else None
    if valid and request.method == "POST" and form is not None and form.is_valid():
        form.save()
        messages.success(request, "Your password is set. Sign in with it.")
        return redirect("login")
    return render(
        request,
        "admin/openworker/set_password.html",
        {"form": form, "valid": valid, "account": user if valid else None},
        status=200 if valid else 400,
    )
