"""Reads for the pages that combine the apps around a tenant: its portal (VMs, deployments,
API keys, usage, the pools it may use) and the operators' list of every tenant with what it
runs. Each is written to a fixed number of queries."""

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, F, IntegerField, OuterRef, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from gpucap.allocation.models import Reservation
from gpucap.allocation.reservations import describe_when
from gpucap.allocation.selectors import (
    quotas_with_use,
    reservation_in_force,
    reservation_window,
    reservations_held,
)
from gpucap.bmc.models import BareMetalRental
from gpucap.fleet.models import Gpu, Node, Pool
from gpucap.inference.models import ApiKey, InferenceDeployment
from gpucap.inference.selectors import DeploymentList, tenant_deployments
from gpucap.notices.models import InterruptionNotice
from gpucap.notices.selectors import with_open_notice
from gpucap.plans.waiting import annotate_waiting
from gpucap.rentals.models import Allocation, VirtualMachine
from gpucap.rentals.selectors import TRANSITIONAL, vms_with_gpus
from gpucap.rentals.services import HOLDING
from gpucap.tenancy.models import Membership, Tenant
from gpucap.tenancy.selectors import viewer_role
from gpucap.usage.models import BARE_METAL, KIND_LABELS
from gpucap.usage.selectors import gpu_hours_by_pool_kind, month_bounds

# The portal shows this many VMs (open notices first, then the newest) and API keys (newest).
PORTAL_VMS = 10
PORTAL_KEYS = 20


@dataclass(frozen=True)
class PoolAccess:
    """A pool a tenant may use (its GPU model and fabric are the pool's own fields), with
    what backs it right now."""

    pool: Pool
    usable_gpus: int


# --- the portal: a tenant's home ---------------------------------------------------------------


@dataclass(frozen=True)
class UsageTotal:
    kind: str
    label: str
    gpu_hours: Decimal


@dataclass(frozen=True)
class PortalLive:
    """What the portal refreshes by polling: VMs, deployments and this month's GPU-hours."""

    vms: list[VirtualMachine]
    more_vms: bool  # the tenant has more live VMs than the portal shows
    deployments: DeploymentList
    usage: list[UsageTotal]
    month_start: datetime
    month_end: datetime

    @property
    def polling_fast(self) -> bool:
        return any(vm.state in TRANSITIONAL for vm in self.vms)

    @property
    def gpu_hours(self) -> Decimal:
        return sum((total.gpu_hours for total in self.usage), Decimal(0))


@dataclass(frozen=True)
class TenantPortal:
    tenant: Tenant
    role: str  # "admin", "member", or "operator" for an operator looking in read-only
    live: PortalLive
    keys: list[ApiKey]
    more_keys: bool
    pools: list[PoolAccess]
    member_count: int
    dedicated: list["DedicatedNode"]
    quotas: list = field(default_factory=list)  # (TenantQuota, QuotaUse): its quotas and use
    reservations: list["TenantReservation"] = field(default_factory=list)

    @property
    def read_only(self) -> bool:
        return self.role == "operator"

    @property
    def rents_machines(self) -> bool:
        """Some of its dedicated nodes are rented to it whole (its Machines page)."""
        return any(dedicated.rental_id for dedicated in self.dedicated)

    @property
    def is_admin(self) -> bool:
        return self.role == Membership.Role.ADMIN


def tenant_portal(*, tenant: Tenant, user: AbstractBaseUser, now: datetime | None = None):
    """A tenant's home: the viewer's role, the live part (`portal_live`), its API keys, the
    pools it may use, its dedicated nodes, its quotas with their use, its reservations and how
    many members it has. A fixed number of queries (thirteen, one more with a quota, one more
    with a reservation) and one Redis round trip, whatever the number of VMs, deployments,
    keys, pools, nodes, quotas or reservations."""
    keys = list(
        ApiKey.objects.filter(tenant=tenant)
        .select_related("deployment")
        .order_by("-created_at", "-id")[: PORTAL_KEYS + 1]
    )
    return TenantPortal(
        tenant=tenant,
        role=viewer_role(tenant=tenant, user=user),
        live=portal_live(tenant=tenant, now=now),
        keys=keys[:PORTAL_KEYS],
        more_keys=len(keys) > PORTAL_KEYS,
        pools=pool_access(tenant=tenant),
        member_count=tenant.memberships.count(),
        dedicated=dedicated_nodes(tenant=tenant),
        quotas=quotas_with_use(tenant_ids=[tenant.pk]),
        reservations=tenant_reservations(tenant=tenant, now=now),
    )


def portal_live(*, tenant: Tenant, now: datetime | None = None) -> PortalLive:
    """The tenant's live VMs (open notices first, then the newest), its deployments with
    replica counts and load, and this month's GPU-hours per pool kind. Four queries (two to
    four more when a VM is pending: why it waits) and one Redis round trip."""
    now = now or timezone.now()
    vms = list(
        with_open_notice(vms_with_gpus())
        .filter(tenant=tenant, role=VirtualMachine.Role.RENTAL)
        .exclude(state=VirtualMachine.State.TERMINATED)
        .order_by(F("notice_deadline").asc(nulls_last=True), "-created_at", "-id")[: PORTAL_VMS + 1]
    )
    since, until = month_bounds(now)
    hours = gpu_hours_by_pool_kind(tenant_id=tenant.pk, since=since, until=until, now=now)
    return PortalLive(
        vms=annotate_waiting(vms[:PORTAL_VMS]),
        more_vms=len(vms) > PORTAL_VMS,
        deployments=tenant_deployments(tenant=tenant),
        usage=[
            UsageTotal(kind, label, hours.get(kind, Decimal(0)))
            for kind, label in KIND_LABELS.items()
            # Bare metal only for a tenant that rents machines whole.
            if kind != BARE_METAL or hours.get(kind)
        ],
        month_start=since,
        month_end=until,
    )


# --- every tenant (operators) -----------------------------------------------------------------


def _count(queryset: QuerySet, field: str = "tenant") -> Coalesce:
    """A per-tenant count as a subquery, so several counts never multiply each other's rows."""
    counted = queryset.order_by().values(field).annotate(n=Count("pk")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


def tenant_list() -> list[Tenant]:
    """Every tenant by name with ``vm_count`` (rentals that still exist), ``gpu_count`` (GPUs
    its VMs hold now), ``deployment_count``, ``notice_count`` (open notices) and
    ``member_count``. One query."""
    here = OuterRef("pk")
    rentals = VirtualMachine.objects.filter(tenant=here, role=VirtualMachine.Role.RENTAL)
    return list(
        Tenant.objects.annotate(
            vm_count=_count(rentals.exclude(state=VirtualMachine.State.TERMINATED)),
            gpu_count=_count(
                Allocation.objects.filter(vm__tenant=here, released_at=None), "vm__tenant"
            ),
            deployment_count=_count(InferenceDeployment.objects.filter(tenant=here)),
            notice_count=_count(
                InterruptionNotice.objects.filter(vm__tenant=here, completed_at=None),
                "vm__tenant",
            ),
            member_count=_count(Membership.objects.filter(tenant=here)),
        ).order_by("name")
    )


def pool_access(*, tenant: Tenant) -> list[PoolAccess]:
    """The pools a tenant may use. A pool in a capacity set is backed by the set's nodes; a
    standalone pool by its cluster's standalone nodes of the GPU model and fabric it rents.
    ``usable_gpus`` counts healthy GPUs on ready nodes there (free or not: allocations come
    with VMs). Two queries."""
    pools = list(
        tenant.pools.select_related("cluster", "capacity_set").order_by(
            "cluster__name", "capacity_set__name", "rank"
        )
    )
    cluster_ids = {pool.cluster_id for pool in pools}
    # A set's nodes all have the set's model and fabric, which its pools rent; so one key
    # serves both kinds of pool.
    usable: dict[tuple[int, int | None, str, str], int] = {
        (
            row["node__cluster_id"],
            row["node__capacity_set_id"],
            row["node__gpu_model"],
            row["node__fabric"],
        ): row["n"]
        for row in Gpu.objects.filter(
            node__cluster_id__in=cluster_ids, node__state=Node.State.READY, health=Gpu.Health.OK
        )
        .values("node__cluster_id", "node__capacity_set_id", "node__gpu_model", "node__fabric")
        .annotate(n=Count("id"))
        .order_by()
    }
    return [
        PoolAccess(
            pool=pool,
            usable_gpus=usable.get(
                (pool.cluster_id, pool.capacity_set_id, pool.gpu_model, pool.fabric), 0
            ),
        )
        for pool in pools
    ]


# --- a tenant's dedicated nodes ----------------------------------------------------------------


@dataclass(frozen=True)
class DedicatedNode:
    """A whole node given to a tenant, with the tenant's VMs on it. Other tenants' VMs still
    leaving it are counted, never named (a tenant sees only its own)."""

    node: Node
    vms: list[VirtualMachine]
    others_leaving: int  # other tenants' VMs still holding GPUs here
    others_gpus: int  # and their GPUs
    rental_id: int | None = None  # rented whole to the tenant as bare metal (gpucap.bmc)

    @property
    def free_gpus(self) -> int:
        return self.node.gpu_count - sum(vm.gpu_count for vm in self.vms) - self.others_gpus


def dedicated_nodes(*, tenant: Tenant) -> list[DedicatedNode]:
    """The nodes dedicated to ``tenant`` by hostname, each with the tenant's VMs holding its
    GPUs and how many other tenants' VMs still hold some (a dedication waiting for them).
    Two queries."""
    holding = VirtualMachine.objects.filter(node=OuterRef("pk"), state__in=HOLDING).exclude(
        tenant=tenant
    )
    nodes = list(
        Node.objects.filter(dedicated_tenant=tenant)
        .select_related("cluster", "capacity_set")
        .annotate(
            others=_count(holding, "node"),
            others_gpus=Coalesce(
                Subquery(
                    holding.order_by().values("node").annotate(n=Sum("gpu_count")).values("n"),
                    output_field=IntegerField(),
                ),
                Value(0),
            ),
            rental_id=Subquery(
                BareMetalRental.objects.filter(node=OuterRef("pk"), ended_at=None).values("pk")
            ),
        )
        .order_by("hostname")
    )
    vms: dict[int, list[VirtualMachine]] = {node.pk: [] for node in nodes}
    for vm in (
        VirtualMachine.objects.filter(tenant=tenant, node_id__in=vms, state__in=HOLDING)
        .select_related("pool")
        .order_by("name", "pk")
    ):
        vms[vm.node_id].append(vm)
    return [
        DedicatedNode(
            node=node,
            vms=vms[node.pk],
            others_leaving=node.others,
            others_gpus=node.others_gpus,
            rental_id=node.rental_id,
        )
        for node in nodes
    ]


# --- a tenant's reservations -------------------------------------------------------------------


@dataclass(frozen=True)
class TenantReservation:
    """A reservation as its tenant sees it: never who borrows it (other tenants' VMs)."""

    reservation: Reservation
    when: str
    in_force: bool
    held_gpus: int


def tenant_reservations(*, tenant: Tenant, now: datetime | None = None) -> list[TenantReservation]:
    """The GPUs kept for ``tenant`` in each capacity set, when, and how many it holds inside
    now. One query, two with a reservation."""
    now = now or timezone.now()
    rows = list(
        Reservation.objects.filter(tenant=tenant)
        .select_related("capacity_set")
        .order_by("capacity_set__name", "name")
    )
    held = reservations_held([row.pk for row in rows]) if rows else {}
    return [
        TenantReservation(
            reservation=row,
            when=describe_when(reservation_window(row)),
            in_force=reservation_in_force(row, now),
            held_gpus=held[row.pk],
        )
        for row in rows
    ]
