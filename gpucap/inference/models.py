"""Inference deployments (one model served by replica VMs behind the router) and their API keys.

A replica is a `VirtualMachine` with role ``inference_replica`` and ``deployment`` set; it goes
through the same lifecycle as any VM. An API key is stored as a visible prefix plus a salted
SHA-256 of its secret (the secret is shown once, at creation, and never stored).

A running replica is sent requests only once its readiness probe has answered
(``ReplicaProbe``, kept by gpucap/inference/probe.py): on a real VM, booted does not mean the
model server is up.
"""

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from gpucap.fleet.models import Pool
from gpucap.rentals.models import VirtualMachine
from gpucap.tenancy.models import Tenant

MAX_REPLICAS = 64


class InferenceDeployment(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="deployments")
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="deployments")
    name = models.CharField(max_length=63)
    slug = models.SlugField(
        max_length=63, unique=True, help_text="In the router's path: /inference/<slug>/v1/."
    )
    model_name = models.CharField(
        max_length=200, help_text="The model id clients ask for, e.g. meta-llama/Llama-3.1-8B."
    )
    image = models.CharField(
        max_length=64,
        default="gpucap-model-server",
        help_text="The catalogue image its replicas boot (an image of the pool's cluster that "
        "serves a port); its first port is the replicas' OpenAI-compatible endpoint.",
    )
    gpus_per_replica = models.PositiveSmallIntegerField()
    min_replicas = models.PositiveSmallIntegerField(default=1)
    max_replicas = models.PositiveSmallIntegerField(default=1)
    target_in_flight = models.PositiveSmallIntegerField(
        default=4, help_text="Requests in flight per replica the autoscaler aims at."
    )
    replica_concurrency = models.PositiveSmallIntegerField(
        default=8, help_text="Requests one replica is sent at once; more wait in the queue."
    )
    queue_limit = models.PositiveIntegerField(
        default=64, help_text="Requests that may wait for a replica; beyond it the router says 429."
    )
    scale_down_cooldown_seconds = models.PositiveIntegerField(default=300)
    cold_start_timeout_seconds = models.PositiveIntegerField(
        default=300,
        help_text="How long a request waits for a replica to start when none is ready (at zero "
        "replicas); past it the router answers 503 with Retry-After.",
    )
    # What the capacity set's schedule or an override puts in force instead of min_replicas
    # and max_replicas, written at each boundary by gpucap/schedules/services.py (None: own).
    scheduled_min_replicas = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)
    scheduled_max_replicas = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)
    # The autoscaler's memory: since when fewer replicas would do (None: not so now).
    scale_down_since = models.DateTimeField(null=True, blank=True)
    last_scaled_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant__slug", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="deployment_name_per_tenant"),
            models.CheckConstraint(
                condition=Q(min_replicas__lte=F("max_replicas")),
                name="deployment_min_at_most_max",
            ),
            models.CheckConstraint(
                condition=Q(max_replicas__gte=1) & Q(max_replicas__lte=MAX_REPLICAS),
                name="deployment_max_replicas_range",
            ),
            models.CheckConstraint(
                condition=Q(gpus_per_replica__gte=1) & Q(gpus_per_replica__lte=8),
                name="deployment_gpus_per_replica_range",
            ),
            models.CheckConstraint(
                condition=Q(target_in_flight__gte=1)
                & Q(replica_concurrency__gte=F("target_in_flight")),
                name="deployment_concurrency_at_least_target",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.slug} ({self.model_name})"

    @property
    def min_replicas_in_force(self) -> int:
        """The range's lower bound now: the schedule's, else the deployment's own."""
        scheduled = self.scheduled_min_replicas
        return self.min_replicas if scheduled is None else scheduled

    @property
    def max_replicas_in_force(self) -> int:
        """The range's upper bound now: the schedule's, else the deployment's own (never below
        the lower bound in force)."""
        scheduled = self.scheduled_max_replicas
        high = self.max_replicas if scheduled is None else scheduled
        return max(high, self.min_replicas_in_force)

    @property
    def range_from_schedule(self) -> bool:
        """Whether the capacity set's schedule (or an override) holds the range in force now
        instead of the deployment's own min_replicas..max_replicas."""
        return self.scheduled_min_replicas is not None or self.scheduled_max_replicas is not None

    @property
    def cold_start_words(self) -> str:
        """The cold-start timeout as pages say it: "45 s", "5 min", "1 h 30 min"."""
        return duration_words(self.cold_start_timeout_seconds)


def duration_words(seconds: int) -> str:
    """A whole number of seconds in words: "45 s", "5 min", "2 min 30 s", "1 h 30 min"."""
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [(hours, "h"), (minutes, "min"), (seconds, "s")]
    return " ".join(f"{n} {unit}" for n, unit in parts if n) or "0 s"


class ApiKey(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    deployment = models.ForeignKey(
        InferenceDeployment,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="api_keys",
        help_text="The one deployment the key opens; empty: every deployment of its tenant.",
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, help_text="Shown; finds the key.")
    salt = models.CharField(max_length=32)
    digest = models.CharField(max_length=64, help_text="SHA-256 of salt and secret, hex.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class ReplicaProbe(models.Model):
    """What the readiness prober found at one replica's health URL while its guest is up.

    No row: the replica has not been probed since it (last) started, "waiting for first probe".
    One success makes it ready; ``INFERENCE_PROBE_FAILURES`` failures in a row make it not
    ready. The row goes when the guest goes down (stopping, stopped, pending again), so a
    replica that comes back waits for a fresh probe."""

    vm = models.OneToOneField(
        VirtualMachine, primary_key=True, on_delete=models.CASCADE, related_name="probe"
    )
    ready = models.BooleanField(
        default=False, help_text="The router sends it requests (with the VM running)."
    )
    consecutive_failures = models.PositiveIntegerField(
        default=0, help_text="Failed probes since the last one that answered."
    )
    last_probe_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(
        max_length=300, blank=True, help_text="Why the last probe failed; empty once one answers."
    )
    ready_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # An error is there exactly while probes fail.
            models.CheckConstraint(
                condition=Q(consecutive_failures=0, last_error="")
                | (Q(consecutive_failures__gt=0) & ~Q(last_error="")),
                name="probe_error_while_failing",
            ),
            # Ready only through a probe that answered.
            models.CheckConstraint(
                condition=Q(ready=False, ready_since=None)
                | Q(ready=True, ready_since__isnull=False, last_probe_at__isnull=False),
                name="probe_ready_was_probed",
            ),
        ]

    def __str__(self) -> str:
        return f"probe of vm {self.vm_id}: {readiness_label(self)}"


def replica_probe(vm: VirtualMachine) -> ReplicaProbe | None:
    """The replica's probe row, or None (no probe since it started). Reads what
    ``select_related("probe")`` fetched; without it, one query."""
    return getattr(vm, "probe", None)


def replica_routable(vm: VirtualMachine) -> bool:
    """Whether the router sends this replica requests: running, its model server's address
    known, and its readiness probe answered."""
    probe = replica_probe(vm)
    return (
        vm.state == VirtualMachine.State.RUNNING
        and bool(vm.endpoint_url)
        and probe is not None
        and probe.ready
    )


class Readiness(models.TextChoices):
    """A running replica's readiness, as pages and the API say it."""

    WAITING = "waiting", "waiting for first probe"
    READY = "ready", "ready"
    NOT_READY = "not_ready", "not ready"


def readiness(probe: ReplicaProbe | None) -> Readiness:
    if probe is None or probe.last_probe_at is None:
        return Readiness.WAITING
    return Readiness.READY if probe.ready else Readiness.NOT_READY


def readiness_label(probe: ReplicaProbe | None) -> str:
    """ "waiting for first probe", "ready" (with the failures since, if any) or
    "not ready: <last error>"."""
    status = readiness(probe)
    if status == Readiness.NOT_READY:
        return f"not ready: {probe.last_error}"
    if status == Readiness.READY and probe.consecutive_failures:
        failed = probe.consecutive_failures
        return f"ready ({failed} probe{'s' if failed > 1 else ''} failed: {probe.last_error})"
    return status.label


class LoadMinute(models.Model):
    """One minute of a deployment's load, kept from the router's per-second counters (which
    Redis forgets after two minutes) by ``inference.load_record`` (gpucap/inference/
    load_history.py), for load profiles recorded from what really happened (issue 21).

    A minute the recorder never saw has no row: a gap, never a zero. A minute it saw only in
    part (it ran late and Redis had already let the first seconds go) says how many seconds it
    covers, so its rate is ``requests / seconds`` over what was seen."""

    deployment = models.ForeignKey(
        InferenceDeployment, on_delete=models.CASCADE, related_name="load_minutes"
    )
    minute = models.DateTimeField(help_text="The minute's start, UTC, a whole minute.")
    requests = models.PositiveIntegerField(help_text="Requests sent to a replica in the minute.")
    seconds = models.PositiveSmallIntegerField(
        default=60, help_text="Seconds of the minute the counters covered (60: all of it)."
    )
    in_flight_sampled = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Requests in flight when the recorder read this minute, just after it ended "
        "(for a mean service time by Little's law); empty on minutes read together with a "
        "later one.",
    )

    class Meta:
        ordering = ["deployment", "minute"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "minute"], name="load_minute_once"),
            models.CheckConstraint(
                condition=Q(seconds__gte=1) & Q(seconds__lte=60), name="load_minute_seconds_range"
            ),
        ]
        indexes = [models.Index(fields=["minute"], name="load_minute_minute")]

    def __str__(self) -> str:
        return f"{self.deployment_id} {self.minute:%Y-%m-%d %H:%M}: {self.requests}"
