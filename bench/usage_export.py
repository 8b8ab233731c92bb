"""How fast is usage metered and exported for a month of a large fleet? (``make bench``)

Builds, in a PostgreSQL database of its own (DB_NAME, created and migrated here, dropped at the
end), one month (November 2026, UTC) of the usage the VM lifecycle leaves behind: VMS VMs of 20
tenants in an on-demand, a spot and an inference pool, each with its usage intervals (written
directly, in bulk, as ``gpucap.rentals.services`` writes them one by one: a month of lifecycle
calls would take hours). On-demand VMs hold their GPUs for 1-720 hours once; spot VMs are
reclaimed and resume up to four times; a tenth of the VMs are still running at the month's end.

Then, with hourly periods (``USAGE_PERIOD_SECONDS=3600``):
- **record, month**: ``usage.services.usage_record`` makes every record of the month at once
  (as a new install would, or a worker back after a long outage);
- **record, hour**: the beat task's steady work: the next hour's records of the running VMs
  (median of ROUNDS runs, each an hour later);
- **totals**: a tenant's month of GPU-hours by pool kind (the tenant portal reads it);
- **export**: the month as CSV and as JSON for one tenant and for all tenants, through the
  operator's export endpoints (``GET /usage/export.csv|json``) in-process with
  ``django.test.Client`` and a streamed response read to the end: rows, MB, seconds, rows/s.

The bench checks what it measures: every record id unique, and the GPU-seconds of the export
equal to the intervals' to the second. Goal: none set by an issue; it prints the figures.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import benchdb

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "gpucap_bench_usage"
REDIS_DB = 8
VMS = 3000
TENANTS = 20
ROUNDS = 5
SEED = 20261130
MONTH_START = datetime(2026, 11, 1, tzinfo=UTC)
MONTH_END = datetime(2026, 12, 1, tzinfo=UTC)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, default=VMS)
    args = parser.parse_args()
    env = benchdb.bench_env(db_name=DB_NAME, redis_db=REDIS_DB, queue="bench-usage")
    env["USAGE_PERIOD_SECONDS"] = "3600"
    static_root = tempfile.TemporaryDirectory(prefix="bench-usage-static-")
    env["STATIC_ROOT"] = static_root.name
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    benchdb.database_create(env["DATABASE_URL"])
    benchdb.redis_forget(env["REDIS_URL"], env["CELERY_TASK_DEFAULT_QUEUE"])
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        return run(args.vms)
    finally:
        from django.db import connections

        connections.close_all()
        benchdb.database_drop(env["DATABASE_URL"])
        benchdb.redis_forget(env["REDIS_URL"], env["CELERY_TASK_DEFAULT_QUEUE"])
        static_root.cleanup()


def run(vm_count: int) -> int:
    from django.utils import timezone

    from gpucap.usage import selectors, services
    from gpucap.usage.models import UsageInterval, UsageRecord

    print(
        f"usage metering and export: {vm_count:,} VMs, one month, hourly periods; "
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
        f"PostgreSQL {benchdb.postgres_version()}\n"
    )
    world = build(vm_count, random.Random(SEED))
    benchdb.vacuum_analyze()
    intervals = UsageInterval.objects.count()
    print(
        f"built: {world['tenants']} tenants, {vm_count:,} VMs, {intervals:,} intervals "
        f"({world['open']:,} open at the month's end)"
    )
    now = MONTH_END  # the month has just ended; open intervals run on into December

    started = time.perf_counter()
    made = services.usage_record(now=now)
    month_seconds = time.perf_counter() - started
    hours = []
    for round_ in range(1, ROUNDS + 1):
        started = time.perf_counter()
        services.usage_record(now=now + timedelta(hours=round_, minutes=1))
        hours.append(time.perf_counter() - started)
    steady = UsageRecord.objects.filter(period_start__gte=MONTH_END).count() / ROUNDS
    ids = UsageRecord.objects.values("record_id").distinct().count()
    assert ids == UsageRecord.objects.count(), "a record id twice"

    tenant = world["first_tenant"]
    totals_ms = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        selectors.gpu_hours_by_pool_kind(
            tenant_id=tenant.pk, since=MONTH_START, until=MONTH_END, now=now
        )
        totals_ms.append((time.perf_counter() - started) * 1000)

    exports = [
        export(world, fmt, tenant_slug, now=timezone.now())
        for tenant_slug in (tenant.slug, None)
        for fmt in ("csv", "json")
    ]
    check_seconds(world, now)

    print(f"\n{'step':<34} {'rows':>10} {'MB':>7} {'seconds':>8} {'rows/s':>9}")
    print(
        f"{'record, month (first run)':<34} {made:>10,} {'':>7} {month_seconds:>8.2f} "
        f"{made / month_seconds:>9,.0f}"
    )
    print(
        f"{'record, hour (median of 5)':<34} {steady:>10,.0f} {'':>7} "
        f"{statistics.median(hours):>8.3f} {steady / statistics.median(hours):>9,.0f}"
    )
    print(
        f"{'totals, one tenant-month (median)':<34} {'':>10} {'':>7} "
        f"{statistics.median(totals_ms) / 1000:>8.3f}"
    )
    for row in exports:
        print(
            f"{row['label']:<34} {row['rows']:>10,} {row['bytes'] / 1e6:>7.1f} "
            f"{row['seconds']:>8.2f} {row['rows'] / row['seconds']:>9,.0f}"
        )
    print("\n(export: the operator endpoint in-process, the streamed body read to the end)")
    print("checks: record ids unique; export GPU-seconds equal the intervals' to the second")
    return 0


def build(vm_count: int, rng: random.Random) -> dict:
    from django.contrib.auth.models import Group, User

    from gpucap.fleet import services as fleet
    from gpucap.rentals.models import VirtualMachine
    from gpucap.roles import OPERATORS_GROUP
    from gpucap.tenancy.models import Tenant
    from gpucap.usage.models import UsageInterval

    operator = User.objects.create_user("bench-operator", is_staff=True)
    operator.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])
    tenants = [
        Tenant.objects.create(slug=f"tenant-{n:02d}", name=f"Tenant {n:02d}")
        for n in range(TENANTS)
    ]
    cluster = fleet.cluster_create(name="bench")
    the_set = fleet.capacity_set_create(
        cluster=cluster, name="h100-bench", gpu_model="H100-SXM5-80GB", fabric="nvswitch"
    )
    node = fleet.node_create(
        cluster=cluster,
        hostname="h100-0001",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
        gpu_count=8,
    )
    pools = [
        fleet.pool_create(name=name, kind=kind, cluster=cluster, capacity_set=the_set, rank=rank)
        for name, kind, rank in (("ondemand", "on_demand", 1), ("spot", "spot", 2))
    ]
    vms, runs, still_open = [], [], 0
    for n in range(vm_count):
        pool = pools[n % 2]
        running = rng.random() < 0.1
        runs.append(held(rng, spot=pool.kind == "spot", running=running))
        vms.append(
            VirtualMachine(
                tenant=tenants[n % TENANTS],
                pool=pool,
                name=f"vm-{n:05d}",
                gpu_count=rng.choice((1, 2, 4, 8)),
                image="ubuntu-24.04-cuda-12.6",
                ssh_public_key="ssh-ed25519 AAAAbench bench@gpucap",
                state="running" if running else "terminated",
                node=node if running else None,
                requested_at=runs[-1][0][0],
            )
        )
        still_open += running
    VirtualMachine.objects.bulk_create(vms, batch_size=2000)
    UsageInterval.objects.bulk_create(
        (
            UsageInterval(
                tenant_id=vm.tenant_id,
                vm=vm,
                pool_kind=vm.pool.kind,
                gpu_model="H100-SXM5-80GB",
                gpu_count=vm.gpu_count,
                started_at=start,
                ended_at=end,
            )
            for vm, vm_runs in zip(vms, runs, strict=True)
            for start, end in vm_runs
        ),
        batch_size=5000,
    )
    return {
        "tenants": TENANTS,
        "first_tenant": tenants[0],
        "open": still_open,
        "operator": operator,
    }


def held(rng: random.Random, *, spot: bool, running: bool) -> list:
    """When one VM held GPUs in the month: (start, end, or None while it still runs)."""
    last_hour = MONTH_END - timedelta(hours=1)
    at = MONTH_START + timedelta(seconds=rng.uniform(0, 29 * 86400))
    runs = []
    for _ in range(rng.randint(1, 5) if spot else 1):
        end = at + timedelta(seconds=rng.uniform(3600, (72 if spot else 720) * 3600))
        if end >= last_hour:
            break
        runs.append((at, end))
        at = end + timedelta(seconds=rng.uniform(600, 6 * 3600))  # reclaimed, then resumed
    if running:
        runs.append((min(at, last_hour), None))
    elif not runs:
        runs.append((at, MONTH_END - timedelta(minutes=1)))
    return runs


def export(world: dict, fmt: str, tenant_slug: str | None, *, now) -> dict:
    from django.test import Client

    client = Client()
    client.force_login(world["operator"])
    query = {"since": "2026-11-01", "until": "2026-12-01"}
    if tenant_slug:
        query["tenant"] = tenant_slug
    started = time.perf_counter()
    response = client.get(f"/usage/export.{fmt}", query)
    assert response.status_code == 200, (response.status_code, fmt)
    size = rows = 0
    for chunk in response.streaming_content:
        size += len(chunk)
        rows += chunk.count(b"\n")
    seconds = time.perf_counter() - started
    # CSV: one line per row after the header; JSON: one line per record after the meta line.
    rows -= 1 if fmt == "csv" else 2
    who = "one tenant" if tenant_slug else "all tenants"
    return {
        "label": f"export {fmt.upper()}, {who}",
        "rows": rows,
        "bytes": size,
        "seconds": seconds,
    }


def check_seconds(world: dict, now) -> None:
    """The month's export GPU-seconds equal the intervals' clipped to the month."""
    from django.db import connection

    from gpucap.usage import selectors

    exported = sum(
        (
            row["gpu_seconds"]
            for row in selectors.usage_rows(since=MONTH_START, until=MONTH_END, now=now)
        ),
        Decimal(0),
    )
    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT sum(extract(epoch FROM least(coalesce(ended_at, %(now)s), %(end)s)
                                         - greatest(started_at, %(start)s)) * gpu_count)
                 FROM usage_usageinterval
                WHERE started_at < %(end)s AND coalesce(ended_at, %(now)s) > %(start)s""",
            {"now": now, "start": MONTH_START, "end": MONTH_END},
        )
        expected = cursor.fetchone()[0]
    assert abs(exported - expected) < 1, (exported, expected)


if __name__ == "__main__":
    sys.exit(main())
