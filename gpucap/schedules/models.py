"""Scheduled capacity policies: a capacity set's calendar of floors, rank orders and replica
ranges, and temporary overrides set from outside.

A `ScheduleEntry` is a weekly window (gpucap/schedules/calendar.py says how one reads) and the
values it sets while open; a `PolicyOverride` sets values until it expires. Both say what they
set as `PolicyChange` rows. What is in force is written, at each boundary, into the pools' and
deployments' ``scheduled_*`` columns (gpucap/schedules/services.py), in the transaction that
bumps the set's generation: the arbiter, the autoscaler and the pages read those.
"""

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from gpucap.fleet.models import CapacitySet, Pool
from gpucap.inference.models import InferenceDeployment


class ScheduleEntry(models.Model):
    """A named weekly window of a capacity set and what it sets while open."""

    capacity_set = models.ForeignKey(
        CapacitySet, on_delete=models.CASCADE, related_name="schedule_entries"
    )
    name = models.SlugField(max_length=64)
    days = ArrayField(
        models.PositiveSmallIntegerField(),
        help_text="Days the window starts on: 0 Monday .. 6 Sunday.",
    )
    start_time = models.TimeField()
    end_time = models.TimeField(
        help_text="At or before the start: the window crosses midnight and ends the next day."
    )
    time_zone = models.CharField(max_length=64, help_text="IANA time zone, e.g. America/New_York")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["capacity_set__name", "name"]
        verbose_name_plural = "schedule entries"
        constraints = [
            models.UniqueConstraint(
                fields=["capacity_set", "name"], name="schedule_entry_name_unique_in_set"
            ),
            models.CheckConstraint(
                condition=Q(days__len__gte=1) & Q(days__contained_by=[0, 1, 2, 3, 4, 5, 6]),
                name="schedule_entry_days_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.capacity_set.name}/{self.name}"


class PolicyOverride(models.Model):
    """Values set from outside (an API client: an external calendar, a capacity controller)
    until ``expires_at``; they win over the schedule while they last and expire by themselves."""

    capacity_set = models.ForeignKey(
        CapacitySet, on_delete=models.CASCADE, related_name="policy_overrides"
    )
    name = models.SlugField(max_length=64)
    starts_at = models.DateTimeField(null=True, blank=True, help_text="Empty: at once.")
    expires_at = models.DateTimeField()
    reason = models.CharField(max_length=200, blank=True)
    set_by = models.CharField(max_length=150, help_text="Who set it: a user name.")
    set_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["capacity_set__name", "expires_at", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["capacity_set", "name"], name="policy_override_name_unique_in_set"
            ),
            models.CheckConstraint(
                condition=Q(starts_at__isnull=True) | Q(starts_at__lt=models.F("expires_at")),
                name="policy_override_starts_before_expiry",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.capacity_set.name}/{self.name}"


class PolicyChange(models.Model):
    """One value an entry or an override sets: a pool's floor, a deployment's replica bound,
    or a pool's place in the rank order (``position``, 1 first)."""

    class Setting(models.TextChoices):
        FLOOR_GPUS = "floor_gpus", "Floor (GPUs)"
        MIN_REPLICAS = "min_replicas", "Minimum replicas"
        MAX_REPLICAS = "max_replicas", "Maximum replicas"
        RANK_ORDER = "rank_order", "Rank order"

    entry = models.ForeignKey(
        ScheduleEntry, null=True, blank=True, on_delete=models.CASCADE, related_name="changes"
    )
    override = models.ForeignKey(
        PolicyOverride, null=True, blank=True, on_delete=models.CASCADE, related_name="changes"
    )
    setting = models.CharField(max_length=16, choices=Setting.choices)
    pool = models.ForeignKey(
        Pool, null=True, blank=True, on_delete=models.CASCADE, related_name="policy_changes"
    )
    deployment = models.ForeignKey(
        InferenceDeployment,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="policy_changes",
    )
    value = models.PositiveIntegerField(null=True, blank=True)
    position = models.PositiveSmallIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.CheckConstraint(
                condition=Q(entry__isnull=False, override__isnull=True)
                | Q(entry__isnull=True, override__isnull=False),
                name="policy_change_one_owner",
            ),
            models.CheckConstraint(
                condition=(
                    Q(
                        setting="floor_gpus",
                        pool__isnull=False,
                        deployment__isnull=True,
                        value__isnull=False,
                        position__isnull=True,
                    )
                    | Q(
                        setting__in=["min_replicas", "max_replicas"],
                        pool__isnull=True,
                        deployment__isnull=False,
                        value__isnull=False,
                        position__isnull=True,
                    )
                    | Q(
                        setting="rank_order",
                        pool__isnull=False,
                        deployment__isnull=True,
                        value__isnull=True,
                        position__isnull=False,
                    )
                ),
                name="policy_change_shape",
            ),
        ]

    def __str__(self) -> str:
        target = self.pool or self.deployment
        return f"{self.setting} {target} {self.value if self.position is None else self.position}"


class AppliedPolicy(models.Model):
    """When `policy_apply` last ran for a set: the set's generation then and the next boundary
    it saw. Beat's pass (`policies_apply_due`) applies again only a set whose boundary has
    passed or whose generation moved since (a pool re-ranked, its floor moved): the rest have
    nothing new to put in force."""

    capacity_set = models.OneToOneField(
        CapacitySet, primary_key=True, on_delete=models.CASCADE, related_name="applied_policy"
    )
    applied_at = models.DateTimeField()
    generation = models.BigIntegerField()
    next_boundary = models.DateTimeField(
        help_text="Apply again from then: the next boundary, or a week on when none is known."
    )

    def __str__(self) -> str:
        return f"{self.capacity_set_id} at {self.applied_at:%Y-%m-%d %H:%M:%S}"
