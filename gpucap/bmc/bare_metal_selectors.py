"""Reads of bare-metal rentals shared by the API and the pages: whose rentals a user sees, each
with its last power action, and what a rental may be re-imaged with. Each in a fixed number of
queries."""

from collections.abc import Iterable
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from gpucap.bmc.models import BareMetalImage, BareMetalPowerAction, BareMetalRental
from gpucap.roles import is_operator, tenant_ids_for
from gpucap.tenancy.models import Tenant

# The tenant's page lists its rentals under way and this many of its ended ones.
ENDED_SHOWN = 5


def rentals_visible_to(user: AbstractBaseUser | AnonymousUser) -> QuerySet[BareMetalRental]:
    """Every rental for operators; a member's own tenants' rentals otherwise (anyone else's id
    is not found)."""
    rentals = BareMetalRental.objects.select_related("node__cluster", "tenant", "image")
    if is_operator(user):
        return rentals.select_related("started_by", "ended_by")
    return rentals.filter(tenant_id__in=tenant_ids_for(user))


def with_power(rentals: Iterable[BareMetalRental]) -> list[BareMetalRental]:
    """The rentals, each with ``last_power``: its newest power action, or None. One query."""
    rentals = list(rentals)
    latest = (
        BareMetalPowerAction.objects.filter(rental_id__in=[rental.pk for rental in rentals])
        .order_by("rental_id", "-requested_at", "-id")
        .distinct("rental_id")
    )
    by_rental = {power.rental_id: power for power in latest}
    for rental in rentals:
        rental.last_power = by_rental.get(rental.pk)
    return rentals


def catalogue_for(rentals: Iterable[BareMetalRental]) -> dict[int, list[BareMetalImage]]:
    """The enabled bare-metal images of each rental's cluster, by cluster id. One query."""
    cluster_ids = {rental.node.cluster_id for rental in rentals}
    images: dict[int, list[BareMetalImage]] = {cluster_id: [] for cluster_id in cluster_ids}
    for image in BareMetalImage.objects.filter(cluster_id__in=cluster_ids, enabled=True):
        images[image.cluster_id].append(image)
    return images


@dataclass(frozen=True)
class TenantMachines:
    """A tenant's machines page: its rentals under way (each with ``last_power`` and
    ``catalogue``, the images it may be re-imaged with), and its latest ended ones."""

    active: list[BareMetalRental]
    ended: list[BareMetalRental]

    @property
    def settling(self) -> bool:
        """Something is changing (a power action under way, a power not read yet): the page
        polls faster."""
        return any(
            (rental.last_power is not None and rental.last_power.under_way)
            or rental.power_read_at is None
            for rental in self.active
        )


def tenant_machines(*, tenant: Tenant) -> TenantMachines:
    """Four queries: the rentals under way, the ended ones, their power actions, the
    catalogue."""
    rentals = BareMetalRental.objects.filter(tenant=tenant).select_related("node__cluster", "image")
    active = with_power(rentals.filter(ended_at=None).order_by("node__hostname"))
    ended = list(rentals.exclude(ended_at=None).order_by("-ended_at", "-id")[:ENDED_SHOWN])
    catalogue = catalogue_for(active)
    for rental in active:
        rental.catalogue = catalogue[rental.node.cluster_id]
    return TenantMachines(active=active, ended=ended)


def rented_node_ids() -> set[int]:
    """The nodes rented whole now: they run their tenant's system, not a hypervisor, so
    nothing should expect one to answer there (recovery's probe skips them)."""
    return set(BareMetalRental.objects.filter(ended_at=None).values_list("node_id", flat=True))
