"""Renting a whole machine (gpucap/bmc/bare_metal.py): only a node dedicated to the tenant,
ready or cordoned, rented to nobody and with no VM on it; the node is cordoned for the rental
and stays out of VM service and dedicated until it ends; each refusal a 409 naming why, with
nothing changed; each change audited."""

from datetime import timedelta

import pytest
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.bmc import bare_metal
from gpucap.bmc.models import BareMetalRental
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Node
from gpucap.notices import dedications, drains
from tests.bmc.bare_metal_helpers import catalogue_image, dedicated, rent, rental_of
from tests.rentals.vm_helpers import grant_pools, running_vm


@pytest.fixture
def a100(fleet_east, tenant, operator) -> Node:
    """The standalone A100 node, dedicated to acme."""
    return dedicated(fleet_east["nodes"]["a100-001"], tenant, operator=operator)


def _refused(code: str, **kwargs) -> str:
    before = (BareMetalRental.objects.count(), AuditEvent.objects.count())
    with pytest.raises(Conflict) as caught:
        rent(**kwargs)
    assert caught.value.code == code
    assert (BareMetalRental.objects.count(), AuditEvent.objects.count()) == before
    return caught.value.message


def test_renting_cordons_the_node_with_the_rental_as_reason_and_audits_it(a100, tenant, operator):
    image = catalogue_image(a100.cluster)

    rental = rent(a100, tenant, image=image, actor=operator)

    assert rental.active and rental.image == image and rental.started_by == operator
    node = Node.objects.get(pk=a100.pk)
    assert node.state == Node.State.CORDONED and node.dedicated_tenant == tenant
    cordon = AuditEvent.objects.get(verb="node.cordon", object_id=str(a100.pk))
    assert cordon.message == f"rented whole to tenant acme as bare metal (rental {rental.pk})"
    event = AuditEvent.objects.get(verb="bare_metal.rent")
    assert event.after == {"node": "a100-001", "tenant": "acme", "image": "ubuntu-24.04-server"}
    assert event.actor == operator


def test_a_cordoned_node_is_rented_as_it_is(a100, tenant):
    fleet.node_cordon(node=a100)

    rent(a100, tenant)

    assert not AuditEvent.objects.filter(verb="node.cordon").exclude(message="").exists()


def test_only_a_node_dedicated_to_the_tenant_is_rented(fleet_east, tenant, other_tenant, a100):
    shared = fleet_east["nodes"]["l40s-001"]
    message = _refused("node_not_dedicated", node=shared, tenant=tenant)
    assert message == (
        "node l40s-001 is shared: only a node dedicated to tenant acme can be rented to it whole "
        "(dedicate it first)"
    )
    message = _refused("node_not_dedicated", node=a100, tenant=other_tenant)
    assert message.startswith("node a100-001 is dedicated to tenant acme: only a node dedicated")


def test_a_node_with_vms_holding_its_gpus_is_refused_and_stays_ready(fleet_east, tenant, a100):
    pools = grant_pools(fleet_east, tenant, tenant)
    vm = running_vm(tenant, pools["a100-standalone"], a100, [0], name="train", ip="10.0.0.7")

    message = _refused("node_busy", node=a100, tenant=tenant)

    assert message == (
        f"node a100-001 has VMs holding its GPUs (vm-{vm.pk}); a machine is rented whole only "
        "when none do: drain it first"
    )
    assert Node.objects.get(pk=a100.pk).state == Node.State.READY


def test_a_rented_node_is_not_rented_twice(a100, tenant):
    first = rent(a100, tenant)
    message = _refused("node_rented", node=a100, tenant=tenant)
    assert message.startswith(f"node a100-001 is rented already (bare-metal rental {first.pk}")


def test_a_down_node_is_not_rented(a100, tenant):
    fleet.node_set_state(node=a100, state=Node.State.DOWN)
    message = _refused("node_unavailable", node=a100, tenant=tenant)
    assert message == "node a100-001 is down: only a ready or cordoned node can be rented"


def test_an_image_of_another_cluster_or_disabled_is_refused_naming_image(a100, tenant):
    west = fleet.cluster_create(name="west")
    elsewhere = catalogue_image(west)
    disabled = catalogue_image(a100.cluster, name="old", enabled=False)
    for image, words in (
        (elsewhere, "is in the catalogue of cluster west, not of a100-001's cluster east"),
        (disabled, "is disabled: it is not offered any more"),
    ):
        with pytest.raises(Exception) as caught:
            rent(a100, tenant, image=image)
        assert words in caught.value.message_dict["image"][0]
    assert not BareMetalRental.objects.exists()


def test_a_rented_node_stays_out_of_vm_service_and_dedicated(a100, tenant, other_tenant, operator):
    rental = rent(a100, tenant)
    node = Node.objects.get(pk=a100.pk)
    refusals = (
        lambda: fleet.node_uncordon(node=node, actor=operator),
        lambda: drains.node_drain(node=node, actor=operator),
        lambda: dedications.node_release(node=node, actor=operator),
    )
    for attempt in refusals:
        with pytest.raises(Conflict) as caught:
            attempt()
        assert caught.value.code == "node_rented"
        assert f"rented whole to tenant acme as bare metal (rental {rental.pk})" in (
            caught.value.message
        )
    node = Node.objects.get(pk=a100.pk)
    assert (node.state, node.dedicated_tenant_id) == (Node.State.CORDONED, tenant.pk)
    # A machine that dies is still marked down, and comes back cordoned.
    fleet.node_set_state(node=node, state=Node.State.DOWN)
    fleet.node_set_state(node=node, state=Node.State.CORDONED)


def test_ending_a_rental_keeps_the_node_cordoned_and_lets_it_back_into_service(
    a100, tenant, member, operator
):
    rental = rent(a100, tenant, actor=operator)
    later = timezone.now() + timedelta(hours=2)

    ended = bare_metal.bare_metal_end(rental=rental, actor=member, now=later)

    assert (ended.ended_at, ended.ended_by) == (later, member)
    event = AuditEvent.objects.get(verb="bare_metal.end")
    assert event.actor == member and "stays cordoned" in event.message
    node = Node.objects.get(pk=a100.pk)
    assert node.state == Node.State.CORDONED
    fleet.node_uncordon(node=node, actor=operator)
    dedications.node_release(node=node, actor=operator)

    with pytest.raises(Conflict) as caught:
        bare_metal.bare_metal_end(rental=rental_of(rental), actor=member)
    assert caught.value.code == "rental_ended"
    assert AuditEvent.objects.filter(verb="bare_metal.end").count() == 1
