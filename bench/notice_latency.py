"""How soon after an on-demand request are its victims told? (``make bench``)

Builds one NVSwitch H100 capacity set of NODES (2,000) nodes x 8 GPUs in a PostgreSQL database
of its own (DB_NAME, created and migrated here, dropped at the end) with bench/set_page.py's
builder (``set_page.BenchFleet``: the real services, running VMs of four pools on every node,
0.2 pending demands per node), gives its notices a day (so that no deadline falls due while
measuring), switches it to ``enforce`` and applies its first plan (a tick in this process). The
tasks that leaves queued are dropped (driver calls for VMs no hypervisor runs; those VMs stay
provisioning), so that the worker does only what each request asks. A tenant
(``bench-tenant``, member of acme, which may rent in ``bench-ondemand``) gets an API token.

Then the stack runs on loopback as ``make run`` runs it: uvicorn serving gpucap.asgi:application
(the API and the metadata endpoint; 127.0.0.1 is the trusted metadata proxy) and one Celery
worker (concurrency 2), on a Redis database of the bench's own (REDIS_DB or BENCH_REDIS_URL;
only gpucap's keys and the bench's queue are deleted at the end). No beat: the bench's VMs
run on no hypervisor, and nothing periodic runs between requests, so what is measured is the
request's own path: API -> commit -> replan trigger -> the worker's tick (snapshot, plan,
apply) -> notices -> metadata.

After one warm-up request, REQUESTS times: the tenant asks
for an 8-GPU on-demand VM (``POST /api/vms/``, token auth); no node has 8 free GPUs, so the
plan reclaims spot VMs for it. Measured, from just before the POST, until the victims'
notices are "sent": the applied plan's preemptions for the new VM are committed, each victim has
its open notice row, AND the metadata endpoint serves each victim its notice
(``GET /metadata/v1/interruption`` as the guest at the victim's address, 200), polled by the
bench every POLL_SECONDS. The next request waits until the set is quiet again (its latest plan
is of its current generation) and PLANS_DEBOUNCE_SECONDS more. Printed: median and p90, and
where the median request's time goes (API answer; planning started and plan stored, from the
plan's ``created_at`` and ``planning_ms``; notices committed; metadata served).

Goal (issue 17, build 6): median under 1.5 s at 2,000 nodes. ``--nodes`` and ``--requests``
change the size while iterating; ``--keep`` keeps the database and ``--reuse`` measures the set
it holds again (with the VMs earlier runs asked for) without building it.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import benchdb
import requests
import set_page
import stack

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = benchdb.database_name("gpucap_bench_notice")
REDIS_DB = 7
QUEUE = "bench-notice-latency"
NODES = 2000
REQUESTS = 15
GOAL_NODES = 2000
GOAL_SECONDS = 1.5
POLL_SECONDS = 0.01
PATIENCE_SECONDS = 60
NOTICE_SECONDS = 86400
USERNAME, PASSWORD = "bench-tenant", "notice-bench-password"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=NODES, help="nodes in the set")
    parser.add_argument("--requests", type=int, default=REQUESTS, help="on-demand requests")
    parser.add_argument("--keep", action="store_true", help=f"keep database {DB_NAME}")
    parser.add_argument(
        "--reuse", action="store_true", help="measure the set a --keep run left again; keeps it"
    )
    args = parser.parse_args()
    args.keep = args.keep or args.reuse
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    port = stack.free_port()
    scratch = tempfile.TemporaryDirectory(prefix="bench-notice-")
    env = {
        **os.environ,
        **benchdb.bench_env(db_name=DB_NAME, redis_db=REDIS_DB, queue=QUEUE),
        "ALLOWED_HOSTS": "127.0.0.1,testserver",
        "STATIC_ROOT": scratch.name,  # WhiteNoise wants it to exist when DEBUG is off
        "PROMETHEUS_MULTIPROC_DIR": scratch.name,
        "METADATA_TRUSTED_PROXIES": "127.0.0.1",
    }
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    if not args.reuse:
        benchdb.database_create(env["DATABASE_URL"])
    benchdb.redis_forget(env["REDIS_URL"], QUEUE)
    processes = []
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        started = time.perf_counter()
        fleet = existing() if args.reuse else build(args.nodes)
        built = time.perf_counter() - started
        args.nodes = fleet.node_count
        processes.append(stack.server_start(port, env, workers=1))
        processes.append(stack.celery_start(env, Path(scratch.name) / "worker.log"))
        return run(f"http://127.0.0.1:{port}", fleet, args, built=built)
    finally:
        for process in processes:
            stack.process_stop(process)
        from django.db import connections

        connections.close_all()
        if args.keep:
            print(f"\nkept database {DB_NAME} (drop it when done)")
        else:
            benchdb.database_drop(env["DATABASE_URL"])
        benchdb.redis_forget(env["REDIS_URL"], QUEUE)
        log = Path(scratch.name) / "worker.log"
        if log.exists() and "Traceback" in log.read_text():
            print(f"\nthe worker logged errors:\n{log.read_text()[-3000:]}")
        scratch.cleanup()


def build(nodes: int) -> set_page.BenchFleet:
    """The set, built by the services; then its notices last a day, a tenant may log in, and
    the set enforces, its first plan applied."""
    from gpucap.fleet import services as fleet_services
    from gpucap.plans import services as plans
    from gpucap.tenancy import services as tenancy

    fleet = set_page.BenchFleet(random.Random(set_page.SEED))
    fleet.grow(nodes)
    fleet_services.capacity_set_update(
        capacity_set=fleet.capacity_set, notice_seconds=NOTICE_SECONDS, actor=fleet.operator
    )
    user = tenancy.user_create(username=USERNAME, password=PASSWORD)
    tenancy.membership_set(user=user, tenant=fleet.tenants["acme"], role="member")
    benchdb.vacuum_analyze()
    plans.capacity_set_set_mode(
        capacity_set=fleet.capacity_set, mode="enforce", actor=fleet.operator
    )
    quiet(fleet)
    return fleet


def quiet(fleet: set_page.BenchFleet) -> None:
    """Plan the set here until its plan is current (the first enforced plan, and the replans
    its notices ask for), then drop the tasks that left queued (driver calls for VMs no
    hypervisor runs, replans already made), so that the worker does only what each request
    asks; and fill the metadata store as a full resync fills it."""
    from django.conf import settings

    from gpucap.notices.cache import metadata_resync
    from gpucap.plans import services as plans

    for _ in range(10):
        tick = plans.capacity_set_tick(capacity_set_id=fleet.capacity_set.pk)
        fleet.capacity_set.refresh_from_db()
        if tick.plan.generation == fleet.capacity_set.generation:
            break
    benchdb.redis_forget(settings.CELERY_BROKER_URL, QUEUE)
    metadata_resync()


def existing() -> set_page.BenchFleet:
    """The set a ``--keep`` run left, quiet again."""
    fleet = set_page.BenchFleet.existing()
    fleet.tenants = {}
    quiet(fleet)
    return fleet


def run(base: str, fleet: set_page.BenchFleet, args, *, built: float) -> int:
    from django.conf import settings

    session = requests.Session()
    answer = session.post(
        f"{base}/api/token/", data={"username": USERNAME, "password": PASSWORD}, timeout=30
    )
    answer.raise_for_status()
    session.headers["Authorization"] = f"Token {answer.json()['token']}"
    counts = fleet.counts()
    print("notice latency: on-demand request -> its victims' notices sent, through the stack")
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, uvicorn + 1 Celery worker, "
        f"{args.nodes:,} nodes x 8 GPUs ({counts['running']:,} running VMs, "
        f"{counts['pending']:,} pending) built in {built:.0f} s, enforce mode, "
        f"PLANS_DEBOUNCE_SECONDS {settings.PLANS_DEBOUNCE_SECONDS}\n"
    )
    settle(fleet, what="the first enforced plan")
    measure(base, session, fleet, 0)  # a warm-up: the worker's first tick opens its connections
    settle(fleet, what="the warm-up request")
    samples = []
    for number in range(1, args.requests + 1):
        sample = measure(base, session, fleet, number)
        samples.append(sample)
        print(
            f"  request {number:>2}: {sample['total']:.3f} s, {sample['victims']} victim(s) "
            f"(API {sample['api']:.3f} s, planning from {sample['planned_from']:.3f} s for "
            f"{sample['planning']:.3f} s, stored {sample['stored']:.3f} s, metadata "
            f"{sample['metadata']:.3f} s) load {os.getloadavg()[0]:.1f}"
        )
        settle(fleet, what=f"request {number}")
    return report(samples, args.nodes)


def measure(base: str, session: requests.Session, fleet: set_page.BenchFleet, number: int):
    from gpucap.notices.models import InterruptionNotice
    from gpucap.plans.models import Plan, PlanAction

    pool = fleet.pools["bench-ondemand"]
    started = time.time()
    answer = session.post(
        f"{base}/api/vms/",
        json={
            "pool": pool.pk,
            "name": f"notice-bench-{started:.0f}-{number}",
            "gpu_count": 8,
            "image": "ubuntu-24.04-cuda-12.6",
            "ssh_public_key": set_page.SSH_KEY,
        },
        timeout=30,
    )
    if answer.status_code != 201:
        raise SystemExit(f"POST /api/vms/ answered {answer.status_code}: {answer.text}")
    answered = time.time()
    vm_id = answer.json()["id"]
    deadline = time.monotonic() + PATIENCE_SECONDS
    victims = None
    while time.monotonic() < deadline:
        actions = list(
            PlanAction.objects.filter(
                for_vm_id=vm_id, kind=PlanAction.Kind.PREEMPTION, plan__status=Plan.Status.APPLIED
            ).select_related("vm", "plan")
        )
        if actions:
            open_notices = InterruptionNotice.objects.filter(
                vm_id__in=[a.vm_id for a in actions], completed_at=None
            ).count()
            if open_notices == len(actions):
                victims = actions
                break
        time.sleep(POLL_SECONDS)
    if victims is None:
        raise SystemExit(f"request {number}: no applied plan notified victims for it in time")
    committed = time.time()
    waiting = {a.vm.ip_address for a in victims}
    while waiting and time.monotonic() < deadline:
        waiting = {address for address in waiting if not notice_served(base, address)}
        if waiting:
            time.sleep(POLL_SECONDS)
    if waiting:
        raise SystemExit(f"request {number}: the metadata endpoint never served {waiting}")
    done = time.time()
    plan = victims[0].plan
    stored = plan.created_at.timestamp()
    return {
        "total": done - started,
        "victims": len(victims),
        "api": answered - started,
        # The plan row is created right after planning (the tick read its snapshot before).
        "planning": plan.planning_ms / 1000,
        "planned_from": stored - plan.planning_ms / 1000 - started,
        "stored": stored - started,
        "committed": committed - started,
        "metadata": done - committed,
    }


def notice_served(base: str, address: str) -> bool:
    answer = requests.get(
        f"{base}/metadata/v1/interruption", headers={"X-Forwarded-For": address}, timeout=10
    )
    return answer.status_code == 200


def settle(fleet: set_page.BenchFleet, *, what: str) -> None:
    """Wait until the set's latest plan is of its current generation, held for a moment, and
    then for the replan throttle's interval, so the next request meets a quiet set."""
    from django.conf import settings

    from gpucap.fleet.models import CapacitySet
    from gpucap.plans.models import Plan

    deadline = time.monotonic() + 300
    quiet_since = None
    while time.monotonic() < deadline:
        generation = CapacitySet.objects.values_list("generation", flat=True).get(
            pk=fleet.capacity_set.pk
        )
        latest = (
            Plan.objects.filter(capacity_set=fleet.capacity_set)
            .order_by("-created_at", "-pk")
            .values_list("generation", flat=True)
            .first()
        )
        if latest == generation:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= 0.5:
                time.sleep(settings.PLANS_DEBOUNCE_SECONDS)
                return
        else:
            quiet_since = None
        time.sleep(0.1)
    raise SystemExit(f"the set did not settle after {what}")


def report(samples: list[dict], nodes: int) -> int:
    totals = sorted(s["total"] for s in samples)
    median = statistics.median(totals)
    p90 = totals[min(len(totals) - 1, round(0.9 * (len(totals) - 1)))]
    middle = min(samples, key=lambda s: abs(s["total"] - median))
    print(
        f"\n{len(samples)} requests: median {median:.3f} s, p90 {p90:.3f} s, max {totals[-1]:.3f} s"
    )
    print(
        "median request: API answered at {api:.3f} s, planning from {planned_from:.3f} s for "
        "{planning:.3f} s, plan stored at {stored:.3f} s, notices committed by {committed:.3f} "
        "s, metadata served {metadata:.3f} s later".format(**middle)
    )
    goal = f"median < {GOAL_SECONDS:g} s at {GOAL_NODES} nodes"
    if nodes != GOAL_NODES:
        print(f"goal ({goal}): not measured at {nodes} nodes")
        return 0
    passed = median < GOAL_SECONDS
    print(
        f"{'PASS' if passed else 'FAIL'} {nodes} nodes: on-demand request -> victims' notices "
        f"sent, median {median:.3f} s, p90 {p90:.3f} s (target: {goal})"
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
