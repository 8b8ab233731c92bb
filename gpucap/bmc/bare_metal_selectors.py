"""Reads of bare-metal rentals shared by the API and the pages: whose rentals a user sees, each
with its last power action, and what a rental may be re-imaged with. Each in a fixed number of
queries."""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from gpucap.bmc.models import (
    BareMetalImage,
    BareMetalPowerAction,
    BareMetalRental,
    Provisioning,
)
from gpucap.fleet.models import Node
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


@dataclass(frozen=True)
class Reimage:
    """A rental's latest re-image as its tenant reads it: the catalogue image's name, never
    its URL, and what happened without the BMC's address."""

    state: str  # the provisioning run's: inserting, booting, waiting, done, failed
    image: str
    started_at: datetime
    inserted_at: datetime | None
    reset_at: datetime | None
    deadline: datetime
    finished_at: datetime | None
    message: str

    @property
    def in_progress(self) -> bool:
        return self.state in Provisioning.ACTIVE

    @property
    def words(self) -> str:
        """Where it is, in the tenant's words."""
        if self.state == Provisioning.State.INSERTING:
            return "putting the image in the machine's virtual drive"
        if self.state == Provisioning.State.BOOTING:
            return "resetting the machine to boot from the image"
        if self.state == Provisioning.State.WAITING:
            return (
                f"installing: the machine booted from {self.image}; the image stays in its drive "
                f"until {self.deadline:%H:%M} UTC"
            )
        outcome = "done" if self.state == Provisioning.State.DONE else "failed"
        return f"{outcome}: {self.message}" if self.message else outcome


def with_reimage(rentals: Iterable[BareMetalRental]) -> list[BareMetalRental]:
    """The rentals, each with ``reimage``: its latest re-image (``Reimage``), or None. One
    query."""
    rentals = list(rentals)
    latest = (
        Provisioning.objects.filter(bare_metal_rental_id__in=[rental.pk for rental in rentals])
        .order_by("bare_metal_rental_id", "-started_at", "-id")
        .distinct("bare_metal_rental_id")
    )
    by_rental = {run.bare_metal_rental_id: run for run in latest}
    for rental in rentals:
        run = by_rental.get(rental.pk)
        rental.reimage = None if run is None else _tenant_view(run, rental)
    return rentals


def _tenant_view(run: Provisioning, rental: BareMetalRental) -> Reimage:
    image = rental.image.name if rental.image_id else "the image"
    if rental.image_id and run.image_url != rental.image.image_url:
        image = "an earlier image"
    return Reimage(
        state=run.state,
        image=image,
        started_at=run.started_at,
        inserted_at=run.inserted_at,
        reset_at=run.reset_at,
        deadline=run.deadline,
        finished_at=run.finished_at,
        message=tenant_safe(run.message, node=rental.node, image_url=run.image_url, image=image),
    )


def tenant_safe(text: str, *, node: Node, image_url: str, image: str) -> str:
    """``text`` (a provisioning run's message, in the BMC's words) without the BMC's address
    or the image's URL, which the tenant never sees."""
    address = (node.bmc_address or "").strip().rstrip("/")
    if address:
        url = address if "://" in address else f"https://{address}"
        text = text.replace(f"the BMC at {url}", "the machine's management controller")
        for shown in {url, address, urlsplit(url).netloc, urlsplit(url).hostname or ""} - {""}:
            text = text.replace(shown, "the management controller")
    return text.replace(image_url, image) if image_url else text


def catalogue_for(rentals: Iterable[BareMetalRental]) -> dict[int, list[BareMetalImage]]:
    """The enabled bare-metal images of each rental's cluster, by cluster id. One query."""
    cluster_ids = {rental.node.cluster_id for rental in rentals}
    images: dict[int, list[BareMetalImage]] = {cluster_id: [] for cluster_id in cluster_ids}
    for image in BareMetalImage.objects.filter(cluster_id__in=cluster_ids, enabled=True):
        images[image.cluster_id].append(image)
    return images


@dataclass(frozen=True)
class TenantMachines:
    """A tenant's machines page: its rentals under way (each with ``last_power``, ``reimage``
    and ``catalogue``, the images it may be re-imaged with), and its latest ended ones."""

    active: list[BareMetalRental]
    ended: list[BareMetalRental]

    @property
    def settling(self) -> bool:
        """Something is changing (a power action or a re-image under way, a power not read
        yet): the page polls faster."""
        return any(
            (rental.last_power is not None and rental.last_power.under_way)
            or (rental.reimage is not None and rental.reimage.in_progress)
            or rental.power_read_at is None
            for rental in self.active
        )


def tenant_machines(*, tenant: Tenant) -> TenantMachines:
    """Five queries: the rentals under way, the ended ones, their power actions and
    re-images, the catalogue."""
    rentals = BareMetalRental.objects.filter(tenant=tenant).select_related("node__cluster", "image")
    active = with_reimage(with_power(rentals.filter(ended_at=None).order_by("node__hostname")))
    ended = list(rentals.exclude(ended_at=None).order_by("-ended_at", "-id")[:ENDED_SHOWN])
    catalogue = catalogue_for(active)
    for rental in active:
        rental.catalogue = catalogue[rental.node.cluster_id]
    return TenantMachines(active=active, ended=ended)


def rented_node_ids() -> QuerySet:
    """The nodes rented whole now, as a subquery of node ids: they run their tenant's system,
    not a hypervisor, so nothing should expect one to answer there: the hypervisor watch does
    not probe them and recovery never power-cycles them (their power is the tenant's)."""
    return BareMetalRental.objects.filter(ended_at=None).values("node_id")
