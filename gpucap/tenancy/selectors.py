"""Reads for tenant pages. A tenant member sees only their own tenants; operators see all."""

from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count
from django.http import Http404

from gpucap.fleet.models import Gpu, Node, Pool
from gpucap.tenancy.models import Membership, Tenant
from gpucap.tenancy.roles import is_operator, tenant_ids_for


def tenants_for(user: AbstractBaseUser) -> list[Tenant]:
    """The tenants a user is a member of, by name. One query."""
    return list(Tenant.objects.filter(memberships__user=user).order_by("name"))


def tenant_visible_to(*, user: AbstractBaseUser, slug: str) -> Tenant:
    """The tenant, if the user may see it; otherwise 404 (another tenant's page does not
    exist as far as its outsiders can tell)."""
    tenants = Tenant.objects.all()
    if not is_operator(user):
        tenants = tenants.filter(pk__in=tenant_ids_for(user))
    tenant = tenants.filter(slug=slug).first()
    if tenant is None:
        raise Http404("No such tenant.")
    return tenant


@dataclass(frozen=True)
class PoolAccess:
    """A pool a tenant may use (its GPU model and fabric are the pool's own fields), with
    what backs it right now."""

    pool: Pool
    usable_gpus: int


@dataclass(frozen=True)
class TenantOverview:
    tenant: Tenant
    role: str  # "admin", "member", or "operator" for an operator looking in read-only
    members: list[Membership]
    member_count: int
    pools: list[PoolAccess]

    @property
    def read_only(self) -> bool:
        return self.role == "operator"


def tenant_overview(*, tenant: Tenant, user: AbstractBaseUser) -> TenantOverview:
    """The tenant's landing page: the viewer's role, its members (all of them for admins and
    operators, only yourself otherwise) and the pools it may use. Three queries."""
    memberships = list(tenant.memberships.select_related("user").order_by("user__username"))
    mine = next((m for m in memberships if m.user_id == user.pk), None)
    if mine is not None:
        role = mine.role
    elif is_operator(user):
        role = "operator"
    else:  # callers fetch the tenant through tenant_visible_to, so this is a programming error
        raise Http404("No such tenant.")
    visible = memberships if role in ("admin", "operator") else [mine]
    return TenantOverview(
        tenant=tenant,
        role=role,
        members=visible,
        member_count=len(memberships),
        pools=pool_access(tenant=tenant),
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
