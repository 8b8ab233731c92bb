"""Thin tasks: a set's reservations at a window boundary."""

from celery import shared_task
from django.utils import timezone

from gpucap.allocation import services


@shared_task(name="allocation.reservation_boundary")
def reservation_boundary(capacity_set_id: int) -> int:
    """A reservation of the set came into or went out of force (sent for that moment): the
    set is planned again and what borrowed from an ended one is no longer flagged. A lost
    task delays nothing long: every set is planned each ``PLANS_INTERVAL_SECONDS`` with the
    reservations in force then."""
    return services.reservations_boundary(capacity_set_id=capacity_set_id, now=timezone.now())
