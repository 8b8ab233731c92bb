"""Metered usage. The lifecycle opens an interval when a VM takes GPUs and closes it when it
releases them, so billing starts from complete data."""

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

    class Meta:
        ordering = ["started_at", "id"]
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
