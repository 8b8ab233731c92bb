"""Drains and reclaims (DESIGN.md section 4): an operator empties a node, a whole capacity set,
or takes back one rental, and the guests get a notice first.

A drain moves the node to ``draining`` (no new placements) and gives every running spot VM and
inference replica on it a ``drain`` notice. On-demand VMs are never stopped by a drain: it waits
for them, and ``gpucap.notices.selectors.drain_blockers`` shows who holds it up. When no VM holds
a GPU of the node any more it ends ``cordoned``: checked whenever a VM lets go of its GPUs
(``gpucap.notices.receivers``, on ``vm_transitioned``) and by the periodic sweep, which also
warns VMs that were still booting when the drain began. Cancelling a drain is an uncordon;
notices already sent keep their deadlines. Running any of this twice is harmless.

A failed card is drained on its own (``gpu_failed_warn``, on the fleet's ``gpu_failed``): every
running VM holding it gets a ``drain`` notice and is stopped at the deadline, on-demand VMs
included, unlike a node drain: their card is broken, so waiting for them helps nobody. The sweep
also warns a VM that was still booting on the card when it failed.
"""

from django.db import transaction

from gpucap.audit.services import Actor, audit_record
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet, Gpu, Node, Pool
from gpucap.notices.models import InterruptionNotice
from gpucap.notices.services import notice_issue
from gpucap.rentals.models import VirtualMachine
from gpucap.rentals.services import HOLDING

NodeState = Node.State
# Pools whose VMs a drain interrupts; on-demand VMs are waited for.
DRAINED_KINDS = (Pool.Kind.SPOT, Pool.Kind.INFERENCE)


@transaction.atomic
def node_drain(*, node: Node, actor: Actor, message: str = "") -> Node:
    """Start draining ``node`` (or, if it drains already, warn the VMs not warned yet)."""
    # No key: a placement committing on the node must not wait for us (fleet's node_set_state).
    locked = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    if locked.state == NodeState.DOWN:
        raise Conflict(
            f"node {locked.hostname} is down: no guest on it can be warned. Mark it up (it "
            "comes back cordoned) before draining it",
            code="node_down",
        )
    reason = message or f"node {locked.hostname} is being drained"
    if locked.state == NodeState.DRAINING:
        audit_record(
            actor=actor, verb="node.drain", target=locked, message="drain repeated: " + reason
        )
    else:
        locked = fleet.node_set_state(
            node=locked, state=NodeState.DRAINING, actor=actor, message=reason
        )
    _warn_drained_vms(locked, actor=actor, message=reason)
    node_drain_finish(node_id=locked.pk)
    locked.refresh_from_db()
    return locked


@transaction.atomic
def capacity_set_drain(*, capacity_set: CapacitySet, actor: Actor) -> list[Node]:
    """Drain every node of a set (a down node has no guest to warn and is left as it is).
    Returns the nodes drained."""
    nodes = list(Node.objects.filter(capacity_set=capacity_set).order_by("hostname"))
    if not nodes:
        raise Conflict(f"capacity set {capacity_set.name} has no nodes to drain", code="empty_set")
    down = [n.hostname for n in nodes if n.state == NodeState.DOWN]
    reason = f"capacity set {capacity_set.name} is being drained"
    drained = [
        node_drain(node=node, actor=actor, message=reason)
        for node in nodes
        if node.state != NodeState.DOWN
    ]
    audit_record(
        actor=actor,
        verb="capacity_set.drain",
        target=capacity_set,
        after={"nodes": [n.hostname for n in drained], "skipped_down": down},
        message=reason,
    )
    return drained


@transaction.atomic
def node_drain_finish(*, node_id: int) -> bool:
    """A draining node that no VM holds any more becomes ``cordoned``. Returns whether it
    did; a node that is not draining, or still busy, is left as it is."""
    node = (
        Node.objects.select_for_update(no_key=True)
        .filter(pk=node_id, state=NodeState.DRAINING)
        .first()
    )
    if node is None:
        return False
    if VirtualMachine.objects.filter(node_id=node_id, state__in=HOLDING).exists():
        return False
    fleet.node_set_state(
        node=node,
        state=NodeState.CORDONED,
        actor=None,
        message="drain complete: no VM holds a GPU of this node any more",
    )
    return True


def drains_sweep() -> list[int]:
    """The periodic follow-up of every drain: warn VMs that finished booting on a draining node
    and cordon the nodes that emptied (a lost post-commit check heals here). Returns the nodes
    that ended cordoned."""
    finished = []
    for node_id in Node.objects.filter(state=NodeState.DRAINING).values_list("pk", flat=True):
        with transaction.atomic():
            node = (
                Node.objects.select_for_update(no_key=True)
                .filter(pk=node_id, state=NodeState.DRAINING)
                .first()
            )
            if node is None:
                continue  # uncordoned or cordoned meanwhile
            _warn_drained_vms(node, actor=None, message=f"node {node.hostname} is being drained")
            if node_drain_finish(node_id=node_id):
                finished.append(node_id)
    return finished


@transaction.atomic
def gpu_failed_warn(*, gpu_id: int, actor: Actor = None) -> list[InterruptionNotice]:
    """Give every running VM holding the failed GPU ``gpu_id`` a drain notice; each is stopped
    at its deadline, whatever its pool. A card that is not failed (healed meanwhile) warns
    nobody; a VM with an open notice keeps it and its deadline, so running this twice sends no
    second notice."""
    gpu = Gpu.objects.select_related("node").filter(pk=gpu_id, health=Gpu.Health.FAILED).first()
    if gpu is None:
        return []
    vms = VirtualMachine.objects.filter(
        state=VirtualMachine.State.RUNNING,
        allocations__gpu=gpu,
        allocations__released_at__isnull=True,
    )
    return _warn(vms, actor=actor, message=_gpu_failed_words(gpu))


def gpu_failed_sweep() -> list[InterruptionNotice]:
    """The periodic follow-up of failed cards: warn the VMs that were still booting on one when
    it failed (only running VMs can be warned), and any a lost signal missed."""
    gpus = (
        Gpu.objects.filter(
            health=Gpu.Health.FAILED,
            allocations__released_at__isnull=True,
            allocations__vm__state=VirtualMachine.State.RUNNING,
        )
        .order_by("pk")
        .values_list("pk", flat=True)
        .distinct()
    )
    return [notice for gpu_id in gpus for notice in gpu_failed_warn(gpu_id=gpu_id)]


def _gpu_failed_words(gpu: Gpu) -> str:
    return f"GPU {gpu.index} of node {gpu.node.hostname} failed: the VM is stopped at the deadline"


def _warn_drained_vms(node: Node, *, actor: Actor, message: str) -> list[InterruptionNotice]:
    """Give each running spot VM and inference replica of ``node`` a drain notice."""
    vms = VirtualMachine.objects.filter(
        node=node, state=VirtualMachine.State.RUNNING, pool__kind__in=DRAINED_KINDS
    )
    return _warn(vms, actor=actor, message=message)


def _warn(vms, *, actor: Actor, message: str) -> list[InterruptionNotice]:
    """A drain notice to each of ``vms``, one at a time under its own lock (``notice_issue``):
    a VM that has an open notice keeps it and its deadline, and one that stopped running since
    it was listed is left as it is."""
    notices = []
    for vm in vms.order_by("pk").distinct():
        try:
            notices.append(
                notice_issue(
                    vm=vm, reason=InterruptionNotice.Reason.DRAIN, actor=actor, message=message
                )
            )
        except Conflict as refused:
            if refused.code != "not_running":
                raise
    return notices


@transaction.atomic
def vm_reclaim(*, vm: VirtualMachine, actor: Actor, message: str = "") -> InterruptionNotice:
    """An operator takes back one rental: a ``reclaim`` notice, then a stop at its deadline.
    On-demand VMs included (this is the operator, not the arbiter). A VM that has an open
    notice already keeps it and its deadline."""
    who = actor.get_username() if actor is not None and actor.is_authenticated else "an operator"
    return notice_issue(
        vm=vm,
        reason=InterruptionNotice.Reason.RECLAIM,
        actor=actor,
        message=message or f"reclaimed by {who}",
    )
