"""Placement outside capacity sets (``gpucap.plans.standalone.standalone_place``): pending VMs
of standalone pools go to free capacity of the cluster's standalone nodes of their pool's GPU
model and fabric, by rank then request time; a higher-ranked placement may stop a standalone
spot VM at once, without notice, and waits for it; everything else waits in ``pending``."""

import itertools
import logging
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster, Gpu, Node, Pool
from gpucap.inference import services as inference
from gpucap.plans import tasks as plan_tasks
from gpucap.plans.standalone import PlacementResult, standalone_place
from gpucap.rentals import services
from gpucap.rentals.models import Allocation, VirtualMachine
from gpucap.usage.models import UsageInterval
from tests.rentals import conftest as rentals_fixtures

State = VirtualMachine.State
sent_tasks = rentals_fixtures.sent_tasks  # every task a service sends, recorded
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHN0YW5kYWxvbmU placer@laptop"
A100 = {"gpu_model": "A100-SXM4-80GB", "fabric": "nvswitch"}
# A Fabric Manager table whose 2-GPU partitions are not adjacent indices.
HGX_PAIRS = [
    [0, 1, 2, 3, 4, 5, 6, 7],
    [0, 1, 2, 3],
    [4, 5, 6, 7],
    [0, 2],
    [1, 3],
    [4, 6],
    [5, 7],
    [0],
    [1],
    [2],
    [3],
    [4],
    [5],
    [6],
    [7],
]


@dataclass
class Standalone:
    """Cluster east's standalone side: A100 boards a100-001 (default table) and a100-002 (the
    non-adjacent table), an L4 PCIe box, and ranked standalone pools of every kind."""

    cluster: Cluster
    nodes: dict[str, Node]
    pools: dict[str, Pool]
    tenant: object
    names: itertools.count

    def request(self, pool: str, gpus: int = 8, *, minutes_ago: int = 0, **extra):
        vm = services.vm_request(
            tenant=self.tenant,
            pool=self.pools[pool],
            name=f"vm{next(self.names)}",
            gpu_count=gpus,
            image="ubuntu-24.04-cuda-12.6",
            ssh_public_key=SSH_KEY,
            **extra,
        )
        at = timezone.now() - timedelta(minutes=minutes_ago)
        VirtualMachine.objects.filter(pk=vm.pk).update(requested_at=at)
        vm.refresh_from_db()
        return vm

    def running(self, pool: str, node: str, gpus: list[int], **extra):
        vm = self.request(pool, len(gpus), **extra)
        services.vm_place(vm=vm, node=self.nodes[node], gpu_indices=gpus)
        return services.vm_mark_running(vm=vm, ip_address="10.1.2.3")

    def place(self) -> PlacementResult:
        return standalone_place(cluster_id=self.cluster.pk)


@pytest.fixture
def east(fleet_east, tenant) -> Standalone:
    cluster = fleet_east["cluster"]
    nodes = {
        "a100-001": fleet_east["nodes"]["a100-001"],
        "a100-002": fleet.node_create(
            cluster=cluster, hostname="a100-002", gpu_count=8, partitions=HGX_PAIRS, **A100
        ),
        "l4-001": fleet.node_create(
            cluster=cluster, hostname="l4-001", gpu_model="L4", fabric="pcie", gpu_count=2
        ),
    }
    pools = {
        "a100-standalone": fleet_east["pools"]["a100-standalone"],  # on_demand, rank 1
        "a100-batch": fleet.pool_create(
            name="a100-batch", kind="on_demand", cluster=cluster, rank=2, **A100
        ),
        "a100-serving": fleet.pool_create(
            name="a100-serving", kind="inference", cluster=cluster, rank=3, **A100
        ),
        "a100-spot": fleet.pool_create(
            name="a100-spot", kind="spot", cluster=cluster, rank=4, **A100
        ),
        "l4-ondemand": fleet.pool_create(
            name="l4-ondemand",
            kind="on_demand",
            cluster=cluster,
            rank=5,
            gpu_model="L4",
            fabric="pcie",
        ),
    }
    for pool in pools.values():
        fleet.pool_set_tenants(pool=pool, tenants=[tenant])
    return Standalone(cluster, nodes, pools, tenant, itertools.count(1))


def fresh(vm: VirtualMachine) -> VirtualMachine:
    return VirtualMachine.objects.get(pk=vm.pk)


def held(vm: VirtualMachine) -> tuple[str, tuple[int, ...]] | None:
    """(node, GPU indices) of the VM's live allocations, or None."""
    rows = list(
        Allocation.objects.filter(vm=vm, released_at=None)
        .order_by("gpu__index")
        .values_list("gpu__node__hostname", "gpu__index")
    )
    if not rows:
        return None
    assert len({node for node, _ in rows}) == 1
    return rows[0][0], tuple(index for _, index in rows)


def world() -> dict:
    """Everything a placement run could change."""
    return {
        "vms": list(
            VirtualMachine.objects.order_by("pk").values_list(
                "pk", "state", "node_id", "stop_reason", "preempted_for_id", "requested_at"
            )
        ),
        "allocations": list(
            Allocation.objects.order_by("pk").values_list("pk", "vm_id", "gpu_id", "released_at")
        ),
        "usage": list(UsageInterval.objects.order_by("pk").values_list("pk", "ended_at")),
        "events": AuditEvent.objects.count(),
    }


def no_gpu_held_twice() -> None:
    gpus = list(Allocation.objects.filter(released_at=None).values_list("gpu_id", flat=True))
    assert len(gpus) == len(set(gpus))


# --- placing on free capacity -----------------------------------------------------------------


def test_a_pending_vm_gets_a_partition_of_its_nodes_own_table(east):
    fleet.node_cordon(node=east.nodes["a100-001"])  # only the non-adjacent board is ready
    vms = [east.request("a100-standalone", 2, minutes_ago=10 - n) for n in range(4)]

    result = east.place()

    assert sorted(p.vm_id for p in result.placed) == sorted(vm.pk for vm in vms)
    pairs = {held(vm) for vm in vms}
    # Exactly the board's NVLink pairs, never pairs guessed by index adjacency such as (0, 1).
    assert pairs == {
        ("a100-002", (0, 2)),
        ("a100-002", (1, 3)),
        ("a100-002", (4, 6)),
        ("a100-002", (5, 7)),
    }
    for vm in vms:
        vm = fresh(vm)
        assert (vm.state, vm.node.hostname) == (State.PROVISIONING, "a100-002")
        assert UsageInterval.objects.filter(vm=vm, ended_at=None, gpu_count=2).count() == 1
    event = AuditEvent.objects.get(verb="vm.provisioning", object_id=str(vms[0].pk))
    assert event.message.startswith("standalone placement on free GPUs")
    assert "a100-002" in event.message
    no_gpu_held_twice()


def test_a_whole_board_goes_to_an_eight_gpu_vm(east):
    vm = east.request("a100-standalone", 8)

    result = east.place()

    assert result.placed[0].vm_id == vm.pk
    node, gpus = held(vm)
    assert node in ("a100-001", "a100-002") and gpus == tuple(range(8))


def test_a_pcie_vm_gets_one_card_of_a_node_of_its_pools_model(east):
    vm = east.request("l4-ondemand", 1)

    east.place()

    assert held(vm) in {("l4-001", (0,)), ("l4-001", (1,))}
    assert fresh(vm).state == State.PROVISIONING


def test_a_vm_waits_when_only_other_models_are_free(east, caplog):
    fleet.node_cordon(node=east.nodes["a100-001"])
    fleet.node_cordon(node=east.nodes["a100-002"])
    vm = east.request("a100-standalone", 1)  # the L4 box is free, but it is not an A100

    with caplog.at_level(logging.INFO, logger="gpucap.plans.standalone"):
        result = east.place()

    assert fresh(vm).state == State.PENDING and held(vm) is None
    assert [u.vm_id for u in result.unsatisfied] == [vm.pk]
    assert f"{vm.instance_id} stays pending: " in caplog.text
    assert Allocation.objects.count() == 0


@pytest.mark.parametrize("state", [Node.State.CORDONED, Node.State.DOWN])
def test_a_node_that_is_not_ready_takes_nothing(east, state):
    fleet.node_set_state(node=east.nodes["a100-001"], state=state)
    fleet.node_cordon(node=east.nodes["a100-002"])
    vm = east.request("a100-standalone", 1)

    east.place()

    assert fresh(vm).state == State.PENDING
    assert Allocation.objects.count() == 0


def test_a_failed_gpu_takes_nothing(east):
    fleet.node_cordon(node=east.nodes["a100-001"])
    fleet.gpu_set_health(gpu=east.nodes["a100-002"].gpus.get(index=0), health=Gpu.Health.FAILED)
    whole = east.request("a100-standalone", 8, minutes_ago=2)
    pair = east.request("a100-standalone", 2, minutes_ago=1)
    singles = [east.request("a100-standalone", 1) for _ in range(3)]

    east.place()

    assert fresh(whole).state == State.PENDING  # the only board has a failed card
    assert held(pair)[1] in {(1, 3), (4, 6), (5, 7)}  # (0, 2) holds the failed card
    taken = [held(vm)[1][0] for vm in singles]
    assert 0 not in taken and len(set(taken)) == 3
    no_gpu_held_twice()


# --- order of service ---------------------------------------------------------------------------


def test_the_higher_ranked_pool_wins_the_last_block_even_if_it_asked_later(east):
    fleet.node_cordon(node=east.nodes["a100-001"])  # one free 8-GPU block: a100-002
    early = east.request("a100-batch", 8, minutes_ago=30)  # rank 2
    late = east.request("a100-standalone", 8, minutes_ago=1)  # rank 1

    result = east.place()

    assert [p.vm_id for p in result.placed] == [late.pk]
    assert held(late) == ("a100-002", tuple(range(8)))
    assert fresh(early).state == State.PENDING
    assert [u.vm_id for u in result.unsatisfied] == [early.pk]


def test_within_a_pool_the_earlier_request_wins(east):
    fleet.node_cordon(node=east.nodes["a100-001"])
    later = east.request("a100-batch", 8, minutes_ago=1)
    earlier = east.request("a100-batch", 8, minutes_ago=5)

    east.place()

    assert held(earlier) == ("a100-002", tuple(range(8)))
    assert fresh(later).state == State.PENDING


# --- preemption outside a set: spot only, immediate, no notice --------------------------------


def test_on_demand_and_inference_vms_are_never_preempted(east, caplog):
    batch = east.running("a100-batch", "a100-001", list(range(8)))  # on_demand, rank 2
    deployment = inference.deployment_create(
        tenant=east.tenant,
        pool=east.pools["a100-serving"],
        name="chat",
        model_name="gpucap/sim-8b",
        gpus_per_replica=8,
        min_replicas=0,
    )
    serving = east.running(
        "a100-serving",
        "a100-002",
        list(range(8)),
        role=VirtualMachine.Role.INFERENCE_REPLICA,
        deployment=deployment,
    )  # inference, rank 3
    urgent = east.request("a100-standalone", 8)  # rank 1: outranks both
    before = world()

    with caplog.at_level(logging.INFO, logger="gpucap.plans.standalone"):
        result = east.place()

    assert (result.placed, result.preempted, result.waiting) == ([], [], [])
    assert [u.vm_id for u in result.unsatisfied] == [urgent.pk]
    assert fresh(batch).state == fresh(serving).state == State.RUNNING
    assert world() == before
    assert f"{urgent.instance_id} stays pending: " in caplog.text


def test_a_spot_pools_floor_holds_outside_a_set_too(east):
    fleet.node_cordon(node=east.nodes["a100-001"])
    fleet.pool_set_floor(pool=east.pools["a100-spot"], floor_gpus=8)
    spot = east.running("a100-spot", "a100-002", list(range(8)))
    urgent = east.request("a100-standalone", 8)

    result = east.place()

    assert result.preempted == [] and fresh(spot).state == State.RUNNING
    assert "floor of 8 GPUs" in result.unsatisfied[0].reason
    assert fresh(urgent).state == State.PENDING


def test_a_higher_ranked_request_stops_a_spot_vm_at_once_and_gets_its_gpus(
    east, sent_tasks, django_capture_on_commit_callbacks
):
    older = east.running("a100-spot", "a100-001", list(range(8)))
    newer = east.running("a100-spot", "a100-002", list(range(8)))
    VirtualMachine.objects.filter(pk=older.pk).update(
        started_at=timezone.now() - timedelta(hours=5)
    )
    urgent = east.request("a100-standalone", 8)

    with django_capture_on_commit_callbacks(execute=True):
        result = east.place()

    # Least progress lost: the spot VM that started most recently is the one stopped.
    victim = fresh(newer)
    assert [(p.vm_id, p.for_vm_id) for p in result.preempted] == [(newer.pk, urgent.pk)]
    assert (victim.state, victim.stop_reason, victim.preempted_for_id) == (
        State.STOPPING,
        VirtualMachine.StopReason.PREEMPTED,
        urgent.pk,
    )
    event = AuditEvent.objects.get(verb="vm.stopping", object_id=str(newer.pk))
    assert "without notice" in event.message and urgent.instance_id in event.message
    assert ("rentals.vm_stop", [newer.pk]) in sent_tasks  # an immediate stop, no notice first
    # The request waits for its victim: its GPUs are still held until the VM is off.
    assert result.waiting == [urgent.pk] and result.placed == []
    assert fresh(urgent).state == State.PENDING and held(victim) == ("a100-002", tuple(range(8)))
    assert fresh(older).state == State.RUNNING

    # Asked again while the victim is still stopping: no second victim, nothing else changes.
    before = world()
    again = east.place()
    assert (again.preempted, again.placed) == ([], [])
    assert world() == before
    assert fresh(older).state == State.RUNNING

    # The victim is off: it goes back to pending (a persistent spot request) and asks for
    # placement again; that run places the waiting request on the freed GPUs.
    sent_tasks.clear()
    with django_capture_on_commit_callbacks(execute=True):
        services.vm_mark_stopped(vm=victim)
    assert ("rentals.standalone_place", [east.cluster.pk]) in sent_tasks
    assert fresh(victim).state == State.PENDING and held(victim) is None

    final = east.place()

    assert [p.vm_id for p in final.placed] == [urgent.pk]
    assert held(urgent) == ("a100-002", tuple(range(8)))
    assert fresh(urgent).state == State.PROVISIONING
    # The spot VM waits for capacity: it may not preempt a VM of its own rank.
    assert fresh(victim).state == State.PENDING and final.preempted == []
    assert fresh(older).state == State.RUNNING
    no_gpu_held_twice()


def test_gpus_a_victim_frees_beyond_the_block_wait_until_it_is_off(east):
    fleet.node_cordon(node=east.nodes["a100-001"])
    big = east.running("a100-spot", "a100-002", list(range(8)))
    first = east.request("a100-standalone", 4, minutes_ago=2)
    second = east.request("a100-standalone", 4, minutes_ago=1)

    result = east.place()

    # One preemption serves both; neither may take a GPU the victim still holds.
    assert [p.vm_id for p in result.preempted] == [big.pk]
    assert sorted(result.waiting) == sorted([first.pk, second.pk])
    assert fresh(first).state == fresh(second).state == State.PENDING
    assert held(big) == ("a100-002", tuple(range(8)))

    services.vm_mark_stopped(vm=big)
    east.place()

    assert {held(first), held(second)} == {("a100-002", (0, 1, 2, 3)), ("a100-002", (4, 5, 6, 7))}
    no_gpu_held_twice()


def test_a_vm_held_on_gpus_outside_the_table_is_left_alone(east):
    fleet.node_cordon(node=east.nodes["a100-001"])
    # Placed on an adjacent pair under the default table; then the operator loads the board's
    # real Fabric Manager table, in which {0, 1} is not a partition.
    fleet.node_update(node=east.nodes["a100-002"], partitions=None)
    odd = east.running("a100-spot", "a100-002", [0, 1])
    fleet.node_update(node=east.nodes["a100-002"], partitions=HGX_PAIRS)
    pair = east.request("a100-standalone", 2)

    result = east.place()

    assert fresh(odd).state == State.RUNNING and result.preempted == []
    assert held(pair)[1] in {(4, 6), (5, 7)}  # not (0, 2) or (1, 3): they share a held card
    no_gpu_held_twice()


# --- what placement leaves alone ------------------------------------------------------------------


def test_vms_of_capacity_set_pools_stay_pending_for_the_arbiter(east, fleet_east):
    vm = services.vm_request(
        tenant=east.tenant,
        pool=fleet_east["pools"]["h100-spot"],  # a set pool; both H100 boards are free
        name="set-vm",
        gpu_count=8,
        image="ubuntu-24.04-cuda-12.6",
        ssh_public_key=SSH_KEY,
    )
    before = world()

    result = east.place()

    assert fresh(vm).state == State.PENDING
    assert world() == before
    assert result.placed == result.unsatisfied == []


def test_a_set_nodes_free_gpus_are_never_given_to_a_standalone_pool(east, fleet_east):
    # An H100 standalone pool: the only H100 nodes are in the h100-east set.
    pool = fleet.pool_create(
        name="h100-loose",
        kind="on_demand",
        cluster=east.cluster,
        rank=6,
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
    )
    fleet.pool_set_tenants(pool=pool, tenants=[east.tenant])
    east.pools["h100-loose"] = pool
    vm = east.request("h100-loose", 1)

    result = east.place()

    assert fresh(vm).state == State.PENDING
    assert [u.vm_id for u in result.unsatisfied] == [vm.pk]
    assert Allocation.objects.count() == 0


def test_the_free_rest_of_a_waiting_vms_block_is_kept_for_it(east):
    fleet.node_cordon(node=east.nodes["a100-001"])
    spot = east.running("a100-spot", "a100-002", [4, 5, 6, 7])
    urgent = east.request("a100-standalone", 8, minutes_ago=2)  # needs the whole board
    first = east.place()
    assert [p.vm_id for p in first.preempted] == [spot.pk] and first.waiting == [urgent.pk]

    # GPUs 0-3 are free while the spot VM stops, but they belong to urgent's block: a
    # lower-ranked request must not take them meanwhile.
    batch = east.request("a100-batch", 2)
    second = east.place()

    assert second.placed == [] and fresh(batch).state == State.PENDING
    assert "reserved" in second.unsatisfied[0].reason
    services.vm_mark_stopped(vm=spot)
    third = east.place()
    assert [p.vm_id for p in third.placed] == [urgent.pk]
    assert held(urgent) == ("a100-002", tuple(range(8)))
    assert fresh(batch).state == State.PENDING


def test_running_placement_twice_changes_nothing_the_second_time(east):
    fleet.node_cordon(node=east.nodes["a100-001"])
    east.running("a100-spot", "a100-002", [4, 5, 6, 7])
    east.request("a100-standalone", 8)  # preempts the spot VM and waits
    east.request("a100-batch", 2)  # placed on free capacity
    east.request("l4-ondemand", 1)  # placed
    east.request("a100-spot", 8)  # stays pending
    first = east.place()
    assert first.changed
    before = world()

    second = east.place()

    assert not second.changed and second.waiting == []
    assert world() == before


def test_standalone_place_task_calls_the_placement(monkeypatch, db):
    placed = []
    monkeypatch.setattr(
        plan_tasks.standalone, "standalone_place", lambda *, cluster_id: placed.append(cluster_id)
    )

    plan_tasks.standalone_place.apply(args=[7])

    assert placed == [7]


# --- disks kept for resuming spot VMs -----------------------------------------------------------


def reclaimed(vm: VirtualMachine) -> VirtualMachine:
    """A running spot VM stopped for capacity and off: back in pending, its disk kept."""
    services.vm_stop_for_notice(vm=vm)
    return services.vm_mark_stopped(vm=fresh(vm))


def placement_message(vm: VirtualMachine) -> str:
    return (
        AuditEvent.objects.filter(verb="vm.provisioning", object_id=str(vm.pk)).latest("pk").message
    )


def test_a_reclaimed_spot_vm_resumes_on_the_node_that_kept_its_disk(
    east, sent_tasks, django_capture_on_commit_callbacks
):
    vm = reclaimed(east.running("a100-spot", "a100-002", [0]))
    assert (fresh(vm).state, fresh(vm).disk_node_id) == (State.PENDING, east.nodes["a100-002"].pk)
    # Both boards are empty and fit a 1-GPU VM equally well; by name a100-001 would come first.
    sent_tasks.clear()
    with django_capture_on_commit_callbacks(execute=True):
        result = east.place()

    assert [p.vm_id for p in result.placed] == [vm.pk]
    assert held(vm) == ("a100-002", (0,))
    assert placement_message(vm).endswith("resumed on its disk on a100-002")
    assert not [task for task in sent_tasks if task[0] == "rentals.vm_destroy_left"]


def test_a_spot_vm_whose_disk_node_is_busy_resumes_elsewhere_on_a_fresh_disk(
    east, sent_tasks, django_capture_on_commit_callbacks
):
    vm = reclaimed(east.running("a100-spot", "a100-002", [0]))
    east.running("a100-standalone", "a100-002", list(range(8)))  # its node fills up meanwhile
    sent_tasks.clear()
    with django_capture_on_commit_callbacks(execute=True):
        east.place()

    assert held(vm) == ("a100-001", (0,))
    assert placement_message(vm).endswith("resumed on a fresh disk from ubuntu-24.04-cuda-12.6")
    # The disk it left behind is deleted.
    assert ("rentals.vm_destroy_left", [vm.pk, east.nodes["a100-002"].pk]) in sent_tasks


def test_the_disk_preference_never_takes_a_better_fit_from_packing(east):
    # a100-001 has one GPU left; taking it breaks no free partition, while a GPU of a100-002
    # (where the disk is) would break its free 8-GPU board. Packing wins.
    vm = reclaimed(east.running("a100-spot", "a100-002", [0]))
    east.running("a100-standalone", "a100-001", [0, 1, 2, 3])
    east.running("a100-standalone", "a100-001", [4, 5])
    east.running("a100-standalone", "a100-001", [6])

    east.place()

    assert held(vm) == ("a100-001", (7,))
    assert placement_message(vm).endswith("resumed on a fresh disk from ubuntu-24.04-cuda-12.6")
