"""Metered usage. The lifecycle opens an interval when a VM takes GPUs and closes it when it
releases them, so billing starts from complete data.

Billing receives usage records: one interval's GPU time within one period (``USAGE_PERIOD_SECONDS``,
an hour by default, aligned to midnight UTC). A record is made once its end is final (its
period is over or its interval has ended), so a record never changes after it is made, and its
``record_id`` is the same in every export and every webhook delivery.
"""

from django.db import models
from django.db.models import F, Q

from gpucap.tenancy.models import Tenant


class UsageInterval(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="usage_intervals")
    vm = models.ForeignKey(
        "rentals.VirtualMachine", on_delete=models.PROTECT, related_name="usage_intervals"
    )
    pool_kind = models.CharField(max_length=16)
    gpu_model = models.CharField(max_length=64)
    gpu_count = models.PositiveSmallIntegerField()
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    recorded_until = models.DateTimeField(
        null=True, blank=True, help_text="Usage records have been made up to here."
    )

    class Meta:
        ordering = ["started_at", "id"]
        indexes = [
            models.Index(fields=["started_at"]),
            # The intervals records may still be made from (services.usage_record).
            models.Index(
                fields=["id"],
                condition=Q(ended_at__isnull=True)
                | Q(recorded_until__isnull=True)
                | Q(recorded_until__lt=F("ended_at")),
                name="usage_interval_unrecorded",
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["vm"], condition=Q(ended_at__isnull=True), name="usage_one_open_per_vm"
            ),
            models.CheckConstraint(
                condition=Q(ended_at__isnull=True) | Q(ended_at__gte=F("started_at")),
                name="usage_ends_after_start",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.vm} {self.gpu_count}x{self.gpu_model} from {self.started_at}"


class UsageRecord(models.Model):
    """One interval's GPU time within one period, final once made. ``id`` grows in the order
    records become visible (they are made under one advisory lock), so it is a safe cursor."""

    record_id = models.CharField(
        max_length=64, unique=True, help_text="Stable: iv<interval id>-<period start, UTC>."
    )
    interval = models.ForeignKey(UsageInterval, on_delete=models.PROTECT, related_name="records")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="usage_records")
    vm = models.ForeignKey(
        "rentals.VirtualMachine", on_delete=models.PROTECT, related_name="usage_records"
    )
    deployment = models.ForeignKey(
        "inference.InferenceDeployment",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="usage_records",
    )
    pool = models.ForeignKey("fleet.Pool", on_delete=models.PROTECT, related_name="usage_records")
    pool_kind = models.CharField(max_length=16)
    gpu_model = models.CharField(max_length=64)
    gpu_count = models.PositiveSmallIntegerField()
    period_start = models.DateTimeField()
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField()
    gpu_seconds = models.DecimalField(max_digits=16, decimal_places=3)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["period_start", "tenant"]),
            models.Index(fields=["tenant", "period_start"]),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["interval", "period_start"], name="usage_record_one_per_period"
            ),
            models.CheckConstraint(
                condition=Q(ended_at__gt=F("started_at")) & Q(started_at__gte=F("period_start")),
                name="usage_record_within_period",
            ),
        ]

    def __str__(self) -> str:
        return self.record_id
