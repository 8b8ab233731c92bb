"""Tenant allocation (issue #19): what a tenant may hold of the fleet (quotas) and what is
kept for it (reservations).

The app sits between the fleet and the rentals (see .importlinter): a quota names a pool of
the fleet, and ``vm_request`` (gpucap/rentals) and the snapshot (gpucap/plans) read quotas;
a reservation names a capacity set, and the snapshot carries those in force to the arbiter.
"""

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Mod
from django.db.models.lookups import Exact

from gpucap.fleet.models import CapacitySet, Pool
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


class Reservation(models.Model):
    """GPUs of a capacity set kept for a tenant, in blocks (whole partitions of ``block_gpus``),
    always or during one weekly window (read as the schedules' windows are:
    gpucap/schedules/calendar.py). While it is in force the arbiter keeps that capacity for
    the tenant; other tenants' spot VMs may borrow what the tenant does not use, and are
    reclaimed when it claims it."""

    BLOCK_SIZES = (1, 2, 4, 8)

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="reservations")
    capacity_set = models.ForeignKey(
        CapacitySet, on_delete=models.CASCADE, related_name="reservations"
    )
    name = models.SlugField(max_length=64)
    gpus = models.PositiveIntegerField(help_text="GPUs kept: a whole number of blocks.")
    block_gpus = models.PositiveSmallIntegerField(
        help_text="GPUs per block (1, 2, 4 or 8): each block is kept on one partition."
    )
    always = models.BooleanField(
        default=False, help_text="In force at all times; otherwise during its weekly window."
    )
    days = ArrayField(
        models.PositiveSmallIntegerField(),
        blank=True,
        default=list,
        help_text="Days the window starts on: 0 Monday .. 6 Sunday (empty when always).",
    )
    start_time = models.TimeField(null=True, blank=True)
    end_time = models.TimeField(
        null=True,
        blank=True,
        help_text="At or before the start: the window crosses midnight and ends the next day.",
    )
    time_zone = models.CharField(
        max_length=64, blank=True, help_text="IANA time zone, e.g. America/New_York"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["capacity_set__name", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["capacity_set", "name"], name="reservation_name_unique_in_set"
            ),
            models.CheckConstraint(condition=Q(gpus__gte=1), name="reservation_gpus_positive"),
            models.CheckConstraint(
                condition=Q(block_gpus__in=[1, 2, 4, 8]), name="reservation_block_size_valid"
            ),
            models.CheckConstraint(
                condition=Exact(Mod(F("gpus"), F("block_gpus")), 0),
                name="reservation_gpus_whole_blocks",
            ),
            models.CheckConstraint(
                condition=Q(
                    always=True,
                    days__len=0,
                    start_time__isnull=True,
                    end_time__isnull=True,
                    time_zone="",
                )
                | (
                    Q(always=False, start_time__isnull=False, end_time__isnull=False)
                    & Q(days__len__gte=1)
                    & Q(days__contained_by=[0, 1, 2, 3, 4, 5, 6])
                    & ~Q(time_zone="")
                ),
                name="reservation_always_or_one_window",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.capacity_set.name}/{self.name}"
