"""Reads for the VM pages: the VM lists, each VM with its open notice for the countdown a row
shows (from gpucap.notices) and why a pending one waits (from gpucap.plans), which is why these
reads live above rentals, notices and plans. Each in a
fixed number of queries. The reads of one VM are rentals' own (``gpucap.rentals.selectors``).
"""

from dataclasses import dataclass
from urllib.parse import urlencode

from django.core.paginator import Page, Paginator
from django.db.models import QuerySet

from gpucap.fleet.models import Node, Pool
from gpucap.notices.selectors import with_open_notice
from gpucap.plans.waiting import annotate_waiting
from gpucap.rentals.models import VirtualMachine
from gpucap.rentals.selectors import TRANSITIONAL, vms_with_gpus
from gpucap.tenancy.models import Tenant

State = VirtualMachine.State
PAGE_SIZE = 50


def vms_with_notices() -> QuerySet[VirtualMachine]:
    """``vms_with_gpus`` with each VM's open notice (``notice_reason``, ``notice_deadline``)."""
    return with_open_notice(vms_with_gpus())


# --- a tenant's VMs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TenantVms:
    vms: list[VirtualMachine]
    terminated_count: int
    include_terminated: bool
    job: str = ""  # only the VMs of this job

    @property
    def polling_fast(self) -> bool:
        return any(vm.state in TRANSITIONAL for vm in self.vms)

    @property
    def query(self) -> str:
        """The list's own query string ("?terminated=1&job=train-7"), "" when unfiltered."""
        query = {"terminated": "1"} if self.include_terminated else {}
        if self.job:
            query["job"] = self.job
        return f"?{urlencode(query)}" if query else ""


def tenant_vms(*, tenant: Tenant, include_terminated: bool = False, job: str = "") -> TenantVms:
    """A tenant's rentals, newest first; terminated ones only when asked for; only those of
    multi-VM job ``job`` when given. Inference replicas belong to their deployments and are
    shown there. Three queries, and two to four more when one of them is pending (why it
    waits)."""
    mine = {"tenant": tenant, "role": VirtualMachine.Role.RENTAL}
    if job:
        mine["job"] = job
    vms = vms_with_notices().filter(**mine).order_by("-created_at", "-id")
    terminated = VirtualMachine.objects.filter(**mine, state=State.TERMINATED)
    if not include_terminated:
        vms = vms.exclude(state=State.TERMINATED)
    return TenantVms(
        vms=annotate_waiting(list(vms)),
        terminated_count=terminated.count(),
        include_terminated=include_terminated,
        job=job,
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
    *,
    tenant: str = "",
    pool: str = "",
    state: str = LIVE,
    node: int | None = None,
    job: str = "",
    page=1,
) -> Page:
    """One page of VMs, newest first. ``tenant`` is a slug, ``pool`` a name, ``node`` an id,
    ``job`` a multi-VM job's name (of any tenant, unless ``tenant`` says which).
    Three queries (count, rows, GPUs), and two to four more when one of them is pending (why it
    waits)."""
    vms = vms_with_notices().order_by("-created_at", "-id")
    if tenant:
        vms = vms.filter(tenant__slug=tenant)
    if pool:
        vms = vms.filter(pool__name=pool)
    vms = vms.filter(state=state) if state else vms.exclude(state=State.TERMINATED)
    if node is not None:
        vms = vms.filter(node_id=node)
    if job:
        vms = vms.filter(job=job)
    result = Paginator(vms, PAGE_SIZE).get_page(page)
    result.object_list = annotate_waiting(list(result.object_list))
    return result
