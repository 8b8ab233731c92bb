"""Whole machines rented to tenants (docs/bmc.md, "Whole machines for tenants"): an operator
rents a node dedicated to a tenant to that tenant (``bare_metal_rent``), the operator or the
tenant ends it (``bare_metal_end``), and the tenant re-images it from its cluster's catalogue
(``bare_metal_reimage``: a provisioning run, ``gpucap.bmc.provisioning``, that waits for no
hypervisor). Power is ``gpucap.bmc.bare_metal_power``'s.

While a rental lasts the node takes no VM placements: it is **cordoned**, with the rental as the
reason (the cordon's audit message), and the fleet's ``node_state_changing`` is refused for it
(``node_stays_out_of_service``): no uncordon, no drain back into service. Its dedication stays
(``node_stays_dedicated``): releasing the node, or giving it to another tenant, is refused until
the rental ends. When the rental ends the node stays cordoned: it runs what the tenant installed,
and an operator re-provisions it before putting it back into service.

Usage follows ``signals.bare_metal_rental_changed``, sent by both services in their transaction.
"""

from datetime import datetime

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from gpucap.audit.services import Actor, audit_record
from gpucap.bmc import provisioning
from gpucap.bmc.models import BareMetalImage, BareMetalPowerAction, BareMetalRental, Provisioning
from gpucap.bmc.signals import bare_metal_rental_changed
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Node
from gpucap.rentals.models import Allocation
from gpucap.tasks import enqueue_on_commit
from gpucap.tenancy.models import Tenant


@transaction.atomic
def bare_metal_rent(
    *,
    node: Node,
    tenant: Tenant,
    image: BareMetalImage | None = None,
    actor: Actor = None,
    now: datetime | None = None,
) -> BareMetalRental:
    """Rent ``node`` whole to ``tenant``, from now until it is ended. Refused (409, naming why,
    nothing changed) unless the node is dedicated to that tenant, ready or cordoned, rented to
    nobody and with no VM holding its GPUs. ``image`` (of the node's cluster's catalogue) says
    what the machine was handed over with; None: as it is."""
    now = now or timezone.now()
    node = (
        Node.objects.select_for_update(no_key=True, of=("self",))
        .select_related("cluster", "dedicated_tenant")
        .get(pk=node.pk)
    )
    if image is not None and (problem := image_problem(image, node=node)):
        raise ValidationError({"image": problem})
    _rentable_check(node=node, tenant=tenant)
    rental = BareMetalRental.objects.create(
        node=node, tenant=tenant, image=image, started_at=now, started_by=_user(actor)
    )
    # Cordoned first, then checked for VMs: a placement that committed while we waited for the
    # cordon's locks is seen, and the whole rental rolls back.
    if node.state == Node.State.READY:
        fleet.node_set_state(
            node=node,
            state=Node.State.CORDONED,
            actor=actor,
            message=f"rented whole to tenant {tenant.slug} as bare metal (rental {rental.pk})",
        )
    holders = vms_holding(node)
    if holders:
        raise Conflict(
            f"node {node.hostname} has VMs holding its GPUs ({', '.join(holders)}); a machine "
            "is rented whole only when none do: drain it first",
            code="node_busy",
        )
    audit_record(
        actor=actor,
        verb="bare_metal.rent",
        target=rental,
        after={
            "node": node.hostname,
            "tenant": tenant.slug,
            "image": image.name if image else None,
        },
        message=f"node {node.hostname} rented whole to tenant {tenant.name}",
    )
    bare_metal_rental_changed.send(sender=BareMetalRental, rental=rental)
    # What the power is now, for the tenant's page.
    enqueue_on_commit("bmc.bare_metal_power_read", rental.pk)
    return rental


def _rentable_check(*, node: Node, tenant: Tenant) -> None:
    if node.dedicated_tenant_id != tenant.pk:
        now_held = (
            f"dedicated to tenant {node.dedicated_tenant.slug}"
            if node.dedicated_tenant_id
            else "shared"
        )
        raise Conflict(
            f"node {node.hostname} is {now_held}: only a node dedicated to tenant {tenant.slug} "
            "can be rented to it whole (dedicate it first)",
            code="node_not_dedicated",
        )
    rented = BareMetalRental.objects.filter(node=node, ended_at=None).first()
    if rented is not None:
        raise Conflict(
            f"node {node.hostname} is rented already (bare-metal rental {rented.pk}, since "
            f"{rented.started_at:%Y-%m-%d %H:%M} UTC)",
            code="node_rented",
        )
    if node.state not in (Node.State.READY, Node.State.CORDONED):
        raise Conflict(
            f"node {node.hostname} is {node.state}: only a ready or cordoned node can be rented",
            code="node_unavailable",
        )


def vms_holding(node: Node) -> list[str]:
    """The VMs holding GPUs of ``node`` now, by instance id (``vm-42``)."""
    vm_ids = (
        Allocation.objects.filter(gpu__node=node, released_at=None)
        .values_list("vm_id", flat=True)
        .distinct()
        .order_by("vm_id")
    )
    return [f"vm-{vm_id}" for vm_id in vm_ids]


@transaction.atomic
def bare_metal_end(
    *, rental: BareMetalRental, actor: Actor = None, now: datetime | None = None
) -> BareMetalRental:
    """End a rental now (its operator or its tenant): its usage stops, the tenant's power and
    re-image end. The node stays cordoned and dedicated: it runs what the tenant put on it,
    and an operator re-provisions it before it takes VMs again. An ended rental is a 409."""
    now = now or timezone.now()
    rental = (
        BareMetalRental.objects.select_for_update(of=("self",))
        .select_related("node", "tenant")
        .get(pk=rental.pk)
    )
    if rental.ended_at is not None:
        raise Conflict(
            f"bare-metal rental {rental.pk} ended at {rental.ended_at:%Y-%m-%d %H:%M} UTC already",
            code="rental_ended",
        )
    rental.ended_at = max(now, rental.started_at)
    rental.ended_by = _user(actor)
    rental.save(update_fields=["ended_at", "ended_by"])
    audit_record(
        actor=actor,
        verb="bare_metal.end",
        target=rental,
        before={"ended_at": None},
        after={"ended_at": rental.ended_at.isoformat()},
        message=f"node {rental.node.hostname} is no longer rented to tenant "
        f"{rental.tenant.name}; it stays cordoned until an operator puts it back into service",
    )
    bare_metal_rental_changed.send(sender=BareMetalRental, rental=rental)
    return rental


@transaction.atomic
def bare_metal_reimage(
    *, rental: BareMetalRental, image: BareMetalImage, actor: Actor = None
) -> Provisioning:
    """The tenant boots its machine from ``image`` of its cluster's catalogue, by virtual media:
    a provisioning run of the rental (the image inserted, the next boot from it once, a reset),
    which leaves the image in the drive for the installer until its deadline. The rental names
    the image from now on. An image that is not an enabled one of the cluster's is a 400 naming
    ``image``; an ended rental, a power action or another run under way, a 409 saying which."""
    rental = (
        BareMetalRental.objects.select_for_update(of=("self",))
        .select_related("node__cluster")
        .get(pk=rental.pk)
    )
    node = rental.node
    if rental.ended_at is not None:
        raise Conflict(f"bare-metal rental {rental.pk} has ended", code="rental_ended")
    if problem := image_problem(image, node=node):
        raise ValidationError({"image": problem})
    power = rental.power_actions.filter(state__in=BareMetalPowerAction.UNDER_WAY).first()
    if power is not None:
        raise Conflict(
            f"{power.get_action_display().lower()} asked at {power.requested_at:%H:%M:%S} UTC is "
            "still under way; wait for it to finish",
            code="power_under_way",
        )
    running = Provisioning.objects.filter(node=node, state__in=Provisioning.ACTIVE).first()
    if running is not None:
        whose = "a re-image" if running.bare_metal_rental_id else "your operator's provisioning"
        raise Conflict(
            f"{whose} of {node.hostname} started at {running.started_at:%H:%M} UTC is still "
            f"under way ({running.get_state_display().lower()})",
            code="reimage_under_way",
        )
    run = provisioning.provisioning_start(
        node=node, image_url=image.image_url, actor=actor, bare_metal_rental=rental
    )
    before = rental.image.name if rental.image_id else None
    rental.image = image
    rental.save(update_fields=["image"])
    audit_record(
        actor=actor,
        verb="bare_metal.reimage",
        target=rental,
        before={"image": before},
        after={"image": image.name},
        message=f"{node.hostname} boots from {image.name}",
    )
    return run


def image_problem(image: BareMetalImage, *, node: Node) -> str:
    """Why ``image`` cannot go on ``node`` ("" when it can): it must be an enabled image of the
    node's cluster's catalogue."""
    if image.cluster_id != node.cluster_id:
        return (
            f"image {image.name!r} is in the catalogue of cluster {image.cluster.name}, not of "
            f"{node.hostname}'s cluster {node.cluster.name}"
        )
    if not image.enabled:
        return f"image {image.name!r} is disabled: it is not offered any more"
    return ""


def _user(actor: Actor):
    return actor if actor is not None and actor.is_authenticated else None


# --- the node stays the rental's (receivers of the fleet's veto signals) --------------------------


def node_stays_out_of_service(sender, *, node: Node, old: str, new: str, **kwargs) -> None:
    """A rented node is never made ready or drained back into service while its rental lasts
    (it may still be marked down, and come back cordoned)."""
    if new not in (Node.State.READY, Node.State.DRAINING):
        return
    rental = _open_rental(node)
    if rental is not None:
        raise Conflict(
            f"node {node.hostname} is rented whole to tenant {rental.tenant.slug} as bare metal "
            f"(rental {rental.pk}): it takes no VMs until the rental ends",
            code="node_rented",
        )


def node_stays_dedicated(sender, *, node: Node, tenant: Tenant | None, **kwargs) -> None:
    """A rented node stays dedicated to its tenant while the rental lasts."""
    rental = _open_rental(node)
    if rental is not None and (tenant is None or tenant.pk != rental.tenant_id):
        raise Conflict(
            f"node {node.hostname} is rented whole to tenant {rental.tenant.slug} as bare metal "
            f"(rental {rental.pk}): it stays dedicated to it until the rental ends",
            code="node_rented",
        )


def _open_rental(node: Node) -> BareMetalRental | None:
    return (
        BareMetalRental.objects.filter(node_id=node.pk, ended_at=None)
        .select_related("tenant")
        .first()
    )
