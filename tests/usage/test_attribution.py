"""Usage says whose capacity GPU time was on (issue #19, item 4): inside the tenant's
reservation, borrowed from another's, on a node dedicated to it, or shared; an interval has one
attribution, so a change mid-run ends it and opens the next, never counting a second twice."""

import threading
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from gpucap.notices import dedications
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from gpucap.usage import services, tasks
from gpucap.usage.attribution import Attribution, attribute
from gpucap.usage.models import UsageInterval, UsageRecord
from tests.usage.conftest import reserve


def at(hour: int, minute: int = 0, second: int = 0) -> datetime:
    return datetime(2026, 11, 2, hour, minute, second, tzinfo=UTC)


def stop(vm):
    return rentals.vm_mark_stopped(vm=rentals.vm_stop(vm=vm))


def intervals(vm) -> list[UsageInterval]:
    return list(UsageInterval.objects.filter(vm=vm).order_by("started_at", "id"))


def recorded_seconds(vm) -> Decimal:
    return sum(UsageRecord.objects.filter(vm=vm).values_list("gpu_seconds", flat=True))


# --- the rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dedicated_to", "reservation", "borrowed_from", "expected"),
    [
        (None, None, None, Attribution()),
        (
            None,
            (7, "h100-east/train"),
            None,
            Attribution("reserved", "reservation-7", "h100-east/train"),
        ),
        (None, None, 9, Attribution("borrowed", borrowed_from="reservation-9")),
        (1, (7, "h100-east/train"), 9, Attribution("dedicated", dedicated_node="h100-001")),
        # Another tenant's dedicated node (a VM still leaving it) is not this tenant's.
        (2, None, 9, Attribution("borrowed", borrowed_from="reservation-9")),
        (2, None, None, Attribution()),
        # Placed inside its reservation wins over a stale borrowing flag.
        (
            None,
            (7, "h100-east/train"),
            9,
            Attribution("reserved", "reservation-7", "h100-east/train"),
        ),
    ],
)
def test_attribution_is_dedicated_then_reserved_then_borrowed_then_shared(
    dedicated_to, reservation, borrowed_from, expected
):
    got = attribute(
        tenant_id=1,
        node_hostname="h100-001",
        node_dedicated_tenant_id=dedicated_to,
        reservation=reservation,
        borrowed_from_id=borrowed_from,
    )

    assert got == expected


def test_a_vm_with_no_node_is_never_dedicated():
    assert (
        attribute(
            tenant_id=1,
            node_hostname=None,
            node_dedicated_tenant_id=None,
            reservation=None,
            borrowed_from_id=None,
        )
        == Attribution()
    )


# --- reserved -----------------------------------------------------------------------------------


def test_a_vm_placed_inside_its_reservation_records_reserved_time(clock, place, tenant, fleet_east):
    block = reserve(tenant, fleet_east["sets"]["h100-east"])
    clock.set(at(10, 20))
    vm = place(tenant, "h100-spot", "h100-001", [0, 1], name="trainer", reservation=block)
    clock.set(at(11, 30))
    stop(vm)

    services.usage_record(now=at(12, 1))

    records = list(UsageRecord.objects.filter(vm=vm).order_by("started_at"))
    assert [(r.allocation, r.commitment_id, r.commitment_name) for r in records] == [
        ("reserved", f"reservation-{block.pk}", "h100-east/train-block")
    ] * 2
    assert sum(r.gpu_seconds for r in records) == 2 * 70 * 60


def test_reserved_history_survives_the_reservations_deletion(clock, place, tenant, fleet_east):
    block = reserve(tenant, fleet_east["sets"]["h100-east"])
    block_id = block.pk
    clock.set(at(10))
    vm = place(tenant, "h100-spot", "h100-001", [0], name="trainer", reservation=block)
    clock.set(at(10, 40))

    block.delete()  # the VM's reservation is set null: from now on its GPU time is shared

    first, second = intervals(vm)
    assert (first.allocation, first.commitment_id, first.ended_at) == (
        "reserved",
        f"reservation-{block_id}",
        at(10, 40),
    )
    assert (second.allocation, second.started_at, second.ended_at) == ("shared", at(10, 40), None)


# --- borrowed -----------------------------------------------------------------------------------


def test_a_borrowed_vm_whose_flag_is_cleared_mid_run_gets_two_intervals_adding_up_exactly(
    clock, place, tenant, other_tenant, fleet_east
):
    theirs = reserve(other_tenant, fleet_east["sets"]["h100-east"], name="globex-block")
    clock.set(at(9, 13, 21))
    vm = place(tenant, "h100-spot", "h100-001", [0, 1, 2, 3], name="spot-job", borrowed_from=theirs)
    clock.set(at(10, 47, 5))
    VirtualMachine.objects.filter(pk=vm.pk).update(borrowed_from=None)  # a plan clears it

    assert services.usage_reattribute(vm_ids=[vm.pk], now=clock.now) == 1
    assert services.usage_reattribute(vm_ids=[vm.pk], now=clock.now) == 0  # idempotent
    clock.set(at(12, 2, 40))
    stop(vm)
    services.usage_record(now=at(13))

    borrowed, shared = intervals(vm)
    assert (borrowed.allocation, borrowed.borrowed_from) == ("borrowed", f"reservation-{theirs.pk}")
    assert (shared.allocation, shared.borrowed_from) == ("shared", "")
    assert borrowed.ended_at == shared.started_at == at(10, 47, 5)
    whole_run = Decimal((at(12, 2, 40) - at(9, 13, 21)).total_seconds()) * 4
    assert recorded_seconds(vm) == whole_run
    by_allocation = {
        allocation: sum(
            UsageRecord.objects.filter(vm=vm, allocation=allocation).values_list(
                "gpu_seconds", flat=True
            )
        )
        for allocation in ("borrowed", "shared")
    }
    assert by_allocation == {"borrowed": 4 * 5624, "shared": 4 * 4535}


def test_the_usage_beat_picks_up_a_change_nobody_reported(
    clock, place, tenant, other_tenant, fleet_east
):
    theirs = reserve(other_tenant, fleet_east["sets"]["h100-east"], name="globex-block")
    clock.set(at(9))
    vm = place(tenant, "h100-spot", "h100-001", [0], name="spot-job")
    clock.set(at(9, 30))
    VirtualMachine.objects.filter(pk=vm.pk).update(borrowed_from=theirs)

    tasks.record()
    tasks.record()

    shared, borrowed = intervals(vm)
    assert (shared.allocation, shared.ended_at) == ("shared", at(9, 30))
    assert (borrowed.allocation, borrowed.started_at, borrowed.ended_at) == (
        "borrowed",
        at(9, 30),
        None,
    )


def test_a_flag_set_at_the_moment_the_vm_started_is_corrected_in_place(
    clock, place, tenant, other_tenant, fleet_east
):
    theirs = reserve(other_tenant, fleet_east["sets"]["h100-east"], name="globex-block")
    clock.set(at(9))
    vm = place(tenant, "h100-spot", "h100-001", [0], name="spot-job")
    VirtualMachine.objects.filter(pk=vm.pk).update(borrowed_from=theirs)

    services.usage_reattribute(vm_ids=[vm.pk], now=at(9))

    [only] = intervals(vm)
    assert (only.allocation, only.started_at, only.ended_at) == ("borrowed", at(9), None)


def test_flags_written_after_the_placement_with_the_moment_before_it_give_one_interval(
    clock, place, tenant, fleet_east
):
    mine = reserve(tenant, fleet_east["sets"]["h100-east"])
    placed_at = clock.set(at(9))  # what a plan's apply notes before vm_place
    clock.set(at(9, 0, 1))
    vm = place(tenant, "h100-spot", "h100-001", [0], name="inside")
    clock.set(at(9, 0, 2))
    VirtualMachine.objects.filter(pk=vm.pk).update(reservation=mine)  # placement_flags_copy

    assert services.usage_reattribute(vm_ids=[vm.pk], now=placed_at) == 1

    [only] = intervals(vm)
    assert (only.allocation, only.commitment_id, only.started_at) == (
        "reserved",
        f"reservation-{mine.pk}",
        at(9, 0, 1),
    )


def test_a_split_is_never_before_what_was_already_recorded(
    clock, place, tenant, other_tenant, fleet_east
):
    theirs = reserve(other_tenant, fleet_east["sets"]["h100-east"], name="globex-block")
    clock.set(at(9, 30))
    vm = place(tenant, "h100-spot", "h100-001", [0], name="spot")
    services.usage_record(now=at(11, 5))  # recorded up to 11:00
    VirtualMachine.objects.filter(pk=vm.pk).update(borrowed_from=theirs)

    services.usage_reattribute(vm_ids=[vm.pk], now=at(10, 40))  # a late caller
    clock.set(at(12))
    stop(vm)
    services.usage_record(now=at(12, 1))

    assert [(i.allocation, i.started_at, i.ended_at) for i in intervals(vm)] == [
        ("shared", at(9, 30), at(11)),
        ("borrowed", at(11), at(12)),
    ]
    assert recorded_seconds(vm) == 150 * 60


# --- dedicated ----------------------------------------------------------------------------------


def test_a_vm_on_a_node_dedicated_to_its_tenant_records_dedicated_time(
    clock, place, tenant, operator, fleet_east
):
    node = fleet_east["nodes"]["h100-002"]
    dedications.node_dedicate(node=node, tenant=tenant, actor=operator)
    clock.set(at(10))
    vm = place(tenant, "h100-spot", "h100-002", [0, 2], name="on-my-node")
    clock.set(at(10, 30))
    stop(vm)

    services.usage_record(now=at(11))

    [record] = UsageRecord.objects.filter(vm=vm)
    assert (record.allocation, record.dedicated_node, record.gpu_seconds) == (
        "dedicated",
        "h100-002",
        2 * 1800,
    )
    assert (record.commitment_id, record.borrowed_from) == ("", "")


def test_dedicating_and_releasing_a_node_splits_its_tenants_running_vm_at_once(
    clock, place, tenant, operator, fleet_east
):
    node = fleet_east["nodes"]["h100-001"]
    clock.set(at(8))
    vm = place(tenant, "h100-spot", "h100-001", [0], name="long-run")
    clock.set(at(8, 45))
    dedications.node_dedicate(node=node, tenant=tenant, actor=operator)
    clock.set(at(9, 15))
    dedications.node_release(node=node, actor=operator)

    assert [(i.allocation, i.started_at, i.ended_at) for i in intervals(vm)] == [
        ("shared", at(8), at(8, 45)),
        ("dedicated", at(8, 45), at(9, 15)),
        ("shared", at(9, 15), None),
    ]


# --- at once, and before ------------------------------------------------------------------------


def run_at_once(*calls) -> list:
    """Run ``calls`` in threads released together; their results, in any order."""
    barrier = threading.Barrier(len(calls))
    results = []

    def run(call):
        try:
            barrier.wait()
            results.append(call())
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.django_db(transaction=True)
def test_two_reattributions_at_once_split_each_interval_once(
    clock, place, tenant, other_tenant, fleet_east
):
    theirs = reserve(other_tenant, fleet_east["sets"]["h100-east"], name="globex-block")
    clock.set(at(9))
    vms = [
        place(tenant, "h100-spot", "h100-001", [n], name=f"spot-{n}", borrowed_from=theirs)
        for n in range(4)
    ]
    clock.set(at(9, 50))
    VirtualMachine.objects.filter(tenant=tenant).update(borrowed_from=None)

    changed = run_at_once(
        lambda: services.usage_reattribute(now=at(9, 50)),
        lambda: services.usage_reattribute(now=at(9, 50)),
    )

    assert sum(changed) == 4
    for vm in vms:
        assert [(i.allocation, i.started_at, i.ended_at) for i in intervals(vm)] == [
            ("borrowed", at(9), at(9, 50)),
            ("shared", at(9, 50), None),
        ]


@pytest.mark.django_db(transaction=True)
def test_a_reattribution_racing_the_vms_stop_leaves_nothing_open_and_nothing_counted_twice(
    clock, place, tenant, other_tenant, fleet_east
):
    theirs = reserve(other_tenant, fleet_east["sets"]["h100-east"], name="globex-block")
    clock.set(at(9))
    vm = place(tenant, "h100-spot", "h100-001", [0, 1], name="spot", borrowed_from=theirs)
    clock.set(at(9, 50))
    VirtualMachine.objects.filter(pk=vm.pk).update(borrowed_from=None)

    run_at_once(lambda: services.usage_reattribute(now=at(9, 50)), lambda: stop(vm))

    assert not UsageInterval.objects.filter(vm=vm, ended_at=None).exists()
    services.usage_record(now=at(10, 1))
    assert recorded_seconds(vm) == 2 * 50 * 60


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_earlier_usage_shared(clock, place, tenant):
    clock.set(at(9, 30))
    vm = place(tenant, "h100-spot", "h100-001", [0], name="before")
    clock.set(at(10, 30))
    stop(vm)
    services.usage_record(now=at(11))
    executor = MigrationExecutor(connection)
    executor.migrate([("usage", "0003_billing_webhook")])  # the columns go, the rows stay
    try:
        executor = MigrationExecutor(connection)
        executor.migrate([("usage", "0004_attribution")])
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())

    columns = ("allocation", "commitment_id", "commitment_name", "borrowed_from", "dedicated_node")
    assert set(UsageInterval.objects.values_list(*columns)) == {("shared", "", "", "", "")}
    assert set(UsageRecord.objects.values_list(*columns)) == {("shared", "", "", "", "")}
    assert UsageRecord.objects.count() == 2


def test_the_beats_look_for_changes_is_one_query_however_many_vms_run(
    clock, place, tenant, other_tenant, operator, fleet_east, django_assert_num_queries
):
    mine = reserve(tenant, fleet_east["sets"]["h100-east"], name="acme-block")
    dedications.node_dedicate(node=fleet_east["nodes"]["h100-002"], tenant=tenant, actor=operator)
    clock.set(at(9))
    place(tenant, "h100-spot", "h100-001", [0], name="inside", reservation=mine)
    place(tenant, "h100-spot", "h100-002", [0], name="own-node")
    with django_assert_num_queries(1):
        assert services.usage_reattribute(now=at(9, 30)) == 0
    for n in range(1, 5):
        place(tenant, "h100-spot", "h100-001", [n], name=f"more-{n}", reservation=mine)
    with django_assert_num_queries(1):
        assert services.usage_reattribute(now=at(9, 30)) == 0
