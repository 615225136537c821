"""The product's data: chat sessions, their canonical transcripts, turns and attachments.

The transcript is append-only: one `Message` row per canonical message, numbered by a
per-session sequence number (the append order). It is a tree (docs/PROTOCOL.md
"Branches"): each message names its parent by seq, the session its active leaf; editing or
regenerating adds siblings and never rewrites or deletes a row. Compaction, degradation and
cache marks act on the outbound copy only; nothing here is ever rewritten for a model.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


class Session(models.Model):
    """One conversation between a user and the agent."""

    # Random ids: a session URL is not a counter anyone can walk (access is still checked).
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_sessions"
    )
    title = models.CharField(max_length=200, blank=True)
    model = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    archived = models.BooleanField(default=False)
    # Pinned sessions head the sidebar, whatever their age.
    pinned = models.BooleanField(default=False)
    # Next per-session message sequence number; bumped under a row lock.
    next_seq = models.PositiveIntegerField(default=1)
    # Outbound-only compaction state (runtime.agent.compaction.CompactionState.to_dict()).
    compaction_state = models.JSONField(null=True, blank=True)
    # Prompt-side tokens of the latest model call: the context meter and compaction signal.
    last_context_tokens = models.PositiveIntegerField(null=True, blank=True)
    # The seq of the message the page shows last: the path root → here is the transcript
    # the page renders and the next `send` extends. NULL while the session is empty.
    # A seq, not a foreign key: the protocol, exports and the path walk all speak seqs,
    # and (session, seq) is unique.
    active_seq = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["owner", "-updated_at"], name="session_owner_recent")]

    def __str__(self) -> str:
        return self.title or f"Session {str(self.id)[:8]}"


class Turn(models.Model):
    """One user request and everything the agent did to answer it (possibly many steps)."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        AWAITING_APPROVAL = "awaiting_approval"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"
        INTERRUPTED = "interrupted"

    ACTIVE = (Status.QUEUED, Status.RUNNING, Status.AWAITING_APPROVAL)
    TERMINAL = (Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.INTERRUPTED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="turns")
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED)
    model = models.CharField(max_length=200)
    # Provider error kind (providers.errors: "rate_limited", "no_access", ...) and its
    # plain-words message; never the upstream's raw body (it may echo request data).
    error_kind = models.CharField(max_length=40, blank=True)
    error = models.TextField(blank=True)
    # The lease: whoever runs the turn refreshes heartbeat_at; a stale heartbeat on a
    # running turn means its worker died.
    lease_owner = models.CharField(max_length=200, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    # What the current step has streamed so far, flushed about every second.
    partial_text = models.TextField(blank=True)
    partial_reasoning = models.TextField(blank=True)
    steps = models.PositiveIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0)
    # Tool-call approvals: {call_id: "approved" | "denied"} for calls whose policy is "ask".
    approvals = models.JSONField(default=dict, blank=True)
    usage = models.JSONField(null=True, blank=True)
    cost = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    # The seq of the message the turn's first row hangs under: the active leaf for a
    # `send`, the edited message's parent for an edit, the answered user message for a
    # regenerate, the cut reply for a continue. NULL for turns older than the tree.
    base_seq = models.PositiveIntegerField(null=True, blank=True)
    # A continue turn: "prefill" (the request ends with the cut assistant message) or
    # "instruction" (a wire-only user instruction follows it); "" for every other turn.
    continuation = models.CharField(max_length=20, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [
            models.Index(fields=["session", "created_at"], name="turn_session_created"),
            models.Index(fields=["status", "heartbeat_at"], name="turn_status_heartbeat"),
        ]

    def __str__(self) -> str:
        return f"Turn {str(self.id)[:8]} ({self.status})"


class Message(models.Model):
    """One canonical message (DESIGN.md "Canonical messages")."""

    class Role(models.TextChoices):
        SYSTEM = "system"
        USER = "user"
        ASSISTANT = "assistant"
        TOOL = "tool"

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="messages")
    seq = models.PositiveIntegerField()
    # The message before this one on its path (its seq; always smaller), NULL for a first
    # message. Siblings share a parent.
    parent_seq = models.PositiveIntegerField(null=True, blank=True)
    turn = models.ForeignKey(
        Turn, on_delete=models.SET_NULL, null=True, blank=True, related_name="messages"
    )
    role = models.CharField(max_length=10, choices=Role.choices)
    # A string or a list of parts ({"type": "text"|"image_url"|"file", ...}).
    content = models.JSONField(default=str, blank=True)
    tool_calls = models.JSONField(null=True, blank=True)
    tool_call_id = models.CharField(max_length=200, blank=True)
    reasoning = models.TextField(blank=True)
    extras = models.JSONField(null=True, blank=True)
    usage = models.JSONField(null=True, blank=True)
    model = models.CharField(max_length=200, blank=True)
    finish_reason = models.CharField(max_length=40, blank=True)
    # A continuation row ("prefill" / "instruction", see Turn.continuation): an assistant
    # message holding the rest of its parent, the cut reply it continues.
    continuation = models.CharField(max_length=20, blank=True)
    # Idempotency: a redelivered or retried turn never writes the same step twice.
    # NULL, not "": rows without a key must not collide under the unique constraint.
    dedupe_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["seq"]
        constraints = [
            models.UniqueConstraint(fields=["session", "seq"], name="message_session_seq"),
            models.UniqueConstraint(
                fields=["session", "dedupe_key"], name="message_session_dedupe"
            ),
        ]
        # Siblings (children of one parent) in one index range.
        indexes = [models.Index(fields=["session", "parent_seq"], name="message_session_parent")]

    def __str__(self) -> str:
        return f"{self.role} #{self.seq}"

    def to_canonical(self) -> dict:
        """The canonical dict the engine and exports use."""
        out: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.reasoning:
            out["reasoning"] = self.reasoning
        if self.extras:
            out["extras"] = self.extras
        if self.usage:
            out["usage"] = self.usage
        if self.continuation:
            # Read by the outbound view (runtime.agent.history), never sent as is.
            out["continuation"] = self.continuation
        return out


def attachment_path(instance: Attachment, filename: str) -> str:
    # Content-addressed per owner: the original name lives in the row, never in the path.
    return f"attachments/{instance.owner_id}/{instance.sha256}"


class Attachment(models.Model):
    """An uploaded image or PDF, referenced from message parts by id."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="attachments"
    )
    session = models.ForeignKey(
        Session, on_delete=models.CASCADE, null=True, blank=True, related_name="attachments"
    )
    file = models.FileField(upload_to=attachment_path, max_length=300)
    name = models.CharField(max_length=255)
    mime = models.CharField(max_length=100)
    size = models.PositiveIntegerField()
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "sha256"], name="attachment_owner_sha256")
        ]

    def __str__(self) -> str:
        return self.name


class CompactionSettings(models.Model):
    """The organisation's auto-compaction settings (one row, edited by admins).

    Read at the start of every model call, so a change applies to the next turn.
    """

    enabled = models.BooleanField(default=True)
    threshold_pct = models.FloatField(
        default=0.8,
        validators=[MinValueValidator(0.1), MaxValueValidator(0.95)],
        help_text="Compact when the context reaches this share of the model's window.",
    )
    cap_tokens = models.PositiveIntegerField(
        default=250_000,
        validators=[MinValueValidator(4_000)],
        help_text="…or this many tokens, whichever comes first (large windows compact early).",
    )
    keep_recent_fraction = models.FloatField(
        default=0.25,
        validators=[MinValueValidator(0.05), MaxValueValidator(0.5)],
        help_text="Share of the trigger kept verbatim after a compaction.",
    )
    summary_model = models.CharField(
        max_length=200, blank=True, help_text="Model that writes summaries; empty: the session's."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "compaction settings"
        verbose_name_plural = "compaction settings"

    def __str__(self) -> str:
        return "Compaction settings"

    def save(self, *args: object, **kwargs: object) -> None:
        self.pk = 1  # a singleton
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def load(cls) -> CompactionSettings:
        settings_row, _ = cls.objects.get_or_create(pk=1)
        return settings_row


class CompactionCheckpoint(models.Model):
    """Where a compaction happened: shown in the transcript with its summary."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="checkpoints")
    turn = models.ForeignKey(Turn, on_delete=models.SET_NULL, null=True, blank=True)
    # The first message kept verbatim (by transcript position) and its list index.
    boundary_seq = models.PositiveIntegerField()
    boundary_index = models.PositiveIntegerField()
    summary = models.TextField()
    # The whole CompactionState it computed (to_dict()): a checkpoint applies to any path
    # its boundary message lies on (docs/PROTOCOL.md "Compaction on a tree").
    state = models.JSONField(null=True, blank=True)
    tokens_before = models.PositiveIntegerField(null=True, blank=True)
    tokens_after = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"Compaction before #{self.boundary_seq}"


class AuditLog(models.Model):
    """Who did what to whose data, when and why: reviews, exports and account actions.

    Append-only: written by `sessions.audit.audit_record`, readable but never editable
    in the admin. The actor's and target's usernames are copied so the trail survives
    a deleted account.
    """

    class Action(models.TextChoices):
        REVIEW = "review", "Reviewed a session"
        EXPORT = "export", "Exported sessions"
        EXPORT_DOWNLOAD = "export_download", "Downloaded an export"
        DEACTIVATE = "deactivate", "Deactivated a user"
        INVITE = "invite", "Invited a user"
        PASSWORD_RESET = "password_reset", "Issued a password reset link"

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        related_name="+",
    )
    actor_username = models.CharField(max_length=150)
    action = models.CharField(max_length=30, choices=Action.choices)
    target_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    target_username = models.CharField(max_length=150, blank=True)
    target_session_id = models.UUIDField(null=True, blank=True)
    reason = models.TextField(blank=True)
    # Filters of an export, counts, ids: small JSON, never transcript text or key material.
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "audit log entry"
        verbose_name_plural = "audit log"

    def __str__(self) -> str:
        return f"{self.actor_username} {self.action} at {self.created_at:%Y-%m-%d %H:%M}"


class ToolPolicy(models.Model):
    """An admin's override of a tool's default policy (allow / ask / deny)."""

    class Policy(models.TextChoices):
        ALLOW = "allow", "Allow"
        ASK = "ask", "Ask the user"
        DENY = "deny", "Deny"

    tool = models.CharField(max_length=100, unique=True)
    policy = models.CharField(max_length=10, choices=Policy.choices)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tool"]
        verbose_name_plural = "tool policies"

    def __str__(self) -> str:
        return f"{self.tool}: {self.policy}"


class UserLimits(models.Model):
    """Per-user limits, checked by `services.turn_start` before a turn is queued."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="limits"
    )
    max_concurrent_turns = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Empty: the site default (MAX_CONCURRENT_TURNS_PER_USER).",
    )
    monthly_budget = models.DecimalField(
        max_digits=12,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Spend cap per calendar month (UTC), in the prices' currency; empty: none.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "user limits"
        verbose_name_plural = "user limits"

    def __str__(self) -> str:
        return f"Limits for user {self.user_id}"


def export_path(instance: ExportJob, filename: str) -> str:
    return f"exports/{instance.pk}/{filename}"


class ExportJob(models.Model):
    """A bulk export of transcripts: filters, progress and the finished files."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    reason = models.TextField()
    # Filters (all optional): whose sessions and which creation dates (inclusive).
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    group = models.ForeignKey(
        "auth.Group", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    date_from = models.DateField(null=True, blank=True)
    date_to = models.DateField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED)
    rows_total = models.PositiveIntegerField(default=0)
    rows_done = models.PositiveIntegerField(default=0)
    jsonl_file = models.FileField(upload_to=export_path, max_length=300, blank=True)
    csv_file = models.FileField(upload_to=export_path, max_length=300, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"Export {str(self.pk)[:8]} ({self.status})"

    @property
    def percent(self) -> int:
        if self.status == self.Status.COMPLETED:
            return 100
        return int(100 * self.rows_done / self.rows_total) if self.rows_total else 0


class UserPreferences(models.Model):
    """A user's own settings in the web app (provider keys live in providers.ProviderProfile)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="preferences"
    )
    # Model new sessions start with; empty: the site default (OPENWORKER_DEFAULT_MODEL).
    default_model = models.CharField(max_length=200, blank=True)

    class Theme(models.TextChoices):
        SYSTEM = "system", "Follow the system"
        LIGHT = "light", "Light"
        DARK = "dark", "Dark"

    # The page's colours: the system's choice (prefers-color-scheme) unless the user picked.
    theme = models.CharField(max_length=10, choices=Theme.choices, default=Theme.SYSTEM)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "user preferences"

    def __str__(self) -> str:
        return f"Preferences of user {self.user_id}"


class UsageReport(Turn):
    """The usage dashboard's place in the admin (a proxy: no table of its own)."""

    class Meta:
        proxy = True
        verbose_name = "usage report"
        verbose_name_plural = "usage dashboard"
