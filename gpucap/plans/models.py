"""Stored plans: what the arbiter proposed for one capacity set at one generation, and what
became of it. Plans are history: a newer plan supersedes an older proposal, nothing is edited
or deleted except by retention (`plans.services.plans_prune`)."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from gpucap.fleet.models import CapacitySet, Node, Pool
from gpucap.rentals.models import VirtualMachine
from gpucap.tenancy.models import Tenant


class Plan(models.Model):
    class Status(models.TextChoices):
        PROPOSED = "proposed", "Proposed"  # the latest plan, waiting to be applied
        # Made, but it places nothing and reclaims nothing: never applied, approved or audited.
        # An identical replan folds into it (``replans``) instead of adding a row.
        NOTHING = "nothing", "Nothing to do"
        APPLIED = "applied", "Applied"  # approved by an operator, or made under enforcement
        SUPERSEDED = "superseded", "Superseded"  # a newer plan replaced it before it was applied
        REFUSED = "refused", "Refused"  # an apply found the set changed; nothing was done

    class Trigger(models.TextChoices):
        PERIODIC = "periodic", "Periodic"
        CHANGE = "change", "Set changed"
        APPROVAL = "approval", "Fresh plan for a stale approval"
        OPERATOR = "operator", "Operator asked"

    capacity_set = models.ForeignKey(CapacitySet, on_delete=models.CASCADE, related_name="plans")
    generation = models.BigIntegerField(help_text="The set's generation the plan was made from.")
    mode = models.CharField(
        max_length=16, choices=CapacitySet.Mode.choices, help_text="The set's mode at the time."
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PROPOSED)
    trigger = models.CharField(max_length=16, choices=Trigger.choices, default=Trigger.PERIODIC)
    complete = models.BooleanField(help_text="Every demand group of the set was satisfied.")
    # Summary counts, so lists and history need no join.
    demands = models.PositiveIntegerField(default=0)
    placements = models.PositiveIntegerField(default=0)
    preemptions = models.PositiveIntegerField(default=0)
    preempted_gpus = models.PositiveIntegerField(default=0)
    unsatisfied = models.PositiveIntegerField(default=0)
    # Each pool of the set before and after the plan: [{"pool", "name", "rank", "kind",
    # "floor_gpus", "before_gpus", "after_gpus", "pending_gpus"}] in rank order.
    pools = models.JSONField(default=list)
    # Each reservation of the set in force, as the arbiter reported it: [{"id" (the
    # Reservation's id, as text), "tenant", "gpus", "block_gpus", "held_before", "held_after",
    # "kept_gpus", "borrowed" (VM instance ids), "claim_reclaims" (instance ids of the VMs its
    # tenant's claim would give notices), "claim_complete", "short_gpus"}]
    # (gpucap/plans/reservations.py).
    reservations = models.JSONField(default=list, blank=True)
    # What the plan does, as a stable digest: two plans with the same digest act the same.
    digest = models.CharField(max_length=64)
    planning_ms = models.PositiveIntegerField(default=0)
    replans = models.PositiveIntegerField(
        default=0,
        help_text="Replans that found exactly this plan again (nothing to do) and were folded "
        "into it instead of being stored.",
    )
    replanned_at = models.DateTimeField(
        null=True, blank=True, help_text="When the latest folded replan was made."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    approved_at = models.DateTimeField(null=True, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True)
    status_message = models.TextField(blank=True, help_text="Why it was refused, in words.")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["capacity_set", "-created_at"])]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["proposed", "nothing", "applied", "superseded", "refused"]),
                name="plan_status_valid",
            ),
            models.CheckConstraint(
                condition=Q(mode__in=["dry_run", "enforce"]), name="plan_mode_valid"
            ),
            # At most one live proposal per set: the page's Approve button has one target.
            models.UniqueConstraint(
                fields=["capacity_set"],
                condition=Q(status="proposed"),
                name="plan_one_proposal_per_set",
            ),
            models.CheckConstraint(
                condition=~Q(status="applied") | Q(applied_at__isnull=False),
                name="plan_applied_has_time",
            ),
        ]

    def __str__(self) -> str:
        return f"plan {self.pk} of {self.capacity_set.name} (generation {self.generation})"

    @property
    def has_actions(self) -> bool:
        return bool(self.placements or self.preemptions)

    @property
    def checked_at(self):
        """When the arbiter last found this plan: made, or found again by a folded replan."""
        return self.replanned_at or self.created_at


class PlanAction(models.Model):
    """One line of a plan: a placement (a pending VM gets GPUs), a preemption (a running VM gets
    a notice for a placement) or an unsatisfied demand (and why)."""

    class Kind(models.TextChoices):
        PLACEMENT = "placement", "Placement"
        PREEMPTION = "preemption", "Preemption"
        UNSATISFIED = "unsatisfied", "Unsatisfied"

    class Progress(models.TextChoices):
        # Where an applied placement or preemption is. Unapplied plans leave it blank.
        DONE = "done", "Done"  # notice sent, or VM placed
        WAITING = "waiting", "Waiting for its victims to stop"
        MISSED = "missed", "Could not be completed"  # the VM or its GPUs changed meanwhile

    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="actions")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    position = models.PositiveIntegerField(help_text="Order within the plan and kind.")
    # The demand's VM for placements and unsatisfied demands; the victim for preemptions.
    vm = models.ForeignKey(VirtualMachine, on_delete=models.CASCADE, related_name="plan_actions")
    # Preemptions: the VM whose placement takes the victim's GPUs.
    for_vm = models.ForeignKey(
        VirtualMachine,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="plan_actions_for",
    )
    # Copied from the VM at planning time: the preview shows the VM as the plan saw it.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="+")
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.CASCADE)
    gpus = models.JSONField(default=list, help_text="GPU indices on the node.")
    group = models.CharField(max_length=128, blank=True)
    running_since = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)
    waits_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Unsatisfied demands that only VMs their pool protects could serve (a pool's "
        "protect_seconds): when that protection ends. The set is planned again then.",
    )
    # Placements: the reservation the VM is placed inside (its tenant's), or the one whose
    # kept capacity it borrows (a spot VM); copied onto the VM when it is placed.
    reservation = models.ForeignKey(
        "allocation.Reservation", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    borrowed_from = models.ForeignKey(
        "allocation.Reservation", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    progress = models.CharField(max_length=16, choices=Progress.choices, blank=True)
    progress_message = models.TextField(blank=True)

    class Meta:
        ordering = ["plan", "kind", "position"]
        constraints = [
            models.UniqueConstraint(
                fields=["plan", "kind", "position"], name="planaction_position_unique"
            ),
            models.CheckConstraint(
                condition=Q(kind__in=["placement", "preemption", "unsatisfied"]),
                name="planaction_kind_valid",
            ),
            models.CheckConstraint(
                condition=Q(progress__in=["", "done", "waiting", "missed"]),
                name="planaction_progress_valid",
            ),
            models.CheckConstraint(
                condition=~Q(kind="preemption") | Q(for_vm__isnull=False, node__isnull=False),
                name="planaction_preemption_has_beneficiary",
            ),
            models.CheckConstraint(
                condition=~Q(kind="placement") | Q(node__isnull=False),
                name="planaction_placement_has_node",
            ),
        ]
        indexes = [
            models.Index(
                fields=["progress"], condition=Q(progress="waiting"), name="planaction_waiting"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.position} of plan {self.plan_id}"


class SimulationRun(models.Model):
    """A load profile replayed against a capacity set in simulated time (issue 21): today's
    policy and, when ``changes`` are given, an edited one beside it. What it starts from is
    captured when it is asked for (``start``), so it is carried out on exactly that set, as
    often as needed, with the same result."""

    class State(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    capacity_set = models.ForeignKey(
        CapacitySet, on_delete=models.CASCADE, related_name="simulation_runs"
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    name = models.CharField(
        max_length=120, blank=True, help_text='The operator\'s label, e.g. "chat doubles at 09:00".'
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    # Progress: steps simulated of all the run's steps (both runs' when there is a comparison).
    steps_done = models.PositiveIntegerField(default=0)
    steps_total = models.PositiveIntegerField(default=0)
    # Which claim is carrying it out, and when that claim last showed progress: a claim whose
    # worker was lost (no progress for SIMULATION_STALE_SECONDS) is taken over by the next.
    attempts = models.PositiveIntegerField(default=0)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, help_text="Why it failed.")
    profile = models.JSONField(help_text="The load profile in its JSON form, as given.")
    changes = models.JSONField(
        default=dict, blank=True, help_text="The edited configuration; {}: no comparison."
    )
    step_seconds = models.PositiveIntegerField()
    duration_seconds = models.PositiveIntegerField()
    wait_threshold_seconds = models.FloatField()
    start = models.JSONField(
        help_text="What it starts from, read when it was asked for: the snapshot with the "
        "pools' own ranks and floors, the deployments, the schedule and the notice period."
    )
    result = models.JSONField(null=True, blank=True, help_text="Today's policy.")
    variant_result = models.JSONField(null=True, blank=True, help_text="The edited policy.")
    differences = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["capacity_set", "-created_at"])]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=["queued", "running", "done", "failed"]),
                name="simulationrun_state_valid",
            ),
            models.CheckConstraint(
                condition=Q(steps_done__lte=models.F("steps_total")),
                name="simulationrun_progress_bounded",
            ),
            models.CheckConstraint(
                condition=Q(step_seconds__gte=1, duration_seconds__gte=1),
                name="simulationrun_times_positive",
            ),
            models.CheckConstraint(
                condition=Q(wait_threshold_seconds__gt=0), name="simulationrun_threshold_positive"
            ),
            models.CheckConstraint(
                condition=~Q(state="done") | Q(result__isnull=False, finished_at__isnull=False),
                name="simulationrun_done_has_result",
            ),
            models.CheckConstraint(
                condition=~Q(state="running") | Q(started_at__isnull=False),
                name="simulationrun_running_has_start",
            ),
        ]

    def __str__(self) -> str:
        label = f" ({self.name})" if self.name else ""
        return f"simulation {self.pk} of {self.capacity_set.name}{label}"

    @property
    def compares(self) -> bool:
        return bool(self.changes)

    @property
    def length(self) -> str:
        """How much simulated time, in words: "24 h", "90 min"."""
        minutes = self.duration_seconds // 60
        return f"{minutes // 60} h" if minutes % 60 == 0 else f"{minutes} min"
