"""Reads of VMs for pages and the API, each in a fixed number of queries.

A tenant member sees the VMs of their own tenants and nothing else: another tenant's VM id is
a 404, as if it did not exist. Operators see every VM.
"""

import re
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Case, Count, IntegerField, OuterRef, Prefetch, QuerySet, Subquery, When
from django.http import Http404

from gpucap.audit.models import AuditEvent
from gpucap.audit.selectors import events_for
from gpucap.fleet.models import Image, Pool
from gpucap.rentals.models import Allocation, VirtualMachine
from gpucap.rentals.services import HOLDING, TRANSITIONS
from gpucap.roles import is_operator, tenant_ids_for
from gpucap.tenancy.models import Membership, Tenant

State = VirtualMachine.State

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
    vms = with_login_user(VirtualMachine.objects.select_related("tenant", "pool", "node__cluster"))
    vms = with_job_place(vms)
    return vms.prefetch_related(Prefetch("allocations", queryset=live, to_attr="live_allocations"))


def with_job_place(vms: QuerySet[VirtualMachine]) -> QuerySet[VirtualMachine]:
    """``vms`` with each one's place in its multi-VM job, read in the same query, for "job
    train-7, VM 2 of 4": ``job_size``, how many of the job's VMs are not terminated, and
    ``job_position``, the VM's rank among them by age (1 for the first). None for a VM that is
    in no job, and ``job_position`` None for a terminated one."""
    mates = (
        VirtualMachine.objects.filter(tenant_id=OuterRef("tenant_id"), job=OuterRef("job"))
        .exclude(job="")
        .exclude(state=State.TERMINATED)
        .order_by()
        .values("tenant_id")
    )
    size = mates.annotate(n=Count("pk")).values("n")
    position = mates.filter(pk__lte=OuterRef("pk")).annotate(n=Count("pk")).values("n")
    return vms.annotate(
        job_size=Subquery(size, output_field=IntegerField()),
        job_position=Case(
            When(job="", then=None),
            When(state=State.TERMINATED, then=None),
            default=Subquery(position, output_field=IntegerField()),
        ),
    )


def gpu_holders(*, node_id: int) -> dict[int, VirtualMachine]:
    """The VM holding each GPU of a node now, by GPU index, with its tenant and pool (and the
    pool's deployment, for a replica). One query; a free GPU has no entry."""
    live = (
        Allocation.objects.filter(gpu__node_id=node_id, released_at=None)
        .select_related("gpu", "vm__tenant", "vm__pool", "vm__deployment")
        .order_by("gpu__index")
    )
    return {allocation.gpu.index: allocation.vm for allocation in live}


def with_login_user(vms: QuerySet[VirtualMachine]) -> QuerySet[VirtualMachine]:
    """``vms`` with each one's ``login_user``: its catalogue image's default user (None without
    one), read in the same query, for ``vm_login_user``."""
    image = Image.objects.filter(cluster_id=OuterRef("pool__cluster_id"), name=OuterRef("image"))
    return vms.annotate(login_user=Subquery(image.values("default_user")[:1]))


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


def vm_ssh_command(vm: VirtualMachine) -> str:
    """What the tenant types to log in (``ssh root@10.200.0.18``), while the guest runs and
    has an address; "" otherwise."""
    if not vm.ip_address or vm.state not in (State.RUNNING, State.NOTIFIED):
        return ""
    return f"ssh {vm_login_user(vm)}@{vm.ip_address}"


def gpu_indices(vm: VirtualMachine) -> list[int]:
    """The GPU indices a VM loaded through ``vms_with_gpus`` holds now."""
    return [allocation.gpu.index for allocation in vm.live_allocations]


def requestable_pools(*, tenant: Tenant) -> QuerySet[Pool]:
    """Pools the tenant may rent VMs in: those it may use, except inference pools (their VMs
    are a deployment's replicas)."""
    return tenant.pools.exclude(kind=Pool.Kind.INFERENCE).order_by(
        "cluster__name", "capacity_set__name", "rank"
    )


# --- one VM -----------------------------------------------------------------------------------


def image_for(vm: VirtualMachine) -> Image | None:
    """The catalogue image a VM runs: the image of its pool's cluster that it names (enabled or
    not: a disabled image keeps its VMs), or None when the catalogue no longer has it. One
    query."""
    return (
        Image.objects.filter(cluster__pools=vm.pool_id, name=vm.image)
        .select_related("cluster")
        .first()
    )


def vm_login_user(vm: VirtualMachine) -> str:
    """Who the tenant logs in as: the image's default user, "root" without a catalogue image.
    A VM loaded ``with_login_user`` answers without a query."""
    if hasattr(vm, "login_user"):
        return vm.login_user or "root"
    image = image_for(vm)
    return image.default_user if image is not None else "root"


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
        # A VM holding GPUs may go back to pending only as a spot VM resuming (preempted,
        # reclaimed or its host lost), never by its owner's hand.
        start=State.PENDING in legal and vm.state not in HOLDING,
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
        if event.actor_id not in members:
            event.message = tenant_safe_words(event.message, vm=vm, verb=event.verb)
        event.changes = [c for c in event.changes if c.field not in OTHER_TENANTS_FIELDS]
    return events


# What a VM's audit events may record of another tenant's VM: the one its GPUs went to.
OTHER_TENANTS_FIELDS = frozenset({"preempted_for"})

_ARBITER = re.compile(r"^plan \d+: ")
_INSTANCE_ID = re.compile(r"\bvm-\d+\b")
_ARBITER_WORDS = {
    "vm.notified": "reclaimed by the capacity arbiter for a higher-priority pool",
    "notice.arbiter": "reclaimed by the capacity arbiter for a higher-priority pool",
    "vm.stopping": "stopped by the capacity arbiter for a higher-priority pool",
    "vm.provisioning": "placed by the capacity arbiter",
}


def tenant_safe_words(message: str, *, vm: VirtualMachine, verb: str) -> str:
    """A system's or operator's words about ``vm`` as its tenant may read them: the arbiter's
    reasons (which name the VM and pool it reclaims for, and the pools' totals) in plain words,
    a standalone preemption without its beneficiary, an operator without their username, and
    any other VM's id as "another VM"."""
    if _ARBITER.match(message):
        return _ARBITER_WORDS.get(verb, "changed by the capacity arbiter")
    if message.startswith("preempted without notice for "):
        return "preempted without notice for a higher-priority pool outside a capacity set"
    if message.startswith("reclaimed by "):
        return "reclaimed by an operator"
    own = vm.instance_id
    return _INSTANCE_ID.sub(lambda m: m.group(0) if m.group(0) == own else "another VM", message)
