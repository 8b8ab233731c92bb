"""Thin tasks: a set's schedule applied at a boundary, and beat's pass over every set."""

from celery import shared_task
from django.utils import timezone

from gpucap.fleet.models import CapacitySet
from gpucap.schedules import services


@shared_task(name="schedules.apply")
def apply(capacity_set_id: int) -> int:
    """Put in force what the set's schedule says now (sent for the moment of a boundary)."""
    capacity_set = CapacitySet.objects.filter(pk=capacity_set_id).first()
    if capacity_set is None:
        return 0
    return len(services.policy_apply(capacity_set=capacity_set, now=timezone.now()))


@shared_task(name="schedules.apply_due")
def apply_due() -> int:
    """Beat's safety net: a boundary whose task was lost is applied at most one interval late."""
    return services.policies_apply_due()
