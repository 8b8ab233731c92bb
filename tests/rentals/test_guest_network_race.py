"""Placements racing for addresses on real PostgreSQL: threads on separate connections place
VMs on one node's distinct GPUs at once. Each sees the same lowest free address; the partial
unique index lets one take it and the others move on to the next, so every VM is placed, each
with an address and a MAC of its own."""

import itertools

import pytest

from gpucap.fleet import services as fleet
from gpucap.rentals import services
from gpucap.rentals.models import GuestAddress, VirtualMachine
from tests.rentals.test_race import race

pytestmark = pytest.mark.django_db(transaction=True)

State = VirtualMachine.State
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHJhY2VhZGRyZXNzZXM racer@laptop"
RACERS = 8
ROUNDS = 3


def test_vms_placed_at_once_on_one_node_all_get_distinct_addresses(fleet_east, tenant, sent_tasks):
    pool = fleet_east["pools"]["a100-standalone"]
    fleet.pool_set_tenants(pool=pool, tenants=[tenant])
    node = fleet.node_update(
        node=fleet_east["nodes"]["a100-001"], guest_bridge="gpubr0", guest_subnet="10.77.0.0/24"
    )
    names = itertools.count(1)

    for round_number in range(ROUNDS):
        racers = [
            services.vm_request(
                tenant=tenant,
                pool=pool,
                name=f"racer-{next(names)}",
                gpu_count=1,
                image="ubuntu-24.04-cuda-12.6",
                ssh_public_key=SSH_KEY,
            )
            for _ in range(RACERS)
        ]

        outcomes = race(
            [
                lambda vm=vm, gpu=gpu: services.vm_place(vm=vm, node=node, gpu_indices=[gpu])
                for gpu, vm in enumerate(racers)
            ]
        )

        assert [kind for kind, _ in outcomes] == ["ok"] * RACERS, (round_number, outcomes)
        placed = VirtualMachine.objects.filter(pk__in=[vm.pk for vm in racers])
        assert {vm.state for vm in placed} == {State.PROVISIONING}
        addresses = sorted(vm.ip_address for vm in placed)
        assert addresses == sorted(f"10.77.0.{host}" for host in range(2, 2 + RACERS))
        live = GuestAddress.objects.filter(released_at=None)
        assert live.count() == RACERS
        assert len(set(live.values_list("mac", flat=True))) == RACERS
        assert sorted(live.values_list("address", flat=True)) == addresses

        # Free the node for the next round: the same addresses are handed out again.
        for vm in racers:
            services.vm_terminate(vm=vm)
            services.vm_mark_stopped(vm=vm)
        assert not GuestAddress.objects.filter(released_at=None).exists()
