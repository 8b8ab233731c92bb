"""Metered usage. The lifecycle opens an interval when a VM takes GPUs and closes it when it
releases them, so billing starts from complete data.

Billing receives usage records: one interval's GPU time within one period (``USAGE_PERIOD_SECONDS``,
an hour by default, aligned to midnight UTC). A record is made once its end is final (its
period is over or its interval has ended), so a record never changes after it is made, and its
``record_id`` is the same in every export and every webhook delivery.
"""

import operator
from functools import reduce

from django.db import models
from django.db.models import F, Q

from gpucap.fleet.models import Pool
from gpucap.tenancy.models import Tenant

# What GPU time usage counts, by kind: a VM's is its pool's kind (``Pool.Kind``); a whole
# machine rented to a tenant (``gpucap.bmc``'s ``BareMetalRental``) is ``bare_metal``, all of
# its GPUs held for the whole rental.
BARE_METAL = "bare_metal"
USAGE_KINDS = (*Pool.Kind.values, BARE_METAL)
KIND_LABELS = {**dict(Pool.Kind.choices), BARE_METAL: "Bare metal"}


class Allocation(models.TextChoices):
    """Whose capacity GPU time was on (``gpucap.usage.attribution``): billing prices each
    differently."""

    SHARED = "shared", "Shared"
    RESERVED = "reserved", "Reserved"
    BORROWED = "borrowed", "Borrowed"
    DEDICATED = "dedicated", "Dedicated"


class Attributed(models.Model):
    """The attribution an interval has and its records copy. Text, not foreign keys: a record
    keeps naming the reservation or node after either is deleted or renamed. Database
    defaults too, so a worker still running the previous release while this one deploys
    writes shared rows rather than failing."""

    allocation = models.CharField(
        max_length=16,
        choices=Allocation.choices,
        default=Allocation.SHARED,
        db_default=Allocation.SHARED,
    )
    commitment_id = models.CharField(
        max_length=64,
        blank=True,
        db_default="",
        help_text="Reserved: the reservation, reservation-<id>.",
    )
    commitment_name = models.CharField(
        max_length=200,
        blank=True,
        db_default="",
        help_text="Reserved: the reservation, <set>/<name>.",
    )
    borrowed_from = models.CharField(
        max_length=64,
        blank=True,
        db_default="",
        help_text="Borrowed: the reservation, reservation-<id>.",
    )
    dedicated_node = models.CharField(
        max_length=253, blank=True, db_default="", help_text="Dedicated: the node's hostname."
    )

    class Meta:
        abstract = True


# What each allocation carries; every other commitment field is empty (a database check).
CARRIES = {
    Allocation.SHARED: (),
    Allocation.RESERVED: ("commitment_id", "commitment_name"),
    Allocation.BORROWED: ("borrowed_from",),
    Allocation.DEDICATED: ("dedicated_node",),
}
COMMITMENT_FIELDS = ("commitment_id", "commitment_name", "borrowed_from", "dedicated_node")


def attribution_constraint(prefix: str) -> models.CheckConstraint:
    """Each allocation carries its commitment and nothing else (a shared row carries none)."""
    cases = []
    for allocation, carried in CARRIES.items():
        case = Q(allocation=allocation)
        for field in COMMITMENT_FIELDS:
            case &= ~Q(**{field: ""}) if field in carried else Q(**{field: ""})
        cases.append(case)
    return models.CheckConstraint(
        condition=reduce(operator.or_, cases), name=f"{prefix}_attribution_matches_allocation"
    )


def vm_or_rental_constraint(prefix: str, *, vm_fields=("vm",)) -> models.CheckConstraint:
    """A VM's GPU time (``vm_fields`` set) or a bare-metal rental's (``bare_metal_rental`` set,
    the VM's fields empty), never both, never neither."""
    vm = reduce(operator.and_, (Q(**{f"{field}__isnull": False}) for field in vm_fields))
    no_vm = reduce(operator.and_, (Q(**{f"{field}__isnull": True}) for field in vm_fields))
    return models.CheckConstraint(
        condition=(vm & Q(bare_metal_rental__isnull=True))
        | (no_vm & Q(bare_metal_rental__isnull=False)),
        name=f"{prefix}_vm_or_bare_metal_rental",
    )


class UsageInterval(Attributed):
    """A span during which a VM held GPUs under one attribution: the lifecycle opens and closes
    it (receivers), and ``services.usage_reattribute`` ends it where its attribution changes.
    Or the span of a bare-metal rental, a whole machine's GPUs held from its start to its end
    (kind ``bare_metal``, attributed ``dedicated`` to the node: it is its tenant's)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="usage_intervals")
    vm = models.ForeignKey(
        "rentals.VirtualMachine",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="usage_intervals",
    )
    bare_metal_rental = models.ForeignKey(
        "bmc.BareMetalRental",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="usage_intervals",
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
            # A rental has one interval, open or not: opened once, never again.
            models.UniqueConstraint(
                fields=["bare_metal_rental"], name="usage_one_interval_per_bare_metal_rental"
            ),
            vm_or_rental_constraint("usage_interval"),
            models.CheckConstraint(
                condition=Q(ended_at__isnull=True) | Q(ended_at__gte=F("started_at")),
                name="usage_ends_after_start",
            ),
            attribution_constraint("usage_interval"),
        ]

    def __str__(self) -> str:
        holder = self.vm if self.vm_id else f"bare-metal rental {self.bare_metal_rental_id}"
        return f"{holder} {self.gpu_count}x{self.gpu_model} from {self.started_at}"


class UsageRecord(Attributed):
    """One interval's GPU time within one period, final once made. ``id`` grows in the order
    records become visible (they are made under one advisory lock), so it is a safe cursor."""

    record_id = models.CharField(
        max_length=64, unique=True, help_text="Stable: iv<interval id>-<period start, UTC>."
    )
    interval = models.ForeignKey(UsageInterval, on_delete=models.PROTECT, related_name="records")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="usage_records")
    vm = models.ForeignKey(
        "rentals.VirtualMachine",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="usage_records",
    )
    bare_metal_rental = models.ForeignKey(
        "bmc.BareMetalRental",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="usage_records",
    )
    deployment = models.ForeignKey(
        "inference.InferenceDeployment",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="usage_records",
    )
    pool = models.ForeignKey(
        "fleet.Pool",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="usage_records",
    )
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
            attribution_constraint("usage_record"),
            vm_or_rental_constraint("usage_record", vm_fields=("vm", "pool")),
        ]

    def __str__(self) -> str:
        return self.record_id


# --- billing webhook ----------------------------------------------------------------------------


class BillingWebhook(models.Model):
    """Where usage records are pushed, and how far the receiver has accepted them. One row
    (id 1, a check constraint); ``services.billing_push`` is the only writer of the delivery
    state, ``services.billing_webhook_configure`` of the settings.

    ``cursor`` is the id of the last record the receiver accepted: records are made in id
    order, so everything above it is still to send. ``batch_first``..``batch_last`` is the batch
    being delivered; it stays fixed until the receiver accepts it, so a retry re-sends the same
    records under the same batch id. A pusher holds the lease (``lease_until``) while it POSTs,
    so two pushers never send a batch at once, and a pusher that dies frees it by expiry."""

    SINGLETON = 1

    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=200, help_text="Signs every delivery (HMAC-SHA256).")
    enabled = models.BooleanField(default=False)
    batch_size = models.PositiveIntegerField(default=500)
    cursor = models.BigIntegerField(
        default=0, help_text="Id of the last usage record the receiver accepted."
    )
    batch_first = models.BigIntegerField(null=True, blank=True)
    batch_last = models.BigIntegerField(null=True, blank=True)
    lease_token = models.UUIDField(null=True, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(id=1), name="billing_webhook_singleton"),
            models.CheckConstraint(
                condition=Q(batch_size__gte=1) & Q(batch_size__lte=5000),
                name="billing_webhook_batch_size_range",
            ),
            models.CheckConstraint(
                condition=Q(batch_first__isnull=True, batch_last__isnull=True)
                | Q(batch_first__gt=F("cursor"), batch_last__gte=F("batch_first")),
                name="billing_webhook_batch_after_cursor",
            ),
        ]

    def __str__(self) -> str:
        return f"billing webhook {self.url}"

    @property
    def batch_id(self) -> str | None:
        return f"{self.batch_first}-{self.batch_last}" if self.batch_last is not None else None


class BillingDelivery(models.Model):
    """One POST of one batch to the billing webhook, accepted or not."""

    webhook = models.ForeignKey(BillingWebhook, on_delete=models.CASCADE, related_name="deliveries")
    batch_id = models.CharField(max_length=64, help_text="<first record id>-<last record id>")
    first_record = models.BigIntegerField()
    last_record = models.BigIntegerField()
    record_count = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField(help_text="1 for a batch's first POST, 2 for its retry…")
    accepted = models.BooleanField(default=False)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    duration_ms = models.PositiveIntegerField()
    at = models.DateTimeField()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["-at", "-id"], name="billing_delivery_newest")]

    def __str__(self) -> str:
        outcome = "accepted" if self.accepted else "failed"
        return f"batch {self.batch_id} attempt {self.attempt} {outcome}"
