"""Django settings for gpucap. Everything deployment-specific comes from the environment.

Defaults work on a developer machine with PostgreSQL on 127.0.0.1:5432 (trust auth) and Redis on
127.0.0.1:6379. Production sets at least DEBUG=0, SECRET_KEY, ALLOWED_HOSTS and DATABASE_URL.
"""

import os
from pathlib import Path

import dj_database_url
from celery.schedules import crontab
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from gpucap.envvars import env_bool, env_fernet_keys, env_int, env_list, env_rate, env_str

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("DEBUG", True)
_DEV_SECRET_KEY = "dev-only-insecure-secret-key-change-me"
SECRET_KEY = env_str("SECRET_KEY", _DEV_SECRET_KEY if DEBUG else "")
if not SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django.contrib.postgres",  # OpClass in the fleet's exclusion constraint on guest subnets
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and Redoc served from here: no CDN
    "django_htmx",
    "template_partials",
    "csp",
    "gpucap",
    "gpucap.tenancy",
    "gpucap.audit",
    "gpucap.fleet",
    "gpucap.allocation",
    "gpucap.rentals",
    "gpucap.usage",
    "gpucap.notices",
    "gpucap.bmc",
    "gpucap.plans",
    "gpucap.inference",
    "gpucap.schedules",
]

MIDDLEWARE = [
    # Outermost: under /api/, what would be an HTML error page is the API's JSON error.
    "gpucap.api.errors.ApiErrors",
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "gpucap.web.errors.FriendlyErrorPages",
]

ROOT_URLCONF = "gpucap.urls"
WSGI_APPLICATION = "gpucap.wsgi.application"
ASGI_APPLICATION = "gpucap.asgi.application"

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
                "gpucap.tenancy.context_processors.roles",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpucap"),
        # 0: a connection per request, closed when it ends. The web process is served by ASGI
        # (uvicorn), where Django's persistent connections leak (each request runs in a thread
        # of its own, and its connection outlives it), so gpucap/asgi.py refuses anything else;
        # pool with PgBouncer in front of PostgreSQL instead (README: Database connections).
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 0, minimum=0),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
    raise ImproperlyConfigured("DATABASE_URL must point at PostgreSQL (postgres://...)")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "gpucap",
    }
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

# Every password form (sign-in, the admin's, reset requests, set-password, an invitation's new
# account) may be tried this often per account and per client address: attempts per window,
# e.g. 10/15m or 20/minute (gpucap.tenancy.password_attempts). Sign-in counts wrong passwords;
# the others count every post. Beyond it every attempt is refused, the right password too.
# Read as (attempts, window seconds).
PASSWORD_ATTEMPTS_PER_ACCOUNT = env_rate("PASSWORD_ATTEMPTS_PER_ACCOUNT", "10/15m")
PASSWORD_ATTEMPTS_PER_CLIENT = env_rate("PASSWORD_ATTEMPTS_PER_CLIENT", "30/15m")

# Tenant invitations: the mailed link works once, for this long (7 days by default).
INVITATION_TTL_SECONDS = env_int("INVITATION_TTL_SECONDS", 7 * 86400, minimum=60)
# Password reset links work for this long (Django's setting; 3 days by default).
PASSWORD_RESET_TIMEOUT = env_int("PASSWORD_RESET_TIMEOUT", 3 * 86400, minimum=60)

# Mail: invitations and password resets carry links. Development prints mail to the console.
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "") or (
    "django.core.mail.backends.console.EmailBackend"
    if DEBUG
    else "django.core.mail.backends.smtp.EmailBackend"
)
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "gpucap@localhost")

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# In development WhiteNoise serves straight from the finders; production runs collectstatic.
STATIC_ROOT = None if DEBUG else Path(env_str("STATIC_ROOT", str(BASE_DIR / "var" / "staticfiles")))
WHITENOISE_USE_FINDERS = DEBUG

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)

# HTTPS. With DEBUG off every plain-HTTP request is redirected to HTTPS (but /healthz, which a
# load balancer probes over HTTP) and browsers are told to come back over HTTPS only (HSTS) for
# a year, subdomains included, preload allowed; each can be turned off from the environment.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", not DEBUG)
# Behind a proxy that ends TLS: believe its X-Forwarded-Proto, so the request is secure, URLs
# are built https:// and SECURE_SSL_REDIRECT does not loop. Only when that proxy sets or strips
# the header on every request; otherwise a client could claim HTTPS.
TRUST_X_FORWARDED_PROTO = env_bool("TRUST_X_FORWARDED_PROTO", False)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if TRUST_X_FORWARDED_PROTO else None

# Content-Security-Policy on every page (django-csp): scripts, styles, fonts, images and
# requests come from this site alone, with no inline script, no eval (htmx runs with allowEval
# off) and no <style> element. Only style attributes are allowed inline: the capacity bars'
# widths are data (templates/plans/bars.html), and a style attribute runs no script.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "style-src-attr": ["'unsafe-inline'"],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON, form and multipart bodies bounded in size and depth, their text checked once.
    "DEFAULT_PARSER_CLASSES": [
        "gpucap.api.parsers.JSONParser",
        "gpucap.api.parsers.FormParser",
        "gpucap.api.parsers.MultiPartParser",
    ],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "gpucap.api.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_SCHEMA_CLASS": "gpucap.api.schema.AutoSchema",
    "EXCEPTION_HANDLER": "gpucap.api.errors.exception_handler",
    # POST /api/token/ takes a password: this many attempts per client address, to slow a
    # guessing attack (throttle counts live in the cache, shared by every web process).
    "DEFAULT_THROTTLE_RATES": {"token": env_str("API_TOKEN_RATE", "20/minute")},
    # The client address is the peer's (uvicorn runs with --no-proxy-headers), never a
    # client-sent X-Forwarded-For, which would let a guesser pick a fresh address each time.
    "NUM_PROXIES": 0,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "gpucap API",
    "DESCRIPTION": "GPU capacity manager: fleet, capacity sets, pools, rentals, plans, "
    "inference deployments and API keys.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # The docs pages' JavaScript and CSS come from this project's static files, not a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Request bodies are documented as JSON, the one encoding that can carry every documented
    # shape (null, lists of lists, objects); the form parsers stay for the browsable API.
    "PARSER_WHITELIST": ["gpucap.api.parsers.JSONParser"],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "gpucap.api.schema.postprocess_schema",
    ],
    # Two answers have a ``status`` of their own choices: a plan's keeps the name it had.
    "ENUM_NAME_OVERRIDES": {
        "StatusEnum": "gpucap.plans.models.Plan.Status",
        "ReplicaReadinessEnum": "gpucap.inference.models.Readiness",
        "SimulationStateEnum": "gpucap.plans.models.SimulationRun.State",
        "PowerActionStateEnum": "gpucap.bmc.models.BareMetalPowerAction.State",
        "DiscoveryStateEnum": "gpucap.bmc.models.DiscoveryRun.State",
        # A plan's trigger keeps the name it had before recovery's attempts had one too.
        "TriggerEnum": "gpucap.plans.models.Plan.Trigger",
        "RecoveryTriggerEnum": "gpucap.bmc.recovery_models.RecoveryAttempt.Trigger",
    },
}

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
# A worker that lost its broker tries it again every second, for as long as it takes, rather
# than backing off to 30 s between tries and giving up after 100 (gpucap.celery.Consumer): the
# notices sweep it runs is what keeps deadlines that fell due while the broker was away.
CELERY_WORKER_CONSUMER = "gpucap.celery:Consumer"
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
# A queue of its own lets a test run's worker consume only that run's tasks.
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_TASK_DEFAULT_QUEUE", "celery")
# How often inference replicas are matched to the router's queue (gpucap.inference.autoscaler).
INFERENCE_AUTOSCALE_SECONDS = env_int("INFERENCE_AUTOSCALE_SECONDS", 5, minimum=1)
# The readiness probe of inference replicas (gpucap.inference.probe): how often each running
# replica's model server is asked GET <endpoint><INFERENCE_PROBE_PATH>, how long an answer may
# take, and how many failures in a row take a ready replica out of the router.
INFERENCE_PROBE_SECONDS = env_int("INFERENCE_PROBE_SECONDS", 5, minimum=1)
# How often the router's record of each API key's last use is copied to the key (its "Last
# used" on the pages and in the API): a key used just now reads as before for up to this long.
INFERENCE_KEYS_FLUSH_SECONDS = env_int("INFERENCE_KEYS_FLUSH_SECONDS", 60, minimum=1)
# Minutes of each deployment's load kept (gpucap/inference/load_history.py): the longest window a
# recorded load profile can replay.
LOAD_HISTORY_DAYS = env_int("LOAD_HISTORY_DAYS", 30, minimum=1)
INFERENCE_PROBE_TIMEOUT_SECONDS = env_int("INFERENCE_PROBE_TIMEOUT_SECONDS", 2, minimum=1)
INFERENCE_PROBE_FAILURES = env_int("INFERENCE_PROBE_FAILURES", 3, minimum=1)
INFERENCE_PROBE_PATH = env_str("INFERENCE_PROBE_PATH", "/v1/models")
# How often the notices sweep runs (gpucap.notices.tasks.sweep): the most a lost deadline task,
# or a worker killed while it held a deadline's stop, can delay the stop reaching the driver.
NOTICES_SWEEP_SECONDS = env_int("NOTICES_SWEEP_SECONDS", 5, minimum=1)
# The hypervisor watch (docs/bmc.md, Recovery): how often every node's hypervisor is asked
# whether it answers, how many are asked at once, and how long one may stay silent before its
# node is marked down.
HYPERVISOR_WATCH_SECONDS = env_int("HYPERVISOR_WATCH_SECONDS", 30, minimum=1)
HYPERVISOR_PROBE_CONCURRENCY = env_int("HYPERVISOR_PROBE_CONCURRENCY", 16, minimum=1)
NODE_DOWN_AFTER_SECONDS = env_int("NODE_DOWN_AFTER_SECONDS", 300, minimum=1)
# Recovery by power cycle (docs/bmc.md, Recovery; each cluster's policy is in the database): how
# often the tick runs (automatic cycles started, booting nodes' hypervisors asked), how long a
# machine has to power off after ForceOff and how often its power is read meanwhile, and the
# wait before the next automatic cycle after a failed one (doubled each time, at most an hour).
RECOVERY_TICK_SECONDS = env_int("RECOVERY_TICK_SECONDS", 15, minimum=1)
RECOVERY_POWER_OFF_TIMEOUT_SECONDS = env_int("RECOVERY_POWER_OFF_TIMEOUT_SECONDS", 120, minimum=1)
RECOVERY_POLL_SECONDS = env_int("RECOVERY_POLL_SECONDS", 5, minimum=1)
RECOVERY_BACKOFF_SECONDS = env_int("RECOVERY_BACKOFF_SECONDS", 60, minimum=0)
# Discoveries through the API and the pages (docs/bmc.md, "Lost and expired discoveries"): how
# often the beat looks for runs whose worker or message was lost, how long a run may show no
# progress (a worker shows some after each BMC it reads) before its task is sent again, how
# many sends it gets before it is failed, and how long a preview may wait to be applied (then it
# expires and its sealed passwords are dropped).
BMC_DISCOVERY_RECOVER_SECONDS = env_int("BMC_DISCOVERY_RECOVER_SECONDS", 60, minimum=1)
BMC_DISCOVERY_STALE_SECONDS = env_int("BMC_DISCOVERY_STALE_SECONDS", 300, minimum=1)
BMC_DISCOVERY_MAX_ATTEMPTS = env_int("BMC_DISCOVERY_MAX_ATTEMPTS", 3, minimum=1)
BMC_DISCOVERY_PREVIEW_TTL_SECONDS = env_int("BMC_DISCOVERY_PREVIEW_TTL_SECONDS", 3600, minimum=1)
CELERY_BEAT_SCHEDULE = {
    "sessions-clear": {
        "task": "gpucap.sessions_clear",
        "schedule": crontab(minute=17, hour=3),
    },
    "rentals-reconcile": {
        "task": "rentals.reconcile",
        "schedule": float(env_int("RENTALS_RECONCILE_SECONDS", 30, minimum=1)),
    },
    # The safety net under every notice's scheduled stop: a lost task or a dead worker delays
    # a stop by at most this long.
    "notices-sweep": {"task": "notices.sweep", "schedule": float(NOTICES_SWEEP_SECONDS)},
    # Every set is planned this often even when nothing asked (changes ask at once, throttled).
    "plans-tick-all": {
        "task": "plans.tick_all",
        "schedule": float(env_int("PLANS_INTERVAL_SECONDS", 30, minimum=1)),
    },
    "plans-prune": {"task": "plans.prune", "schedule": crontab(minute=41)},
    # Simulation runs whose worker or message was lost are sent again (a claim takes them over).
    "plans-simulations-recover": {"task": "plans.simulations_recover", "schedule": 60.0},
    # Scheduled policies: each boundary is applied at its moment by a task sent for it; this
    # pass is the safety net (a lost task delays a boundary by at most this long).
    "schedules-apply-due": {
        "task": "schedules.apply_due",
        "schedule": float(env_int("SCHEDULES_INTERVAL_SECONDS", 30, minimum=1)),
    },
    "notices-metadata-resync": {
        "task": "notices.metadata_resync",
        "schedule": float(env_int("METADATA_RESYNC_SECONDS", 60, minimum=1)),
    },
    # Inference replicas follow the router's queue (gpucap.inference.autoscaler). A run left
    # waiting longer than one interval is dropped: the next one reads a fresher queue.
    "inference-autoscale": {
        "task": "inference.autoscale",
        "schedule": float(INFERENCE_AUTOSCALE_SECONDS),
        "options": {"expires": float(INFERENCE_AUTOSCALE_SECONDS)},
    },
    # Readiness probes of inference replicas; a round left waiting longer than one interval is
    # dropped (the next one probes afresh).
    "inference-probe": {
        "task": "inference.probe",
        "schedule": float(INFERENCE_PROBE_SECONDS),
        "options": {"expires": float(INFERENCE_PROBE_SECONDS)},
    },
    "inference-resync": {"task": "inference.resync", "schedule": 60.0},
    "inference-keys-flush": {
        "task": "inference.keys_flush",
        "schedule": float(INFERENCE_KEYS_FLUSH_SECONDS),
    },
    # The router's per-second request counters live two minutes in Redis; each minute is kept
    # (gpucap/inference/load_history.py). A late run loses only what Redis already let go.
    "inference-load-record": {
        "task": "inference.load_record",
        "schedule": 60.0,
        "options": {"expires": 60.0},
    },
    # Usage records are made once their period or interval has ended (gpucap.usage).
    "usage-record": {
        "task": "usage.record",
        "schedule": float(env_int("USAGE_RECORD_SECONDS", 60, minimum=1)),
    },
    # New usage records go to the billing webhook, batch after batch (gpucap.usage).
    "usage-billing-push": {
        "task": "usage.billing_push",
        "schedule": float(env_int("BILLING_PUSH_SECONDS", 60, minimum=1)),
    },
    # Nodes whose hypervisor stays silent are marked down (gpucap.bmc.hypervisor_watch); a round
    # left waiting longer than one interval is dropped (the next one probes afresh).
    "bmc-hypervisor-watch": {
        "task": "bmc.hypervisor_watch",
        "schedule": float(HYPERVISOR_WATCH_SECONDS),
        "options": {"expires": float(HYPERVISOR_WATCH_SECONDS)},
    },
    # Discoveries whose worker or message was lost are sent again (or failed), and previews
    # left unapplied expire (gpucap.bmc.discovery_upkeep).
    "bmc-discoveries-recover": {
        "task": "bmc.discoveries_recover",
        "schedule": float(BMC_DISCOVERY_RECOVER_SECONDS),
        "options": {"expires": float(BMC_DISCOVERY_RECOVER_SECONDS)},
    },
    # Down nodes power-cycled through their BMC where the cluster's policy says so, and booting
    # ones brought back once their hypervisor answers (gpucap.bmc.power_cycle).
    "bmc-recovery-tick": {
        "task": "bmc.recovery_tick",
        "schedule": float(RECOVERY_TICK_SECONDS),
        "options": {"expires": float(RECOVERY_TICK_SECONDS)},
    },
}

# Interruption notices and the instance metadata endpoint (gpucap.notices).
NOTICES_SWEEP_BATCH = env_int("NOTICES_SWEEP_BATCH", 500, minimum=1)
# The Redis the instance metadata documents live in (gpucap/notices/cache.py).
METADATA_REDIS_URL = env_str("METADATA_REDIS_URL", REDIS_URL)
# Addresses of the per-node proxies whose X-Forwarded-For the metadata endpoint believes.
METADATA_TRUSTED_PROXIES = env_list("METADATA_TRUSTED_PROXIES", [])

# Inference (gpucap.inference): the Redis the router's documents and counters live in.
INFERENCE_REDIS_URL = env_str("INFERENCE_REDIS_URL", REDIS_URL)

# Usage (gpucap.usage): records split GPU time into periods of this many seconds, aligned to
# midnight UTC (an hour by default; it must divide a day).
USAGE_PERIOD_SECONDS = env_int("USAGE_PERIOD_SECONDS", 3600, minimum=60)
if 86400 % USAGE_PERIOD_SECONDS:
    raise ImproperlyConfigured(
        f"USAGE_PERIOD_SECONDS={USAGE_PERIOD_SECONDS} must divide a day (86400 seconds)"
    )
# The billing webhook's POST gives up after this many seconds (connect and answer together).
BILLING_WEBHOOK_TIMEOUT_SECONDS = env_int("BILLING_WEBHOOK_TIMEOUT_SECONDS", 10, minimum=1)

# The model server of the simulated driver's inference replicas (gpucap/drivers/model_simulator.py),
# served by this app: the base URL replicas report (the web process's address; `make run` serves
# on 127.0.0.1:8000), and how fast the simulated model answers (0 tokens/s: all at once).
# The simulator answers anyone who asks, so it is served only where this says (by default only
# with DEBUG on; `make run` and docker-compose's demo turn it on); elsewhere its paths are 404.
# A request's simulated delays (its own headers included) add up to at most
# SIMULATOR_MAX_DELAY_SECONDS, so no request holds a connection longer.
SIMULATOR_ENABLED = env_bool("SIMULATOR_ENABLED", DEBUG)
SIMULATOR_BASE_URL = env_str("SIMULATOR_BASE_URL", "http://127.0.0.1:8000").rstrip("/")
SIMULATOR_MAX_DELAY_SECONDS = env_int("SIMULATOR_MAX_DELAY_SECONDS", 30, minimum=1)
SIMULATOR_TTFT_MS = env_int("SIMULATOR_TTFT_MS", 20, minimum=0)
if SIMULATOR_TTFT_MS > 1000 * SIMULATOR_MAX_DELAY_SECONDS:
    raise ImproperlyConfigured(
        f"SIMULATOR_TTFT_MS={SIMULATOR_TTFT_MS} is longer than SIMULATOR_MAX_DELAY_SECONDS="
        f"{SIMULATOR_MAX_DELAY_SECONDS} allows"
    )
SIMULATOR_TOKENS_PER_SECOND = env_int("SIMULATOR_TOKENS_PER_SECOND", 200, minimum=0)

# The planning loop (gpucap.plans): the shortest time between two ticks of a set that changes ask
# for (a change to a quiet set is planned at once; a burst folds into one tick per interval),
# and how many plans of each set the history keeps.
PLANS_DEBOUNCE_SECONDS = env_int("PLANS_DEBOUNCE_SECONDS", 1, minimum=0)
PLANS_KEEP_PER_SET = env_int("PLANS_KEEP_PER_SET", 500, minimum=10)
# A tick (plans.replan, plans.tick) that fails is retried this many times, with exponential
# backoff (1 s, 2 s, 4 s, ... up to 60 s, jittered); the periodic tick covers the set after.
PLANS_TICK_RETRIES = env_int("PLANS_TICK_RETRIES", 5, minimum=0)
# Stored simulation runs (gpucap.plans.simulation_runs): a run whose worker shows no progress
# for this long is taken over by the next claim (the task's retry or the periodic recovery),
# at most SIMULATION_MAX_ATTEMPTS claims in all.
SIMULATION_STALE_SECONDS = env_int("SIMULATION_STALE_SECONDS", 120, minimum=1)
SIMULATION_MAX_ATTEMPTS = env_int("SIMULATION_MAX_ATTEMPTS", 3, minimum=1)

# How Celery tasks drive VMs through their cluster's driver (gpucap.rentals.tasks).
RENTALS_DRIVER_MAX_RETRIES = env_int("RENTALS_DRIVER_MAX_RETRIES", 5, minimum=0)
RENTALS_DRIVER_RETRY_BACKOFF_SECONDS = env_int("RENTALS_DRIVER_RETRY_BACKOFF_SECONDS", 2, minimum=1)
RENTALS_DRIVER_RETRY_BACKOFF_MAX_SECONDS = 300
RENTALS_POLL_SECONDS = env_int("RENTALS_POLL_SECONDS", 3, minimum=1)
RENTALS_POLLS = env_int("RENTALS_POLLS", 40, minimum=0)  # then the reconciler takes over
RENTALS_BOOT_TIMEOUT_SECONDS = env_int("RENTALS_BOOT_TIMEOUT_SECONDS", 900, minimum=1)
# How long a VM may wait for its task before the reconciler sends the task again.
RENTALS_RECONCILE_GRACE_SECONDS = env_int("RENTALS_RECONCILE_GRACE_SECONDS", 120, minimum=0)

# The invariant audit (manage.py audit_invariants): how long after its deadline a notified VM
# may still hold its GPUs (the stop itself: the sweep, the driver, the guest's shutdown), and
# how long a VM may stay provisioning or stopping (or an approved placement wait with nobody
# leaving for it) before it counts as stuck.
AUDIT_DEADLINE_TOLERANCE_SECONDS = env_int("AUDIT_DEADLINE_TOLERANCE_SECONDS", 60, minimum=0)
AUDIT_STUCK_SECONDS = env_int("AUDIT_STUCK_SECONDS", 1200, minimum=1)

# Tests only: the kill point (gpucap.killpoints) at which this worker SIGKILLs its own process
# group. Leave it unset anywhere else.
TEST_KILL_AT = env_str("TEST_KILL_AT", "")

# /metrics (gpucap.observability): a Prometheus server presents this as a bearer token; unset,
# only operators' sessions may read it.
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
if METRICS_TOKEN and len(METRICS_TOKEN) < 16:
    raise ImproperlyConfigured("METRICS_TOKEN must be at least 16 characters (or unset)")
# Where the web workers' request metrics are kept so a scrape adds them up (prometheus_client's
# multiprocess mode, read from the environment when prometheus_client is imported). The
# Procfile sets it (var/prometheus) and empties it before the web server starts; a process
# started with it set but the directory missing would fail at its first request, so make it.
PROMETHEUS_MULTIPROC_DIR = env_str("PROMETHEUS_MULTIPROC_DIR", "")
if PROMETHEUS_MULTIPROC_DIR:
    Path(PROMETHEUS_MULTIPROC_DIR).mkdir(parents=True, exist_ok=True)
elif "PROMETHEUS_MULTIPROC_DIR" in os.environ:
    # prometheus_client would write its files into the working directory.
    raise ImproperlyConfigured(
        "PROMETHEUS_MULTIPROC_DIR is set but empty: unset it or name a directory"
    )

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}

# BMCs (docs/bmc.md): the keys BMC passwords are sealed with (Fernet, comma-separated; the first
# seals, all open), a CA bundle for BMCs whose certificates a private CA signs, and how long a
# Redfish request may take to connect and to answer.
BMC_CREDENTIAL_KEYS = env_fernet_keys("BMC_CREDENTIAL_KEYS")
BMC_CA_BUNDLE = env_str("BMC_CA_BUNDLE", "")
BMC_CONNECT_TIMEOUT_SECONDS = env_int("BMC_CONNECT_TIMEOUT_SECONDS", 5, minimum=1)
BMC_READ_TIMEOUT_SECONDS = env_int("BMC_READ_TIMEOUT_SECONDS", 30, minimum=1)
# Provisioning by virtual media: how long a run may take from the request until the node's
# hypervisor answers, and how often runs in progress are stepped (bmc.provisionings_tick).
PROVISION_TIMEOUT_SECONDS = env_int("PROVISION_TIMEOUT_SECONDS", 3600, minimum=1)
PROVISION_POLL_SECONDS = env_int("PROVISION_POLL_SECONDS", 15, minimum=1)
CELERY_BEAT_SCHEDULE["bmc-provisionings-tick"] = {
    "task": "bmc.provisionings_tick",
    "schedule": float(PROVISION_POLL_SECONDS),
    "options": {"expires": float(PROVISION_POLL_SECONDS)},
}
