"""Races on real PostgreSQL: threads on separate connections, released together by a barrier,
compete for the same GPUs. Exactly one wins, the others get a clean Conflict, and no GPU is ever
held by two live allocations (a partial unique index, not only code). Two placement runs for
one cluster at once are serialised by its advisory lock: each pending VM is placed once."""

import itertools
import threading
import time
from collections.abc import Callable

import pytest
from django.db import connection
from django.db.models import Count

from gpucap import arbiter
from gpucap.audit.models import AuditEvent
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.plans import standalone as placement
from gpucap.rentals import services
from gpucap.rentals.models import Allocation, VirtualMachine
from gpucap.usage.models import UsageInterval

pytestmark = pytest.mark.django_db(transaction=True)

State = VirtualMachine.State
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHJhY2VyYWNlcmFjZQ racer@laptop"
A100 = {"gpu_model": "A100-SXM4-80GB", "fabric": "nvswitch"}
RACERS = 8
ROUNDS = 4


def race(calls: list[Callable[[], object]]) -> list[tuple[str, object]]:
    """Run each call in its own thread (its own database connection), all released at once.
    Returns ("ok", result) or ("error", exception) per call, in order."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[tuple[str, object] | None] = [None] * len(calls)

    def run(position: int, call: Callable[[], object]) -> None:
        try:
            barrier.wait(timeout=30)
            outcomes[position] = ("ok", call())
        except Exception as exc:  # every outcome is asserted by the test
            outcomes[position] = ("error", exc)
        finally:
            connection.close()  # this thread's connection, not the test's

    threads = [threading.Thread(target=run, args=item) for item in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a racer never finished"
    return outcomes


def gpus_held_twice() -> list:
    return list(
        Allocation.objects.filter(released_at=None)
        .values("gpu_id")
        .annotate(holders=Count("id"))
        .filter(holders__gt=1)
    )


def live_gpus(vm: VirtualMachine) -> list[tuple[str, int]]:
    return sorted(
        Allocation.objects.filter(vm=vm, released_at=None).values_list(
            "gpu__node__hostname", "gpu__index"
        )
    )


@pytest.fixture
def requester(fleet_east, tenant):
    pool = fleet_east["pools"]["a100-standalone"]
    fleet.pool_set_tenants(pool=pool, tenants=[tenant])
    names = itertools.count(1)

    def request(gpu_count: int = 8) -> VirtualMachine:
        return services.vm_request(
            tenant=tenant,
            pool=pool,
            name=f"racer-{next(names)}",
            gpu_count=gpu_count,
            image="ubuntu-24.04-cuda-12.6",
            ssh_public_key=SSH_KEY,
        )

    return request


def test_threads_racing_for_the_last_free_8_gpu_partition_one_wins(
    fleet_east, requester, sent_tasks
):
    cluster = fleet_east["cluster"]
    last = fleet_east["nodes"]["a100-001"]
    # The other standalone board is full: a100-001's 8 GPUs are the last free partition.
    full = fleet.node_create(cluster=cluster, hostname="a100-002", gpu_count=8, **A100)
    holder = requester()
    services.vm_place(vm=holder, node=full, gpu_indices=range(8))
    contenders = [requester() for _ in range(RACERS)]

    for round_number in range(ROUNDS):
        outcomes = race(
            [
                lambda vm=vm: services.vm_place(vm=vm, node=last, gpu_indices=range(8))
                for vm in contenders
            ]
        )

        won = [vm for vm, (kind, _) in zip(contenders, outcomes, strict=True) if kind == "ok"]
        errors = [value for kind, value in outcomes if kind == "error"]
        assert len(won) == 1, f"round {round_number}: {len(won)} winners"
        assert len(errors) == RACERS - 1
        for error in errors:
            assert isinstance(error, Conflict), repr(error)
            assert error.code == "gpus_taken"
            assert "are no longer free" in error.message
        (winner,) = won
        assert gpus_held_twice() == []
        assert live_gpus(winner) == [("a100-001", index) for index in range(8)]
        assert VirtualMachine.objects.get(pk=winner.pk).state == State.PROVISIONING
        for vm in contenders:
            if vm is winner:
                continue
            loser = VirtualMachine.objects.get(pk=vm.pk)
            assert (loser.state, loser.node_id) == (State.PENDING, None)
            assert not Allocation.objects.filter(vm=loser).exists()
            assert not UsageInterval.objects.filter(vm=loser).exists()
            assert not AuditEvent.objects.filter(
                verb="vm.provisioning", object_id=str(loser.pk)
            ).exists()
        assert live_gpus(holder) == [("a100-002", index) for index in range(8)]

        # Free the board again for the next round: the winner is terminated; a new
        # contender takes its place.
        services.vm_terminate(vm=winner)
        services.vm_mark_stopped(vm=winner)
        assert live_gpus(winner) == []
        contenders = [vm for vm in contenders if vm is not winner] + [requester()]

    # Over all rounds, no two allocations of one GPU ever overlapped in time.
    for gpu_id in Allocation.objects.values_list("gpu_id", flat=True).distinct():
        spans = list(
            Allocation.objects.filter(gpu_id=gpu_id)
            .order_by("created_at")
            .values_list("created_at", "released_at")
        )
        for (_, released), (next_created, _) in itertools.pairwise(spans):
            assert released is not None and released <= next_created


@pytest.mark.parametrize("attempt", range(3))
def test_two_placement_runs_for_one_cluster_at_once_place_each_vm_once(
    fleet_east, requester, sent_tasks, monkeypatch, attempt
):
    cluster = fleet_east["cluster"]
    fleet.node_create(cluster=cluster, hostname="a100-002", gpu_count=8, **A100)
    # 12 pairs asked for, 8 pairs free (two boards of four NVLink pairs).
    pending = [requester(gpu_count=2) for _ in range(12)]
    # Planning is slow enough for the other run to arrive while the first holds the lock.
    real_plan = arbiter.plan

    def slow_plan(snapshot):
        time.sleep(0.3)
        return real_plan(snapshot)

    monkeypatch.setattr(placement.arbiter, "plan", slow_plan)

    outcomes = race([lambda: placement.standalone_place(cluster_id=cluster.pk) for _ in range(2)])

    assert [kind for kind, _ in outcomes] == ["ok", "ok"], outcomes
    results = [result for _, result in outcomes]
    # One run placed everything that fits; the other, serialised behind it, found nothing to
    # do and ran into no GPU that had been taken under it.
    assert sorted(len(result.placed) for result in results) == [0, 8]
    for result in results:
        assert len(result.unsatisfied) == 4
        assert not any("no longer free" in u.reason for u in result.unsatisfied)
    assert gpus_held_twice() == []
    placed = [vm for vm in pending if Allocation.objects.filter(vm=vm, released_at=None).exists()]
    assert len(placed) == 8
    for vm in pending:
        provisioning = AuditEvent.objects.filter(verb="vm.provisioning", object_id=str(vm.pk))
        assert provisioning.count() == (1 if vm in placed else 0)
        assert len(live_gpus(vm)) == (2 if vm in placed else 0)
    assert Allocation.objects.filter(released_at=None).count() == 16
