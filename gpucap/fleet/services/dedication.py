"""Which tenant a node is dedicated to. Only the field and what it changes for the planners;
the notices for other tenants' VMs on the node are `gpucap.notices.dedications`' (as a drain's
are `gpucap.notices.drains`')."""

from django.db import transaction

from gpucap.audit.services import Actor, audit_record
from gpucap.fleet.models import Node
from gpucap.fleet.services._common import capacity_set_bump
from gpucap.fleet.signals import node_dedication_changed, node_dedication_changing
from gpucap.tasks import enqueue_on_commit
from gpucap.tenancy.models import Tenant


@transaction.atomic
def node_set_dedicated_tenant(*, node: Node, tenant: Tenant | None, actor: Actor) -> bool:
    """Dedicate ``node`` (as loaded: its ``dedicated_tenant_id`` is the value expected) to
    ``tenant``, or make it shared again (None). A conditional update: returns whether this call
    changed it; a node someone changed meanwhile is left alone. Bumps the set's generation, or
    for a standalone node runs its cluster's standalone placement again, and tells the apps
    that follow it (``node_dedication_changed``: usage re-attributes the VMs there)."""
    before = node.dedicated_tenant_id
    after = tenant.pk if tenant is not None else None
    if before == after:
        return False
    node_dedication_changing.send(sender=Node, node=node, tenant=tenant)
    changed = Node.objects.filter(pk=node.pk, dedicated_tenant_id=before).update(
        dedicated_tenant_id=after
    )
    if changed != 1:
        return False
    old = Tenant.objects.filter(pk=before).values_list("slug", flat=True).first()
    node.dedicated_tenant = tenant
    node_dedication_changed.send(sender=Node, node_id=node.pk)
    if node.capacity_set_id is not None:
        capacity_set_bump(capacity_set_id=node.capacity_set_id)
    else:
        enqueue_on_commit("rentals.standalone_place", node.cluster_id)
    audit_record(
        actor=actor,
        verb="node.dedicate" if tenant is not None else "node.release",
        target=node,
        before={"dedicated_tenant": old},
        after={"dedicated_tenant": tenant.slug if tenant is not None else None},
        message=(
            f"node {node.hostname} dedicated to tenant {tenant.name}"
            if tenant is not None
            else f"node {node.hostname} released to the shared pool (was {old})"
        ),
    )
    return True
