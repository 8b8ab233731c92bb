"""What recovery keeps (docs/bmc.md, Recovery): what each node's hypervisor last answered
(``HypervisorProbe``, written by the hypervisor watch), each cluster's ``RecoveryPolicy``, each
node's ``NodeRecovery`` state and the history of its power cycles (``RecoveryAttempt``).
Imported by ``gpucap.bmc.models``, the app's models module."""

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from gpucap.fleet.models import Cluster, Node

# The bounds of a policy's numbers: the database holds them, the service names them.
GRACE_SECONDS_MAX = 7 * 86400
MAX_ATTEMPTS_MAX = 20
BOOT_TIMEOUT_SECONDS_MAX = 86400


class HypervisorProbe(models.Model):
    """The hypervisor watch's record of one node (``gpucap.bmc.hypervisor_watch``): when it last
    asked, when the hypervisor last answered, and since when it has not (null while it
    answers). A node whose hypervisor stays silent for ``NODE_DOWN_AFTER_SECONDS`` is marked
    down."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="hypervisor_probe")
    probed_at = models.DateTimeField(help_text="When the last probe recorded was sent.")
    answered_at = models.DateTimeField(
        null=True, blank=True, help_text="When a probe last got an answer."
    )
    silent_since = models.DateTimeField(
        null=True,
        blank=True,
        help_text="The first probe without an answer since the last answer; empty while the "
        "hypervisor answers, and while the node is down (recovery asks it then).",
    )

    class Meta:
        ordering = ["node_id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(silent_since__isnull=True) | Q(silent_since__lte=F("probed_at")),
                name="hypervisorprobe_silent_since_probed",
            ),
        ]

    def __str__(self) -> str:
        return f"hypervisor probe of {self.node.hostname}"


class RecoveryPolicy(models.Model):
    """How one cluster's down nodes are recovered. A cluster without a row has the defaults:
    no automatic power cycle."""

    cluster = models.OneToOneField(
        Cluster, on_delete=models.CASCADE, related_name="recovery_policy"
    )
    auto_power_cycle = models.BooleanField(
        default=False,
        help_text="Power-cycle a node through its BMC once it has been down for grace_seconds.",
    )
    grace_seconds = models.PositiveIntegerField(
        default=600, help_text="How long a node stays down before the automatic power cycle."
    )
    max_attempts = models.PositiveSmallIntegerField(
        default=3,
        help_text="Consecutive failed power cycles after which recovery stops for the node "
        "until an operator clears it.",
    )
    boot_timeout_seconds = models.PositiveIntegerField(
        default=900,
        help_text="How long after power on the node's hypervisor has to answer.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster_id"]
        verbose_name_plural = "recovery policies"
        constraints = [
            models.CheckConstraint(
                condition=Q(grace_seconds__lte=GRACE_SECONDS_MAX),
                name="recoverypolicy_grace_seconds_range",
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1) & Q(max_attempts__lte=MAX_ATTEMPTS_MAX),
                name="recoverypolicy_max_attempts_range",
            ),
            models.CheckConstraint(
                condition=Q(boot_timeout_seconds__gte=1)
                & Q(boot_timeout_seconds__lte=BOOT_TIMEOUT_SECONDS_MAX),
                name="recoverypolicy_boot_timeout_range",
            ),
        ]

    def __str__(self) -> str:
        return f"recovery policy of {self.cluster.name}"


class NodeRecovery(models.Model):
    """Where recovery stands for one node: ``idle`` -> ``cycling`` (ForceOff, power Off, On)
    -> ``waiting`` (for the hypervisor, until ``deadline``) -> ``idle`` with the node ready; a
    failed cycle counts in ``attempts`` and, after the policy's ``max_attempts`` in a row or a
    BMC that refuses, ``stopped`` (automation leaves the node alone until an operator clears
    it). Every move is a conditional update on ``state`` (``gpucap.bmc.recovery``)."""

    class State(models.TextChoices):
        IDLE = "idle", "Idle"
        CYCLING = "cycling", "Power cycling"
        WAITING = "waiting", "Waiting for the hypervisor"
        STOPPED = "stopped", "Stopped"

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="recovery")
    state = models.CharField(max_length=16, choices=State.choices, default=State.IDLE)
    attempts = models.PositiveSmallIntegerField(
        default=0, help_text="Power cycles failed in a row (back to 0 once one recovers it)."
    )
    down_since = models.DateTimeField(
        null=True, blank=True, help_text="When the node last went down: the grace counts from it."
    )
    next_attempt_at = models.DateTimeField(
        null=True, blank=True, help_text="After a failed cycle: no automatic one before this."
    )
    deadline = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Cycling: when a cycle still running is given up (its worker was lost); "
        "waiting: when the hypervisor must have answered by.",
    )
    last_error = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["node_id"]
        verbose_name_plural = "node recoveries"
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=["idle", "cycling", "waiting", "stopped"]),
                name="noderecovery_state_valid",
            ),
            models.CheckConstraint(
                condition=Q(state__in=["idle", "stopped"]) | Q(deadline__isnull=False),
                name="noderecovery_deadline_while_busy",
            ),
        ]

    def __str__(self) -> str:
        return f"recovery of {self.node.hostname}: {self.state}"


class RecoveryAttempt(models.Model):
    """One power cycle of a node, for its page's history: who or what started it, when, how it
    ended and why. At most one is open (unfinished) per node: the database says so."""

    class Trigger(models.TextChoices):
        OPERATOR = "operator", "Operator"
        AUTOMATIC = "automatic", "Automatic"

    class Outcome(models.TextChoices):
        RECOVERED = "recovered", "Recovered"
        FAILED = "failed", "Failed"
        REFUSED = "refused", "Refused by the BMC"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="recovery_attempts")
    trigger = models.CharField(max_length=16, choices=Trigger.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    started_at = models.DateTimeField()
    claimed_at = models.DateTimeField(
        null=True, blank=True, help_text="When a worker took the cycle on (once only)."
    )
    powered_on_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, blank=True)
    message = models.TextField(blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["node"],
                condition=Q(finished_at__isnull=True),
                name="recoveryattempt_one_open_per_node",
            ),
            models.CheckConstraint(
                condition=Q(finished_at__isnull=True, outcome="")
                | Q(finished_at__isnull=False) & ~Q(outcome=""),
                name="recoveryattempt_outcome_when_finished",
            ),
            models.CheckConstraint(
                condition=Q(trigger__in=["operator", "automatic"]),
                name="recoveryattempt_trigger_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"power cycle of {self.node.hostname} at {self.started_at:%Y-%m-%d %H:%M:%S}"
