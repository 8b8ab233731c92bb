"""Tenant allocation (issue #19): what a tenant may hold of the fleet. Quotas now; reservations
and dedicated nodes belong here next.

The app sits between the fleet and the rentals (see .importlinter): a quota names a pool of
the fleet, and ``vm_request`` (gpucap/rentals) and the snapshot (gpucap/plans) read quotas.
"""

from django.db import models
from django.db.models import Q

from gpucap.fleet.models import Pool
from gpucap.tenancy.models import Tenant


class TenantQuota(models.Model):
    """The most GPUs a tenant may hold (running, notified, provisioning: anything holding or
    reserved for GPUs) plus ask for (pending), in one pool or across every pool of one GPU
    model, and optionally the most pending requests it may have waiting there."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quotas")
    pool = models.ForeignKey(
        Pool,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="quotas",
        help_text="The pool the quota binds; empty for a quota per GPU model.",
    )
    gpu_model = models.CharField(
        max_length=64,
        blank=True,
        help_text="The GPU model the quota binds across every pool of it; empty for a pool's.",
    )
    max_gpus = models.PositiveIntegerField(
        help_text="The most GPUs held plus pending in the scope; new requests past it are refused."
    )
    max_pending = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="The most requests waiting (pending) in the scope; empty: no limit.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant__name", "pool__name", "gpu_model"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(pool__isnull=False) & Q(gpu_model=""))
                | (Q(pool__isnull=True) & ~Q(gpu_model="")),
                name="tenantquota_one_scope",
            ),
            models.CheckConstraint(
                condition=Q(max_gpus__gte=0), name="tenantquota_max_gpus_not_negative"
            ),
            models.CheckConstraint(
                condition=Q(max_pending__isnull=True) | Q(max_pending__gte=0),
                name="tenantquota_max_pending_not_negative",
            ),
            models.UniqueConstraint(
                fields=["tenant", "pool"],
                condition=Q(pool__isnull=False),
                name="tenantquota_one_per_tenant_pool",
            ),
            models.UniqueConstraint(
                fields=["tenant", "gpu_model"],
                condition=~Q(gpu_model=""),
                name="tenantquota_one_per_tenant_model",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}'s quota {self.scope_words}"

    @property
    def scope_words(self) -> str:
        return f"in pool {self.pool.name}" if self.pool_id else f"on {self.gpu_model} GPUs"
