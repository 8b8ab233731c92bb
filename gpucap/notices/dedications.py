"""Dedicated nodes (issue 19, part 3): an operator gives a whole node to one tenant, and
releases it back to the shared pool.

A dedicated node serves only its tenant, whatever the pool: the snapshot names the tenant as
the node's ``"tenant"`` and the arbiter (in a capacity set) and standalone placement (outside
one) place only that tenant's demands there and never count its GPUs as free capacity for
anyone else (docs/arbiter.md, "Quotas and dedicated nodes").

Dedicating a node that other tenants' VMs still run on moves them off as a drain does
(`gpucap.notices.drains`): their running spot VMs and inference replicas get a ``drain``
notice with the set's ``notice_seconds``; their on-demand VMs are never stopped: the node is
"being dedicated" until they leave, and ``dedication_holders`` (the drain's blockers of other
tenants) says who holds it up. VMs still booting are warned by the periodic sweep once they
run. Nothing here changes the node's state: a dedicated node stays ready for its tenant.

Everything is previewed first (``node_dedicate_preview``, nothing written) and safe to apply
twice: the second apply finds the node dedicated and the VMs warned, and sends no notice.
"""

from dataclasses import dataclass

from django.db import transaction
from django.db.models import F

from gpucap.audit.services import Actor
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Node
from gpucap.notices.drains import DRAINED_KINDS
from gpucap.notices.models import InterruptionNotice
from gpucap.notices.selectors import DrainBlocker, drain_blockers
from gpucap.notices.services import notice_issue
from gpucap.rentals.models import VirtualMachine
from gpucap.tenancy.models import Tenant

State = VirtualMachine.State


@dataclass(frozen=True)
class Dedication:
    """What dedicating ``node`` to ``tenant`` does (a preview) or did (applied): the other
    tenants' VMs that get a notice now, and those that hold the node up (on-demand VMs a
    dedication never stops, VMs already leaving or still booting)."""

    node: Node
    tenant: Tenant
    notices: list[VirtualMachine]
    holders: list[DrainBlocker]
    applied: bool = False

    @property
    def complete(self) -> bool:
        """No other tenant's VM is left on the node (once applied: it is dedicated)."""
        return not self.notices and not self.holders


def node_dedicate_preview(*, node: Node, tenant: Tenant) -> Dedication:
    """What ``node_dedicate`` would do now; changes nothing. A node dedicated to another
    tenant already is a 409 naming that tenant."""
    node = Node.objects.select_related("dedicated_tenant").get(pk=node.pk)
    _check_dedicable(node, tenant)
    notices = list(_to_warn(node, tenant_id=tenant.pk).select_related("tenant", "pool"))
    warned = {vm.pk for vm in notices}
    holders = [b for b in dedication_holders(node, tenant_id=tenant.pk) if b.vm.pk not in warned]
    return Dedication(node=node, tenant=tenant, notices=notices, holders=holders)


@transaction.atomic
def node_dedicate(*, node: Node, tenant: Tenant, actor: Actor) -> Dedication:
    """Dedicate ``node`` to ``tenant`` and warn the other tenants' spot VMs and inference
    replicas on it (see the module docs). Applying again sends no second notice."""
    # No key: a placement committing on the node must not wait for us (fleet's node_set_state).
    Node.objects.select_for_update(no_key=True).filter(pk=node.pk).first()
    locked = Node.objects.select_related("dedicated_tenant").get(pk=node.pk)
    _check_dedicable(locked, tenant)
    fleet.node_set_dedicated_tenant(node=locked, tenant=tenant, actor=actor)
    warned = {notice.vm_id for notice in _warn_other_tenants(locked, actor=actor)}
    notices = list(
        VirtualMachine.objects.filter(pk__in=warned).select_related("tenant", "pool").order_by("pk")
    )
    holders = dedication_holders(locked, tenant_id=tenant.pk)
    return Dedication(
        node=locked,
        tenant=tenant,
        notices=notices,
        holders=[b for b in holders if b.vm.pk not in warned],
        applied=True,
    )


@transaction.atomic
def node_release(*, node: Node, actor: Actor) -> Node:
    """Give a dedicated node back to the shared pool: its free GPUs are free capacity for
    every tenant again; its tenant's VMs keep running. Releasing a shared node is a 409."""
    Node.objects.select_for_update(no_key=True).filter(pk=node.pk).first()
    locked = Node.objects.get(pk=node.pk)
    if locked.dedicated_tenant_id is None:
        raise Conflict(
            f"node {locked.hostname} is not dedicated to any tenant: nothing to release",
            code="node_not_dedicated",
        )
    fleet.node_set_dedicated_tenant(node=locked, tenant=None, actor=actor)
    return locked


def dedication_holders(node: Node, *, tenant_id: int | None = None) -> list[DrainBlocker]:
    """Other tenants' VMs still holding GPUs of ``node`` (dedicated, or about to be dedicated to
    ``tenant_id``): a drain's blockers, without the tenant's own VMs. Two queries."""
    tenant_id = node.dedicated_tenant_id if tenant_id is None else tenant_id
    return [b for b in drain_blockers(node) if b.vm.tenant_id != tenant_id]


def dedications_sweep() -> int:
    """The periodic follow-up of dedications: warn other tenants' VMs that finished booting on
    a dedicated node since it was dedicated. Returns the notices sent."""
    sent = 0
    # One query finds the nodes with anyone to warn: most sweeps lock no node at all.
    nodes = (
        VirtualMachine.objects.filter(
            node__dedicated_tenant__isnull=False,
            state=State.RUNNING,
            pool__kind__in=DRAINED_KINDS,
        )
        .exclude(tenant_id=F("node__dedicated_tenant_id"))
        .order_by("node_id")
        .values_list("node_id", flat=True)
        .distinct()
    )
    for node_id in list(nodes):
        with transaction.atomic():
            node = (
                Node.objects.select_for_update(no_key=True)
                .filter(pk=node_id, dedicated_tenant__isnull=False)
                .first()
            )
            if node is not None:
                sent += len(_warn_other_tenants(node, actor=None))
    return sent


def _check_dedicable(node: Node, tenant: Tenant) -> None:
    if node.dedicated_tenant_id not in (None, tenant.pk):
        raise Conflict(
            f"node {node.hostname} is dedicated to tenant {node.dedicated_tenant.name} "
            f"({node.dedicated_tenant.slug}) already; release it first",
            code="node_dedicated",
        )


def _to_warn(node: Node, *, tenant_id: int):
    """Other tenants' VMs a dedication warns now: running spot VMs and inference replicas (a VM
    under notice keeps it; one still booting is warned once it runs)."""
    return (
        VirtualMachine.objects.filter(node=node, state=State.RUNNING, pool__kind__in=DRAINED_KINDS)
        .exclude(tenant_id=tenant_id)
        .order_by("pk")
    )


def _warn_other_tenants(node: Node, *, actor: Actor) -> list[InterruptionNotice]:
    message = f"node {node.hostname} is being dedicated to another tenant"
    return [
        notice_issue(vm=vm, reason=InterruptionNotice.Reason.DRAIN, actor=actor, message=message)
        for vm in _to_warn(node, tenant_id=node.dedicated_tenant_id)
    ]
