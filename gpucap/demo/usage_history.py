"""Two weeks of past usage for the demo's tenants, so `make run` opens on usage pages and charts
with something in them. Past VMs cannot be run through the lifecycle (it stamps the present), so
this writes what the lifecycle would have left: terminated VMs and their closed intervals. Spot
VMs were reclaimed and resumed, so some have several intervals. Demo data only; loaded once.
"""

import random
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from gpucap.fleet.models import Pool
from gpucap.rentals.models import VirtualMachine
from gpucap.tenancy.models import Tenant
from gpucap.usage.models import UsageInterval

DAYS = 14
JOBS_PER_TENANT = 40
GPU_COUNTS = {"nvswitch": [1, 2, 4, 8], "pcie": [1, 2, 4]}
POOLS = ["h100-ondemand", "h100-spot", "l40s-ondemand", "l40s-spot", "a100-ondemand", "a100-spot"]


@transaction.atomic
def demo_usage_history(*, now: datetime | None = None) -> str:
    """Write the history (once: a database with usage older than a day is left alone)."""
    now = now or timezone.now()
    start = now - timedelta(days=DAYS)
    if UsageInterval.objects.filter(started_at__lt=now - timedelta(days=1)).exists():
        return "demo usage history: older usage exists already, left as it is"
    pools = list(Pool.objects.filter(name__in=POOLS).prefetch_related("tenants"))
    rng = random.Random(20261130)  # the same history on every machine
    vms = intervals = 0
    for tenant in Tenant.objects.filter(slug__in=["acme", "globex"]):
        mine = [pool for pool in pools if tenant in pool.tenants.all()]
        for job in range(JOBS_PER_TENANT):
            pool = rng.choice(mine)
            gpu_count = rng.choice(GPU_COUNTS[pool.fabric])
            began = start + timedelta(seconds=rng.uniform(0, (DAYS - 1) * 86400))
            pieces = _runs(rng, began, spot=pool.kind == Pool.Kind.SPOT, now=now)
            vm = VirtualMachine.objects.create(
                tenant=tenant,
                pool=pool,
                name=f"{tenant.slug}-past-{job + 1:02d}",
                gpu_count=gpu_count,
                image="ubuntu-24.04-cuda-12.6",
                ssh_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDemoPast demo@gpucap",
                state=VirtualMachine.State.TERMINATED,
                requested_at=began,
                started_at=began,
                stopped_at=pieces[-1][1],
            )
            UsageInterval.objects.bulk_create(
                UsageInterval(
                    tenant=tenant,
                    vm=vm,
                    pool_kind=pool.kind,
                    gpu_model=pool.gpu_model,
                    gpu_count=gpu_count,
                    started_at=run_start,
                    ended_at=run_end,
                )
                for run_start, run_end in pieces
            )
            vms += 1
            intervals += len(pieces)
    return f"demo usage history: {vms} past VMs with {intervals} usage intervals over {DAYS} days"


def _runs(
    rng: random.Random, began: datetime, *, spot: bool, now: datetime
) -> list[tuple[datetime, datetime]]:
    """When a past VM held GPUs: one run of 1-30 hours; a spot VM is reclaimed up to twice and
    resumes 10-90 minutes later."""
    runs = []
    at = began
    for _ in range(rng.randint(1, 3) if spot else 1):
        end = min(at + timedelta(hours=rng.uniform(1, 30)), now - timedelta(hours=1))
        if end <= at:
            break
        runs.append((at, end))
        at = end + timedelta(minutes=rng.uniform(10, 90))
    return runs or [(began, began + timedelta(hours=1))]
