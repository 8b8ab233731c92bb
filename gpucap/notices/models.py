"""Interruption notices: the advance warning a VM gets before it is stopped for someone else."""

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from gpucap.rentals.models import VirtualMachine


class InterruptionNotice(models.Model):
    class Reason(models.TextChoices):
        ARBITER = "arbiter", "Reclaimed by the capacity arbiter"
        DRAIN = "drain", "Node or capacity set drained"
        RECLAIM = "reclaim", "Reclaimed by an operator"

    class Outcome(models.TextChoices):
        DEADLINE = "deadline", "Stopped at the deadline"
        ACKNOWLEDGED = "acknowledged", "Released early by the guest"
        GUEST_SHUTDOWN = "guest_shutdown", "The guest shut down before the deadline"
        ENDED = "ended", "The VM stopped or was terminated otherwise"

    vm = models.ForeignKey(VirtualMachine, on_delete=models.CASCADE, related_name="notices")
    reason = models.CharField(max_length=16, choices=Reason.choices)
    message = models.TextField(blank=True, help_text="Why, in words, for the operator and tenant.")
    issued_at = models.DateTimeField()
    deadline = models.DateTimeField()
    issued_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    plan = models.ForeignKey(
        "plans.Plan",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="notices",
        help_text="The arbiter's plan that sent the notice (reason arbiter).",
    )
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, blank=True)

    class Meta:
        ordering = ["deadline", "id"]
        indexes = [models.Index(fields=["completed_at", "deadline"])]
        constraints = [
            models.UniqueConstraint(
                fields=["vm"], condition=Q(completed_at__isnull=True), name="notice_one_open_per_vm"
            ),
            models.CheckConstraint(
                condition=Q(deadline__gte=F("issued_at")), name="notice_deadline_after_issue"
            ),
            models.CheckConstraint(
                condition=Q(reason__in=["arbiter", "drain", "reclaim"]), name="notice_reason_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.reason} notice to {self.vm.instance_id} (deadline {self.deadline:%H:%M:%S})"

    @property
    def is_open(self) -> bool:
        return self.completed_at is None

    @property
    def tenant_message(self) -> str:
        """Why, in words a tenant may read: the operator's ``message`` can name another
        tenant's VM and pool totals (the arbiter's reasons) or an operator's username."""
        return TENANT_WORDS[self.reason]


# What a VM's tenant reads about a notice: nothing of another tenant, nor of the pools' totals.
TENANT_WORDS = {
    InterruptionNotice.Reason.ARBITER: "reclaimed by the capacity arbiter for a "
    "higher-priority pool",
    InterruptionNotice.Reason.DRAIN: "the node is being drained for maintenance",
    InterruptionNotice.Reason.RECLAIM: "reclaimed by an operator",
}
