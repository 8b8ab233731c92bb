"""Usage records: the lifecycle's intervals cut at period boundaries, made once final, exact to
the millisecond, never twice."""

import threading
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.db import connection

from gpucap.rentals import services as rentals
from gpucap.usage import selectors, services
from gpucap.usage.models import UsageInterval, UsageRecord


def at(hour: int, minute: int = 0, second: int = 0, day: int = 2) -> datetime:
    return datetime(2026, 11, day, hour, minute, second, tzinfo=UTC)


def stop(vm):
    vm = rentals.vm_stop(vm=vm)
    return rentals.vm_mark_stopped(vm=vm)


def interval_seconds(interval: UsageInterval) -> Decimal:
    return Decimal((interval.ended_at - interval.started_at).total_seconds()) * interval.gpu_count


def test_a_vm_running_across_period_boundaries_is_split_at_each(clock, pools, run_vm, tenant):
    clock.set(at(10, 20))
    vm = run_vm(tenant, "h100-spot", "h100-001", [0, 1], name="trainer")
    clock.set(at(12, 10, 30))
    stop(vm)

    made = services.usage_record(now=at(12, 11))

    records = list(UsageRecord.objects.order_by("period_start"))
    assert made == 3
    assert [(r.started_at, r.ended_at) for r in records] == [
        (at(10, 20), at(11)),
        (at(11), at(12)),
        (at(12), at(12, 10, 30)),
    ]
    assert [r.gpu_seconds for r in records] == [Decimal(2 * 2400), Decimal(2 * 3600), 2 * 630]
    assert [r.record_id for r in records] == [
        f"iv{records[0].interval_id}-20261102T100000Z",
        f"iv{records[0].interval_id}-20261102T110000Z",
        f"iv{records[0].interval_id}-20261102T120000Z",
    ]
    assert records[0].pool.name == "h100-spot" and records[0].pool_kind == "spot"


def test_an_open_interval_is_recorded_only_up_to_the_last_ended_period(
    clock, pools, run_vm, tenant
):
    clock.set(at(10, 20))
    run_vm(tenant, "h100-spot", "h100-001", [0], name="still-running")

    assert services.usage_record(now=at(10, 59)) == 0
    assert services.usage_record(now=at(12, 5)) == 2
    assert services.usage_record(now=at(12, 30)) == 0

    assert [r.ended_at for r in UsageRecord.objects.all()] == [at(11), at(12)]


def test_a_reclaimed_spot_vm_that_resumes_has_two_intervals_and_records_for_both(
    clock, pools, run_vm, tenant, fleet_east
):
    clock.set(at(9, 0))
    vm = run_vm(tenant, "h100-spot", "h100-001", [0, 1, 2, 3], name="spot-job")
    clock.set(at(9, 40))
    rentals.vm_mark_stopped(vm=rentals.vm_stop_for_notice(vm=vm, message="reclaimed"))
    vm.refresh_from_db()
    assert vm.state == "pending"  # a spot VM waits to resume
    clock.set(at(10, 15))
    vm = rentals.vm_place(vm=vm, node=fleet_east["nodes"]["h100-002"], gpu_indices=[0, 1, 2, 3])
    rentals.vm_mark_running(vm=vm, ip_address="10.0.0.8")
    clock.set(at(10, 45))
    stop(vm)

    services.usage_record(now=at(11, 0))

    intervals = list(UsageInterval.objects.filter(vm=vm).order_by("started_at"))
    assert [(i.started_at, i.ended_at) for i in intervals] == [
        (at(9), at(9, 40)),
        (at(10, 15), at(10, 45)),
    ]
    records = list(UsageRecord.objects.filter(vm=vm).order_by("started_at"))
    assert [(r.interval_id, r.gpu_seconds) for r in records] == [
        (intervals[0].pk, Decimal(4 * 2400)),
        (intervals[1].pk, Decimal(4 * 1800)),
    ]


def test_export_gpu_seconds_equal_the_lifecycles_intervals(clock, pools, run_vm, tenant):
    clock.set(datetime(2026, 11, 2, 7, 13, 21, 250_000, tzinfo=UTC))
    a = run_vm(tenant, "h100-spot", "h100-001", [0, 1], name="a")
    clock.advance(hours=5, minutes=3, seconds=7, microseconds=125_000)
    b = run_vm(tenant, "h100-spot", "h100-001", [2], name="b")
    clock.advance(hours=30, seconds=11)
    stop(a)
    clock.advance(minutes=1)
    stop(b)

    rows = list(selectors.usage_rows(since=at(0), until=at(0, day=5), now=clock.now))

    by_interval: dict[int, Decimal] = {}
    for row in rows:
        interval_id = row["interval_id"]
        by_interval[interval_id] = by_interval.get(interval_id, 0) + row["gpu_seconds"]
    for interval in UsageInterval.objects.all():
        assert abs(by_interval[interval.pk] - interval_seconds(interval)) < Decimal("0.01")
    assert all(row["final"] for row in rows)


def test_exports_count_an_open_interval_up_to_now_and_say_it_is_not_final(
    clock, pools, run_vm, tenant
):
    clock.set(at(10, 30))
    run_vm(tenant, "h100-spot", "h100-001", [0], name="open")

    rows = list(selectors.usage_rows(since=at(0), until=at(0, day=3), now=at(11, 15)))

    assert [(r["started_at"], r["ended_at"], r["final"]) for r in rows] == [
        (at(10, 30), at(11), True),
        (at(11), at(11, 15), False),
    ]


def test_exports_of_one_tenant_hold_only_its_rows(clock, pools, run_vm, tenant, other_tenant):
    clock.set(at(10))
    run_vm(tenant, "h100-spot", "h100-001", [0], name="mine")
    run_vm(other_tenant, "l40s-ondemand", "l40s-001", [0], name="theirs")

    rows = list(
        selectors.usage_rows(since=at(0), until=at(0, day=3), tenant_id=tenant.pk, now=at(11))
    )

    assert {r["tenant_slug"] for r in rows} == {"acme"}
    assert {r["vm_name"] for r in rows} == {"mine"}


@pytest.mark.django_db(transaction=True)
def test_two_runs_at_once_make_each_record_once(clock, pools, run_vm, tenant):
    clock.set(at(0))
    for n in range(6):
        vm = run_vm(tenant, "h100-spot", "h100-001", [n], name=f"vm{n}")
        clock.advance(minutes=37)
        if n % 2:
            stop(vm)
    barrier = threading.Barrier(2)
    made = []

    def run():
        try:
            barrier.wait()
            made.append(services.usage_record(now=at(9, 1)))
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sum(made) == UsageRecord.objects.count() > 0
    assert sorted(made)[0] == 0
    ids = list(UsageRecord.objects.order_by("id").values_list("record_id", flat=True))
    assert len(ids) == len(set(ids))
    assert services.usage_record(now=at(9, 1)) == 0


def test_totals_by_pool_kind_equal_the_sum_of_the_exported_rows(
    clock, pools, run_vm, tenant, other_tenant
):
    clock.set(at(8, 10))
    spot = run_vm(tenant, "h100-spot", "h100-001", [0, 1], name="spot")
    run_vm(tenant, "l40s-ondemand", "l40s-001", [0], name="ondemand")
    clock.set(at(13, 35, 12))
    stop(spot)
    run_vm(other_tenant, "l40s-ondemand", "l40s-002", [0], name="not-mine")
    since, until, now = at(9), at(15), at(14, 5)

    totals = selectors.gpu_hours_by_pool_kind(
        tenant_id=tenant.pk, since=since, until=until, now=now
    )

    rows = list(selectors.usage_rows(since=since, until=until, tenant_id=tenant.pk, now=now))
    expected: dict[str, Decimal] = {}
    for row in rows:
        expected[row["pool_kind"]] = expected.get(row["pool_kind"], 0) + row["gpu_seconds"] / 3600
    assert totals == pytest.approx(expected)
    assert totals["spot"] == pytest.approx(Decimal(2) * Decimal(4 * 3600 + 35 * 60 + 12) / 3600)
    assert totals["on_demand"] == pytest.approx(Decimal(5 * 3600 + 5 * 60) / 3600)
