"""OpenWorker settings: one module, two run modes chosen by the environment.

- Embedded (no DATABASE_URL / REDIS_URL): SQLite, in-memory channel layer, turns run as
  asyncio tasks inside the Daphne process; dev secrets generated once into `.state/`.
- Distributed (DATABASE_URL and REDIS_URL set): PostgreSQL (psycopg 3), Redis channel
  layer, Celery workers on Redis running turns.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from openworker.env import envbool, envfloat, envint, envlist, envstr
from openworker.state import dev_encryption_key, dev_secret_key, state_dir

BASE_DIR = Path(__file__).resolve().parent.parent

DATABASE_URL = envstr("DATABASE_URL")
REDIS_URL = envstr("REDIS_URL")
if bool(DATABASE_URL) != bool(REDIS_URL):
    raise ImproperlyConfigured(
        "Distributed mode needs both DATABASE_URL and REDIS_URL; embedded mode needs neither."
    )
DISTRIBUTED = bool(DATABASE_URL and REDIS_URL)
RUN_MODE = "distributed" if DISTRIBUTED else "embedded"

# Off in both modes unless asked for (`make dev`, DEBUG=1): `make run` is how a small team
# serves this on a LAN, and Django's debug pages show tracebacks, source and every URL.
DEBUG = envbool("DEBUG", default=False)
# A deployment (distributed, DEBUG off) takes its secrets and HTTPS from the environment;
# embedded mode keeps generated secrets in `.state/` and serves plain HTTP by default.
DEPLOYMENT = DISTRIBUTED and not DEBUG

SECRET_KEY = envstr("SECRET_KEY")
# Fernet keys, newest first: the first encrypts, all decrypt (rotation, see rotate_keys).
ENCRYPTION_KEYS = envlist("OPENWORKER_ENCRYPTION_KEYS")
if DEPLOYMENT:
    if not SECRET_KEY:
        raise ImproperlyConfigured("SECRET_KEY must be set in the environment when DEBUG is off.")
    if not ENCRYPTION_KEYS:
        raise ImproperlyConfigured(
            "OPENWORKER_ENCRYPTION_KEYS must be set in the environment when DEBUG is off."
        )
else:
    _state = state_dir(BASE_DIR)
    SECRET_KEY = SECRET_KEY or dev_secret_key(_state)
    ENCRYPTION_KEYS = ENCRYPTION_KEYS or [dev_encryption_key(_state)]

ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "axes",
    "providers.edge.apps.ProvidersConfig",
    "sessions.apps.ChatSessionsConfig",
    "sessions.sso.apps.SsoConfig",
    "sessions.mcp.apps.McpConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # NUL, unpaired surrogates and oversize values: a 400 naming the field, not a 500.
    "openworker.middleware.InputValidationMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "openworker.middleware.ContentSecurityPolicyMiddleware",
    # Last, as django-axes requires: it answers a locked-out sign-in with 429.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "openworker.urls"
ASGI_APPLICATION = "openworker.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Distributed mode: every process (Daphne, Celery worker, management command) holds at
# most DB_POOL_MAX_SIZE PostgreSQL connections, in psycopg's pool. Persistent
# per-thread connections (CONN_MAX_AGE) leaked: Daphne runs each request in a thread of
# its own, and a dead thread's connection stayed open until a full garbage collection
# (~100 connections, "too many clients already"). With the pool a thread's connection
# goes back when Django closes it (end of request, after each consumer call, every few
# seconds in the worker's database threads), and a thread that finds all of them busy
# waits up to DB_POOL_TIMEOUT seconds. Sizing: README, "Operations".
DB_POOL_MIN_SIZE = envint("DB_POOL_MIN_SIZE", 1, minimum=0)
# Daphne: requests and socket calls are short, so a few connections serve hundreds of
# them; a worker's turns share WORKER_DB_THREADS + 1 (heartbeats) + 1 (sweeper) threads.
DB_POOL_MAX_SIZE = envint("DB_POOL_MAX_SIZE", 6, minimum=1)
DB_POOL_TIMEOUT = envfloat("DB_POOL_TIMEOUT", 10.0)
if DISTRIBUTED:
    _database = dj_database_url.parse(DATABASE_URL)
    _database["CONN_MAX_AGE"] = 0  # Django's pool requires it: closing returns to the pool
    # With the pool this is psycopg's `check`: a connection PostgreSQL dropped (restart,
    # failover) is found out and replaced when it is taken from the pool, not by the
    # query that would have failed.
    _database["CONN_HEALTH_CHECKS"] = True
    _database.setdefault("OPTIONS", {})["pool"] = {
        "min_size": min(DB_POOL_MIN_SIZE, DB_POOL_MAX_SIZE),
        "max_size": DB_POOL_MAX_SIZE,
        "timeout": DB_POOL_TIMEOUT,
        # Idle connections above min_size are closed after this long.
        "max_idle": 60.0,
    }
    DATABASES = {"default": _database}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": envstr("SQLITE_PATH") or str(BASE_DIR / ".state" / "db.sqlite3"),
            # CONN_MAX_AGE stays 0: kept open, each web request's thread left its
            # connection (two file descriptors) to the full collection, every 5 minutes.
            "OPTIONS": {
                # Writers (turn writes, heartbeats, the consumers' sends, web requests)
                # take the lock in turn: wait for it rather than fail with "database is
                # locked". IMMEDIATE takes it at BEGIN, where the wait applies; a deferred
                # transaction that reads, then writes, fails at once when another holds it.
                "timeout": 20,
                "transaction_mode": "IMMEDIATE",
                # WAL: readers never block the writer nor wait for it, and a commit is an
                # append to the log; under WAL, NORMAL skips the fsync per commit (a power
                # cut can lose the last commits, never corrupt the file).
                # bench/stream_path.py --mode embedded, docs/PERFORMANCE.md.
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
            },
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Login throttling (django-axes): the lockout check runs before the password check.
AUTHENTICATION_BACKENDS = [
    "openworker.throttle.LoginThrottleBackend",
    "django.contrib.auth.backends.ModelBackend",
    # OpenID Connect sign-in (sessions/sso/backend.py): acts only on an SSO callback.
    "sessions.sso.backend.OidcBackend",
]
# Five wrong passwords for one username from one address, then a 15-minute pause:
# enough for typos, far too few for guessing.
AXES_FAILURE_LIMIT = envint("LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=envint("LOGIN_LOCKOUT_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False
# An OpenID Connect callback is not a password guess (sessions/sso/backend.py says why).
AXES_WHITELIST_CALLABLE = "sessions.sso.backend.is_sso_attempt"
# The lockout page: styled, status 429, says when to try again.
AXES_LOCKOUT_TEMPLATE = "429.html"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"
# One identity provider may come from the environment instead of the admin (README, SSO).
SSO_ENV_PROVIDER = (
    {
        "slug": envstr("OPENWORKER_OIDC_SLUG", "sso"),
        "name": envstr("OPENWORKER_OIDC_NAME", "SSO"),
        "issuer": envstr("OPENWORKER_OIDC_ISSUER"),
        "client_id": envstr("OPENWORKER_OIDC_CLIENT_ID"),
        "client_secret": envstr("OPENWORKER_OIDC_CLIENT_SECRET"),
    }
    if envstr("OPENWORKER_OIDC_ISSUER")
    else None
)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(envstr("STATIC_ROOT") or BASE_DIR / ".state" / "staticfiles")
MEDIA_ROOT = Path(envstr("MEDIA_ROOT") or BASE_DIR / ".state" / "media")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if DEPLOYMENT
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}
# Embedded mode serves straight from the finders (DEBUG or not) so `make run` needs no
# collectstatic; a deployment serves the collected, hashed files.
WHITENOISE_USE_FINDERS = not DEPLOYMENT
WHITENOISE_AUTOREFRESH = DEBUG

# One cache for every process in distributed mode: an admin's edit to the curated matrix
# reaches Daphne and every worker at once (per-process memory in embedded mode).
if DISTRIBUTED:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": envstr("CACHE_PREFIX", "openworker"),
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- Channels -------------------------------------------------------------------------
if DISTRIBUTED:
    CHANNEL_LAYERS = {
        "default": {
            # Redis pub/sub with batched publishes (openworker/channel_layer.py says why
            # not channels_redis.core).
            "BACKEND": "openworker.runtime.live.channel_layer.RedisPubSubLayer",
            "CONFIG": {
                "hosts": [REDIS_URL],
                "prefix": envstr("CHANNELS_PREFIX", "openworker"),
                # Per socket: a socket this far behind loses its oldest events (the
                # replay buffer recovers them).
                "capacity": envint("CHANNELS_CAPACITY", 1_000),
                "expiry": 60,
            },
        }
    }
else:
    # Channels' in-memory layer minus its per-message walk of every socket (see the module).
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "openworker.runtime.live.memory_layer.LocalChannelLayer"}
    }

# --- Celery ---------------------------------------------------------------------------
# Turns are long and I/O bound (minutes of streaming from an LLM): a threads pool, one
# task prefetched at a time, acknowledged only once finished so a dead worker's turn is
# redelivered (the engine's lease makes redelivery safe).
TURN_TIME_LIMIT_SECONDS = envint("TURN_TIME_LIMIT_SECONDS", 1800, minimum=60)
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_TASK_ALWAYS_EAGER = not DISTRIBUTED
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_POOL = "threads"
# Turns one process runs at once (a worker process in distributed mode, Daphne in
# embedded mode); the rest wait first come first served, their pages told their place
# (openworker/runtime/turns/admission.py). 200 is what one process streamed in real time
# on a 2-core machine at 20 tokens/s per turn with p99 added latency under 50 ms
# (docs/PERFORMANCE.md); past it every stream slowed and, at 1,000, turns were lost.
TURNS_PER_PROCESS = envint("OPENWORKER_TURNS_PER_PROCESS", 200, minimum=1)
# How fast turns start (a second, after a burst of ADMIT_BURST at once; 0: as fast as
# places are free). Turns started together end together: 200 starts landing in one
# instant, a burst's or a wave's as its predecessor ends, slowed every stream already
# running (docs/PERFORMANCE.md, session 12). Past the pace a turn waits in the queue.
ADMITS_PER_SECOND = envfloat("OPENWORKER_ADMITS_PER_SECOND", 100.0)
ADMIT_BURST = envint("OPENWORKER_ADMIT_BURST", 20, minimum=1)
# Starts slow to a quarter of that pace while the process's event loop runs later than
# this (its streams' tokens already late; 0: never), until it catches up.
ADMIT_LAG_LIMIT_SECONDS = envfloat("OPENWORKER_ADMIT_LAG_LIMIT_SECONDS", 0.03)
# A Celery thread per turn delivered, running or waiting its place: more threads than
# turns admitted, so the admission queue (which tells pages their place and holds the
# turns against re-dispatch), not the broker, is where a burst waits. A waiting thread
# only blocks; the pool starts threads as tasks come.
CELERY_WORKER_CONCURRENCY = envint("CELERY_WORKER_CONCURRENCY", 4 * TURNS_PER_PROCESS, minimum=1)
CELERY_TASK_TIME_LIMIT = TURN_TIME_LIMIT_SECONDS
CELERY_TASK_SOFT_TIME_LIMIT = TURN_TIME_LIMIT_SECONDS - 30
# Must exceed the task time limit, or Redis redelivers a turn that is still running.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": TURN_TIME_LIMIT_SECONDS + 600}
CELERY_TASK_DEFAULT_QUEUE = "default"
# The turn task lives with the runtime, outside any app autodiscovery looks in. Its name
# predates the move (runtime.turns.tasks.RUN_TURN_TASK).
CELERY_IMPORTS = ("openworker.runtime.turns.tasks", "openworker.runtime.turns.watchdog")
CELERY_TASK_ROUTES = {
    "sessions.tasks.run_turn_task": {"queue": "turns"},
    "openworker.run_turns": {"queue": "turns"},
}
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A Redis restart: the worker reconnects for as long as it takes (never exits), keeps
# its running turns going (they need only PostgreSQL and the upstream; cancelling them
# would throw away the stream), and its transport tolerates the closed channel that
# used to kill it (openworker/broker.py).
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
if DISTRIBUTED and REDIS_URL.startswith("redis://"):
    # (A rediss:// URL keeps kombu's own transport, which checks its TLS settings.)
    CELERY_BROKER_TRANSPORT = "openworker.broker:Transport"
# Keys and transcripts never ride in task arguments; JSON only, never pickle.
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]

# --- Agent runtime --------------------------------------------------------------------
DEFAULT_MODEL = envstr("OPENWORKER_DEFAULT_MODEL", "anthropic:claude-sonnet-5")
TURN_MAX_STEPS = envint("TURN_MAX_STEPS", 25, minimum=1)
MAX_CONCURRENT_TURNS_PER_USER = envint("MAX_CONCURRENT_TURNS_PER_USER", 3, minimum=1)
# Title a new session from its first exchange with a short model call (TITLE_MODEL, or
# the session's model when empty); off, sessions are titled from the first words.
AUTO_TITLE = envbool("OPENWORKER_AUTO_TITLE", True)
TITLE_MODEL = envstr("OPENWORKER_TITLE_MODEL", "")
# Custom model ids (not curated for the user's teams) for users whose teams set no policy
# (providers.model_policy): "off", "own_key" (the user's own provider key only: the
# organisation's keys run only curated models) or "any_key".
CUSTOM_MODELS_DEFAULT = envstr("OPENWORKER_CUSTOM_MODELS", "own_key")
if CUSTOM_MODELS_DEFAULT not in ("off", "own_key", "any_key"):
    raise ImproperlyConfigured("OPENWORKER_CUSTOM_MODELS must be off, own_key or any_key.")
# Each Daphne process sweeps expired turn leases; tests drive the sweep by hand.
LEASE_SWEEPER = envbool("OPENWORKER_LEASE_SWEEPER", True)
MAX_MESSAGE_CHARS = envint("MAX_MESSAGE_CHARS", 32_000, minimum=100)
MAX_ATTACHMENT_BYTES = envint("MAX_ATTACHMENT_BYTES", 20 * 1024 * 1024, minimum=1024)
MAX_ATTACHMENTS_PER_MESSAGE = envint("MAX_ATTACHMENTS_PER_MESSAGE", 10, minimum=1)
# Deltas are coalesced into one socket frame per this many seconds (not one per token).
STREAM_COALESCE_SECONDS = envfloat("STREAM_COALESCE_SECONDS", 0.04)
# Threads a worker process's turns share for their database calls (openworker/dbcall.py).
WORKER_DB_THREADS = envint("OPENWORKER_DB_THREADS", 1, minimum=1)
# Threads a Daphne process's websocket consumers share for their database calls in
# distributed mode (runtime.turns.socket_db). More take a burst of sends faster (their
# round trips overlap) but their ORM work then takes the GIL from the loop relaying the
# streams: at K = 500, 2 threads took the sends in 3.6-5.1 s instead of 5.4-6.5 s, and
# the streams' p99 added latency was 88-137 ms instead of 49-83 ms (docs/PERFORMANCE.md).
SOCKET_DB_THREADS = envint("OPENWORKER_SOCKET_DB_THREADS", 1, minimum=1)

# --- Provider layer -------------------------------------------------------------------
# OPENWORKER_OUTBOUND_ALLOWLIST is read by providers.outbound.OutboundPolicy.from_env.
PROVIDER_CONNECT_TIMEOUT = envfloat("PROVIDER_CONNECT_TIMEOUT", 10.0)
# Read-idle timeout: the most seconds between bytes of a reply (the SDKs wait 600 s).
PROVIDER_READ_TIMEOUT = envfloat("PROVIDER_READ_TIMEOUT", 120.0)

# --- Security -------------------------------------------------------------------------
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_AGE = envint("SESSION_COOKIE_AGE", 14 * 24 * 3600, minimum=300)
CSRF_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
if not DEBUG:
    # HTTPS by default in a deployment; embedded mode (plain HTTP on 127.0.0.1 or a LAN)
    # opts in with these variables once a TLS proxy is in front (README, "On a LAN").
    SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", DEPLOYMENT)
    SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", DEPLOYMENT)
    CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", DEPLOYMENT)
    SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 31536000 if DEPLOYMENT else 0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", DEPLOYMENT)
    SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", DEPLOYMENT)
    if envbool("BEHIND_TLS_PROXY", False):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SILENCED_SYSTEM_CHECKS: list[str] = []

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": envstr("LOG_LEVEL", "INFO")},
    # httpx logs every request URL at INFO; keep it quiet, URLs can carry query keys.
    "loggers": {"httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"}},
}

# The provider a bare model id (no `provider:` prefix) goes to.
DEFAULT_PROVIDER = envstr("OPENWORKER_DEFAULT_PROVIDER", "openai")
