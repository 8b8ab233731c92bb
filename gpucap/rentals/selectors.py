"""Reads of VMs for pages and the API, each in a fixed number of queries.

A tenant member sees the VMs of their own tenants and nothing else: another tenant's VM id is
a 404, as if it did not exist. Operators see every VM.
"""

from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.core.paginator import Page, Paginator
from django.db.models import OuterRef, Prefetch, QuerySet, Subquery
from django.http import Http404

from gpucap.audit.models import AuditEvent
from gpucap.audit.selectors import events_for
from gpucap.fleet.models import Node, Pool
from gpucap.notices.models import InterruptionNotice
from gpucap.rentals.models import Allocation, VirtualMachine
from gpucap.rentals.services import TRANSITIONS
from gpucap.roles import is_operator, tenant_ids_for
from gpucap.tenancy.models import Membership, Tenant

State = VirtualMachine.State
PAGE_SIZE = 50

# States a page keeps polling quickly for: something is about to change on its own.
TRANSITIONAL = frozenset({State.PENDING, State.PROVISIONING, State.NOTIFIED, State.STOPPING})


def vms_with_gpus() -> QuerySet[VirtualMachine]:
    """VMs with what a row shows: tenant, pool, node, and the GPUs each holds now
    (``live_allocations``, by GPU index). Two queries (rows, GPUs) for any number of rows."""
    live = (
        Allocation.objects.filter(released_at=None)
        .select_related("gpu")
        .only("vm_id", "gpu__index", "gpu__uuid", "gpu__pci_address")
        .order_by("gpu__index")
    )
    vms = VirtualMachine.objects.select_related("tenant", "pool", "node__cluster")
    # The open notice's reason and deadline (``notice_reason``, ``notice_deadline``, else None)
    # ride along in the same query, for the countdown a row shows.
    open_notice = InterruptionNotice.objects.filter(vm=OuterRef("pk"), completed_at=None)
    vms = vms.annotate(
        notice_reason=Subquery(open_notice.values("reason")[:1]),
        notice_deadline=Subquery(open_notice.values("deadline")[:1]),
    )
    return vms.prefetch_related(Prefetch("allocations", queryset=live, to_attr="live_allocations"))


def vms_visible_to(user: AbstractBaseUser) -> QuerySet[VirtualMachine]:
    """Every VM for operators; the VMs of the user's tenants for everyone else."""
    vms = vms_with_gpus()
    if is_operator(user):
        return vms
    return vms.filter(tenant_id__in=tenant_ids_for(user))


def vm_visible_to(*, user: AbstractBaseUser, pk: int) -> VirtualMachine:
    """One VM the user may see, or 404 (never 403: outsiders must not learn it exists)."""
    vm = vms_visible_to(user).select_related("created_by", "deployment").filter(pk=pk).first()
    if vm is None:
        raise Http404("No such VM.")
    return vm


def gpu_indices(vm: VirtualMachine) -> list[int]:
    """The GPU indices a VM loaded through ``vms_with_gpus`` holds now."""
    return [allocation.gpu.index for allocation in vm.live_allocations]


# --- a tenant's VMs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TenantVms:
    vms: list[VirtualMachine]
    terminated_count: int
    include_terminated: bool

    @property
    def polling_fast(self) -> bool:
        return any(vm.state in TRANSITIONAL for vm in self.vms)


def tenant_vms(*, tenant: Tenant, include_terminated: bool = False) -> TenantVms:
    """A tenant's rentals, newest first; terminated ones only when asked for. Inference
    replicas belong to their deployments and are shown there. Three queries."""
    mine = {"tenant": tenant, "role": VirtualMachine.Role.RENTAL}
    vms = vms_with_gpus().filter(**mine).order_by("-created_at", "-id")
    terminated = VirtualMachine.objects.filter(**mine, state=State.TERMINATED)
    if not include_terminated:
        vms = vms.exclude(state=State.TERMINATED)
    return TenantVms(
        vms=list(vms),
        terminated_count=terminated.count(),
        include_terminated=include_terminated,
    )


def requestable_pools(*, tenant: Tenant) -> QuerySet[Pool]:
    """Pools the tenant may rent VMs in: those it may use, except inference pools (their VMs
    are a deployment's replicas)."""
    return tenant.pools.exclude(kind=Pool.Kind.INFERENCE).order_by(
        "cluster__name", "capacity_set__name", "rank"
    )


# --- every VM (operators) ---------------------------------------------------------------------

# The operator list's state filter: "" shows every VM that still exists, "terminated" the rest.
LIVE = ""


@dataclass(frozen=True)
class VmFilterOptions:
    tenants: list[tuple[str, str]]  # (slug, name)
    pools: list[str]
    nodes: list[tuple[int, str]]  # (id, "cluster/hostname") of nodes that hold or held a VM


def vm_filter_options() -> VmFilterOptions:
    """Three queries."""
    nodes = (
        Node.objects.filter(pk__in=VirtualMachine.objects.values("node_id"))
        .select_related("cluster")
        .only("hostname", "cluster__name")
        .order_by("cluster__name", "hostname")
    )
    return VmFilterOptions(
        tenants=list(Tenant.objects.order_by("name").values_list("slug", "name")),
        pools=list(Pool.objects.order_by("name").values_list("name", flat=True)),
        nodes=[(node.pk, f"{node.cluster.name}/{node.hostname}") for node in nodes],
    )


def vm_page(
    *, tenant: str = "", pool: str = "", state: str = LIVE, node: int | None = None, page=1
) -> Page:
    """One page of VMs, newest first. ``tenant`` is a slug, ``pool`` a name, ``node`` an id.
    Three queries (count, rows, GPUs)."""
    vms = vms_with_gpus().order_by("-created_at", "-id")
    if tenant:
        vms = vms.filter(tenant__slug=tenant)
    if pool:
        vms = vms.filter(pool__name=pool)
    vms = vms.filter(state=state) if state else vms.exclude(state=State.TERMINATED)
    if node is not None:
        vms = vms.filter(node_id=node)
    result = Paginator(vms, PAGE_SIZE).get_page(page)
    result.object_list = list(result.object_list)
    return result


# --- one VM -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class VmActions:
    """What the owner (or an operator) may do with a VM now, from the lifecycle's own table of
    legal moves, so a button is never offered for a move the service would refuse."""

    stop: bool
    start: bool
    terminate: bool

    @property
    def any(self) -> bool:
        return self.stop or self.start or self.terminate


def vm_actions(vm: VirtualMachine) -> VmActions:
    if vm.role == VirtualMachine.Role.INFERENCE_REPLICA:
        return VmActions(stop=False, start=False, terminate=False)  # its deployment decides
    legal = TRANSITIONS[vm.state]
    return VmActions(
        stop=State.STOPPING in legal,
        # A stopping VM may go back to pending, but only as a preempted spot VM resuming.
        start=State.PENDING in legal and vm.state != State.STOPPING,
        terminate=vm.state != State.TERMINATED
        and vm.stop_reason != VirtualMachine.StopReason.TERMINATE,
    )


def vm_trail(*, vm: VirtualMachine, user: AbstractBaseUser, limit: int = 100) -> list[AuditEvent]:
    """The VM's audit events, newest first. Operators see who did what; a tenant member sees
    their own tenant's members by name and anyone else as "operator" (or "system"). Two
    queries for a member, one for an operator."""
    events = events_for(vm, limit=limit)
    if is_operator(user):
        return events
    members = set(
        Membership.objects.filter(tenant_id=vm.tenant_id).values_list("user_id", flat=True)
    )
    for event in events:
        if event.actor_id is not None and event.actor_id not in members:
            event.actor_label = "operator"
    return events
