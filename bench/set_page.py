"""Does the capacity set page stay fast on a 2,000-node set? (``make bench``)

Builds one NVSwitch H100 capacity set in a PostgreSQL database of its own (DB_NAME, created and
migrated here, dropped at the end) and grows it through three sizes: 200, 1,000 and 2,000 nodes
x 8 GPUs. Everything is written by the real services, one transaction per node:
``gpucap.fleet.services`` (cluster, set, nodes, pools, tenants, floors, cordons, failed GPUs)
and ``gpucap.rentals.services`` (``vm_request`` -> ``vm_place`` -> ``vm_mark_running``), so the
rows (GPUs, VMs, allocations, usage intervals, audit events, generations) are exactly the ones
production has. Their Celery tasks and Redis writes go to a queue and a Redis database of the
bench's own (REDIS_DB or BENCH_REDIS_URL, its keys deleted before and after); no worker consumes
them.

Each node gets running VMs of mixed sizes (1/2/4/8 GPUs, on its own partition table; one in
five nodes has the HGX non-adjacent pairs) until 2-8 of its GPUs are held (about three quarters
of the set; no node is left empty), from four tenants in four pools (inference replicas rank 1
with a floor, on-demand rank 2, spot rank 3, low spot rank 4). Inference VMs are replicas of
deployments (``gpucap.inference.services.deployment_create``, up to 48 replicas each,
``min_replicas`` half of them); their pending ones are scale-ups of one or two replicas asked
for by ``replicas_scale`` as one group. Every new node brings 0.2 pending demands of 1-8 GPUs;
many are 8-GPU on-demand and inference VMs that no free partition fits, so the plan reclaims
spot VMs for them. 2 % of nodes are cordoned, 1 % down, 1 % have a failed GPU. At each size the
set is planned with ``capacity_set_tick`` (timed: "plan s"), then the page is measured (after a
VACUUM ANALYZE, as autovacuum keeps a live database). Building through the services takes a few
minutes (about 0.1 s a node).

The page: ``GET /fleet/sets/<name>/`` as an operator through ``django.test.Client``, in this
process, so the times are server time: middleware, view, selectors, SQL and template render
(no network, no browser). REQUESTS requests after WARMUPS warm-ups; median and p90, the
queries of one request (``CaptureQueriesContext``), and where the median request's time goes:
SQL (every query's execute time) and render (the template's render, lazy queries included).
The same for the page's one poll (``fleet:capacity-set-live``, issue 15: every live region
when something changed, measured with a stale key; 204 when nothing did, measured with the
page's own key) and the what-if preview POST (pool ``bench-ondemand`` asks for 32
more GPUs in 8-GPU blocks). Wall times move with the machine's load (printed per size); the
CPU column (this process's CPU time per request) moves much less.

Goals: under 300 ms median server time at 2,000 nodes, with a query count that does not grow
with the set (issue 6); the what-if preview under 300 ms median at 2,000 nodes (issue 17). The
what-if is asked again and again as an operator types into its form: its median is of the same
question at one generation of the set, as the form asks it (the first read of the set after a
change is among the warm-ups); "what-if cold" is the first question after a change, which reads
the set from the database.

``--profile`` adds a cProfile of full-page requests at the largest size; ``--keep`` keeps
the database, and ``--reuse`` measures the set it holds again without building it.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import random
import re
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import benchdb

ROOT = Path(__file__).resolve().parent.parent
SIZES = (200, 1000, 2000)
GOAL_NODES = 2000
GOAL_MS = 300
GOAL_WHAT_IF_MS = 300  # issue 17, build 6
REQUESTS = 15
WARMUPS = 2
PROFILED = 5  # requests under --profile
SEED = 20261129
DB_NAME = benchdb.database_name("gpucap_bench_setpage")
REDIS_DB = 12
SET_NAME = "h100-bench"
GPU_MODEL = "H100-SXM5-80GB"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGJlbmNoLW9ubHkta2V5LWZvci1ncHVjYXA bench@gpucap"

HGX_PAIRS = [
    [0, 1, 2, 3, 4, 5, 6, 7],
    [0, 1, 2, 3],
    [4, 5, 6, 7],
    [0, 2],
    [1, 3],
    [4, 6],
    [5, 7],
    *([index] for index in range(8)),
]
DEFAULT_TABLE = [
    [0, 1, 2, 3, 4, 5, 6, 7],
    [0, 1, 2, 3],
    [4, 5, 6, 7],
    [0, 1],
    [2, 3],
    [4, 5],
    [6, 7],
    *([index] for index in range(8)),
]
TENANTS = (("acme", "Acme AI"), ("globex", "Globex Research"), ("initech", "Initech"))
TENANTS += (("umbrella", "Umbrella Labs"),)
# (name, kind, rank, tenants, share of running VMs, share of pending demands)
POOLS = (
    ("bench-inference", "inference", 1, ("acme", "globex"), 0.20, 0.20),
    ("bench-ondemand", "on_demand", 2, ("acme", "globex", "initech"), 0.30, 0.45),
    ("bench-spot", "spot", 3, ("acme", "initech", "umbrella"), 0.30, 0.20),
    ("bench-spot-low", "spot", 4, ("globex", "umbrella"), 0.20, 0.15),
)
INFERENCE_FLOOR = 0.10  # of the set's GPUs
HELD_PER_NODE = (2, 3, 4, 5, 6, 7, 8, 8)  # GPUs a node's running VMs aim to hold
VM_SIZES = ((8, 0.10), (4, 0.25), (2, 0.30), (1, 0.35))
DEMANDS_PER_NODE = 0.2
DEMAND_SIZES = ((8, 0.35), (4, 0.25), (2, 0.20), (1, 0.20))
REPLICAS_PER_DEPLOYMENT = 48  # a new deployment after this many replicas (of at most 64)
MAX_REPLICAS = 64


def bench_env() -> dict[str, str]:
    return benchdb.bench_env(db_name=DB_NAME, redis_db=REDIS_DB, queue="bench-set-page")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="node counts")
    parser.add_argument("--profile", action="store_true", help="cProfile page requests")
    parser.add_argument("--keep", action="store_true", help=f"keep database {DB_NAME}")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="measure the set a --keep run left (at its size) instead of building; keeps it",
    )
    args = parser.parse_args()
    sizes = sorted(int(size) for size in args.sizes.split(","))
    keep = args.keep or args.reuse

    env = bench_env()
    # WhiteNoise wants STATIC_ROOT to exist when DEBUG is off; the page needs no static files.
    static_root = tempfile.TemporaryDirectory(prefix="bench-set-page-static-")
    env["STATIC_ROOT"] = static_root.name
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    if not args.reuse:
        benchdb.database_create(env["DATABASE_URL"])
    benchdb.redis_forget(env["REDIS_URL"], env["CELERY_TASK_DEFAULT_QUEUE"])
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        return run(sizes, profile=args.profile, reuse=args.reuse)
    finally:
        from django.db import connections

        connections.close_all()
        if keep:
            print(f"\nkept database {DB_NAME} (--reuse measures it again; drop it when done)")
        else:
            benchdb.database_drop(env["DATABASE_URL"])
        benchdb.redis_forget(env["REDIS_URL"], env["CELERY_TASK_DEFAULT_QUEUE"])
        static_root.cleanup()


def run(sizes: list[int], *, profile: bool, reuse: bool) -> int:
    print("capacity set page: GET /fleet/sets/<name>/ in-process (django.test.Client), DEBUG off")
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
        f"PostgreSQL {benchdb.postgres_version()}, "
        f"median/p90 of {REQUESTS} requests after {WARMUPS} warm-ups\n"
    )
    if reuse:
        fleet = BenchFleet.existing()
        sizes = [fleet.node_count]
    else:
        fleet = BenchFleet(random.Random(SEED))
    rows = []
    for nodes in sizes:
        started = time.perf_counter()
        if not reuse:
            fleet.grow(nodes)
        built = time.perf_counter() - started
        # As autovacuum leaves a live database: statistics and visibility map.
        benchdb.vacuum_analyze()
        plan, plan_seconds = fleet.plan()
        load = os.getloadavg()[0]
        measured = measure(fleet)
        rows.append((nodes, fleet.counts(), built, plan, plan_seconds, measured))
        print(
            f"  {nodes:,} nodes built in {built:.0f} s, planned in {plan_seconds:.2f} s, "
            f"measured at load average {load:.1f}"
        )
    print()
    report(rows)
    if profile:
        profile_request(fleet)
    return verdict(rows)


# --- the fleet --------------------------------------------------------------------------------


class BenchFleet:
    """One capacity set, grown node by node through the services."""

    def __init__(self, rng: random.Random) -> None:
        from django.contrib.auth.models import Group, User

        from gpucap.fleet import services as fleet
        from gpucap.roles import OPERATORS_GROUP
        from gpucap.tenancy.models import Tenant

        self.rng = rng
        self.operator = User.objects.create_user("bench-operator", is_staff=True)
        self.operator.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])
        self.tenants = {slug: Tenant.objects.create(slug=slug, name=name) for slug, name in TENANTS}
        self.cluster = fleet.cluster_create(name="bench", actor=self.operator)
        # The catalogue the VMs below choose from: a rental image and a replica image.
        for name, ports in (("ubuntu-24.04-cuda-12.6", []), ("gpucap-model-server", [8000])):
            fleet.image_create(
                cluster=self.cluster,
                name=name,
                base_image=f"/var/lib/gpucap/images/{name}.qcow2",
                ports=ports,
                actor=self.operator,
            )
        self.capacity_set = fleet.capacity_set_create(
            cluster=self.cluster,
            name=SET_NAME,
            gpu_model=GPU_MODEL,
            fabric="nvswitch",
            actor=self.operator,
        )
        self.pools = {}
        self.pool_tenants = {}
        for name, kind, rank, tenants, _, _ in POOLS:
            pool = fleet.pool_create(
                name=name,
                kind=kind,
                cluster=self.cluster,
                capacity_set=self.capacity_set,
                rank=rank,
                actor=self.operator,
            )
            fleet.pool_set_tenants(
                pool=pool, tenants=[self.tenants[t] for t in tenants], actor=self.operator
            )
            self.pools[name] = pool
            self.pool_tenants[name] = [self.tenants[t] for t in tenants]
        self.node_count = 0
        self.vm_count = 0
        self.deployments = {}  # GPUs per replica -> the deployment new replicas join
        self.replicas = {}  # deployment -> its replicas (running and pending)

    @classmethod
    def existing(cls) -> BenchFleet:
        """The set a ``--keep`` run left, as it is."""
        from django.contrib.auth.models import User

        from gpucap.fleet.models import CapacitySet

        fleet = cls.__new__(cls)
        fleet.operator = User.objects.get(username="bench-operator")
        fleet.capacity_set = CapacitySet.objects.get(name=SET_NAME)
        fleet.pools = {pool.name: pool for pool in fleet.capacity_set.pools.all()}
        fleet.node_count = fleet.capacity_set.nodes.count()
        return fleet

    def grow(self, to_nodes: int) -> None:
        from gpucap.fleet import services as fleet
        from gpucap.fleet.models import Pool

        first = self.node_count
        for number in range(first + 1, to_nodes + 1):
            self.add_node(number)
        self.node_count = to_nodes
        inference = self.pools["bench-inference"]
        floor = int(to_nodes * 8 * INFERENCE_FLOOR)
        fleet.pool_set_floor(pool=inference, floor_gpus=floor, actor=self.operator)
        self.pools["bench-inference"] = Pool.objects.get(pk=inference.pk)
        for _ in range(round((to_nodes - first) * DEMANDS_PER_NODE)):
            self.add_demand()
        from gpucap.inference import services as inference

        for deployment, replicas in self.replicas.items():  # no preemption goes below half
            inference.deployment_update(
                deployment=deployment, min_replicas=replicas // 2, actor=self.operator
            )

    def add_node(self, number: int) -> None:
        from django.db import transaction

        from gpucap.fleet import services as fleet
        from gpucap.rentals import services as rentals

        rng = self.rng
        custom = rng.random() < 0.2
        table = HGX_PAIRS if custom else DEFAULT_TABLE
        with transaction.atomic():
            node = fleet.node_create(
                cluster=self.cluster,
                hostname=f"h100-{number:05d}",
                gpu_model=GPU_MODEL,
                fabric="nvswitch",
                gpu_count=8,
                partitions=HGX_PAIRS if custom else None,
                actor=self.operator,
            )
            node = fleet.node_join_set(node=node, capacity_set=self.capacity_set)
            used: set[int] = set()
            target = rng.choice(HELD_PER_NODE)
            for _ in range(12):
                if len(used) >= target:
                    break
                size = pick(rng, VM_SIZES)
                free = [b for b in table if len(b) == size and not used & set(b)]
                if not free or len(used) + size > 8:
                    continue
                block = rng.choice(free)
                used |= set(block)
                pool = self.pools[rng.choices([p[0] for p in POOLS], [p[4] for p in POOLS])[0]]
                vm = self.request(pool, size)
                vm = rentals.vm_place(vm=vm, node=node, gpu_indices=block)
                rentals.vm_mark_running(vm=vm, ip_address=vm_address(vm.pk))
            roll = rng.random()
            if roll < 0.01:
                free_gpus = sorted(set(range(8)) - used)
                if free_gpus:
                    gpu = node.gpus.get(index=rng.choice(free_gpus))
                    fleet.gpu_set_health(gpu=gpu, health="failed", actor=self.operator)
            elif roll < 0.03:
                fleet.node_cordon(node=node, actor=self.operator)
            elif roll < 0.04:
                fleet.node_set_state(node=node, state="down", actor=self.operator)

    def add_demand(self) -> None:
        from gpucap.inference import services as inference

        rng = self.rng
        pool = self.pools[rng.choices([p[0] for p in POOLS], [p[5] for p in POOLS])[0]]
        size = pick(rng, DEMAND_SIZES)
        if pool.kind != "inference":
            self.request(pool, size)
            return
        # A deployment scales up by one or two replicas: one demand group, all or none.
        more = rng.choice((1, 1, 2))
        deployment = self.deployment(size, more)
        inference.replicas_scale(
            deployment=deployment,
            to=self.replicas[deployment],
            reason="bench: the queue grew",
            actor=self.operator,
        )

    def deployment(self, gpus_per_replica: int, replicas: int = 1):
        """The deployment of ``gpus_per_replica`` that takes the next ``replicas`` replicas (a
        new one, of a tenant of the inference pool, when the last is full)."""
        from gpucap.inference import services as inference

        current = self.deployments.get(gpus_per_replica)
        if current is None or self.replicas[current] + replicas > REPLICAS_PER_DEPLOYMENT:
            number = len(self.replicas) + 1
            current = inference.deployment_create(
                tenant=self.rng.choice(self.pool_tenants["bench-inference"]),
                pool=self.pools["bench-inference"],
                name=f"model-{number:03d}",
                model_name=f"bench/model-{number:03d}-{gpus_per_replica}gpu",
                gpus_per_replica=gpus_per_replica,
                min_replicas=0,
                max_replicas=MAX_REPLICAS,
                actor=self.operator,
            )
            self.deployments[gpus_per_replica] = current
            self.replicas[current] = 0
        self.replicas[current] += replicas
        return current

    def request(self, pool, gpu_count: int):
        """A tenant's VM, or a replica of an inference deployment (as
        ``gpucap.inference.services.replicas_scale`` asks for one)."""
        from gpucap.rentals import services as rentals
        from gpucap.rentals.models import VirtualMachine

        self.vm_count += 1
        if pool.kind == "inference":
            deployment = self.deployment(gpu_count)
            return rentals.vm_request(
                tenant=deployment.tenant,
                pool=pool,
                name=f"{deployment.name}-r{self.replicas[deployment]}",
                gpu_count=gpu_count,
                image="gpucap-model-server",
                ssh_public_key=SSH_KEY,
                role=VirtualMachine.Role.INFERENCE_REPLICA,
                deployment=deployment,
            )
        return rentals.vm_request(
            tenant=self.rng.choice(self.pool_tenants[pool.name]),
            pool=pool,
            name=f"vm-{self.vm_count:06d}",
            gpu_count=gpu_count,
            image="ubuntu-24.04-cuda-12.6",
            ssh_public_key=SSH_KEY,
        )

    def plan(self):
        from gpucap.plans.services import capacity_set_tick

        started = time.perf_counter()
        tick = capacity_set_tick(capacity_set_id=self.capacity_set.pk)
        return tick.plan, time.perf_counter() - started

    def counts(self) -> dict:
        from gpucap.fleet.models import Gpu
        from gpucap.rentals.models import Allocation, VirtualMachine

        in_set = {"pool__capacity_set": self.capacity_set}
        gpus = Gpu.objects.filter(node__capacity_set=self.capacity_set).count()
        held = Allocation.objects.filter(
            released_at=None, gpu__node__capacity_set=self.capacity_set
        ).count()
        return {
            "gpus": gpus,
            "held": held,
            "running": VirtualMachine.objects.filter(state="running", **in_set).count(),
            "pending": VirtualMachine.objects.filter(state="pending", **in_set).count(),
        }


def pick(rng: random.Random, weighted: tuple[tuple[int, float], ...]) -> int:
    return rng.choices([value for value, _ in weighted], [weight for _, weight in weighted])[0]


def vm_address(pk: int) -> str:
    return f"10.{64 + (pk >> 16) % 64}.{(pk >> 8) % 256}.{pk % 256}"


# --- measuring --------------------------------------------------------------------------------


class Timings:
    """Per request: SQL time (every query executed) and template render time."""

    def __init__(self) -> None:
        self.sql = 0.0
        self.render = 0.0


@contextmanager
def instrumented(timings: Timings):
    from django.db import connection
    from django.template.backends.django import Template

    def sql_wrapper(execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            timings.sql += time.perf_counter() - started

    original = Template.render

    def render(self, context=None, request=None):
        started = time.perf_counter()
        try:
            return original(self, context, request)
        finally:
            timings.render += time.perf_counter() - started

    Template.render = render
    try:
        with connection.execute_wrapper(sql_wrapper):
            yield
    finally:
        Template.render = original


def timed_requests(send) -> dict:
    """Warm up, count one request's queries, then time REQUESTS requests."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(WARMUPS):
        send()
    with CaptureQueriesContext(connection) as queries:
        response = send()
    query_count = len(queries)  # now: the next request empties the connection's query log
    samples = []
    for _ in range(REQUESTS):
        timings = Timings()
        with instrumented(timings):
            started, cpu = time.perf_counter(), time.process_time()
            send()
            total, cpu = time.perf_counter() - started, time.process_time() - cpu
        samples.append((total * 1000, timings.sql * 1000, timings.render * 1000, cpu * 1000))
    samples.sort()
    totals = [s[0] for s in samples]
    middle = samples[len(samples) // 2]
    return {
        "median": statistics.median(totals),
        "p90": statistics.quantiles(totals, n=10)[-1],
        "sql": middle[1],
        "render": middle[2],
        "cpu": statistics.median(s[3] for s in samples),
        "queries": query_count,
        "bytes": len(response.content),
    }


def measure(fleet: BenchFleet) -> dict:
    from django.test import Client
    from django.urls import reverse

    client = Client()
    client.force_login(fleet.operator)

    def get(url: str, status: int = 200, **headers):
        def send():
            response = client.get(url, headers=headers)
            if response.status_code != status:
                raise SystemExit(f"GET {url} answered {response.status_code}, not {status}")
            return response

        return send

    page = reverse("fleet:capacity-set-detail", args=[SET_NAME])
    measured = {"page": timed_requests(get(page))}
    poll = set_url("fleet:capacity-set-live")
    if poll is not None:
        # The page's one poll (every 5 s per open page): with a stale key it renders every live
        # region; with the page's own key it finds nothing new and answers 204.
        measured["poll"] = timed_requests(get(f"{poll}?since=stale", HX_Request="true"))
        shown = client.get(page).content.decode()
        key = re.search(r"/live/\?since=(\w+)", shown)[1]  # the key the page polls with
        measured["poll 204"] = timed_requests(
            get(f"{poll}?since={key}", status=204, HX_Request="true")
        )
    else:  # before issue 15: the page's HTMX refresh and the plan part's own
        measured["fragment"] = timed_requests(get(page, HX_Request="true"))
        live = set_url("plans:live")
        if live is not None:
            measured["plan part"] = timed_requests(get(live, HX_Request="true"))
    what_if = what_if_request(client, fleet)
    if what_if is not None:
        measured["what-if"] = timed_requests(what_if)
        measured["what-if cold"] = timed_requests(cold(what_if))
    return measured


def cold(send):
    """``send`` as the first question after the set changed: no snapshot kept in the process
    (gpucap/plans/snapshot_cache.py), so the set is read from the database again."""
    try:
        from gpucap.plans import snapshot_cache
    except ImportError:  # before issue 17: every question read the set
        return send

    def forgetting():
        snapshot_cache.forget()
        return send()

    return forgetting


def set_url(name: str) -> str | None:
    """The URL of one of the set page's parts (``plans:what-if``, ``fleet:capacity-set-live``),
    or None while the page has no such part."""
    from django.urls import NoReverseMatch, reverse

    try:
        return reverse(name, kwargs={"name": SET_NAME})
    except NoReverseMatch:
        return None


def what_if_request(client, fleet: BenchFleet):
    """The what-if form, as the page's HTMX posts it: pool ``bench-ondemand`` asks for 32 more
    GPUs in 8-GPU blocks (no free 8-GPU partition: reclaims)."""
    url = set_url("plans:what-if")
    if url is None:
        return None
    data = {"pool": fleet.pools["bench-ondemand"].pk, "gpus": 32, "block_gpus": 8}

    def send():
        response = client.post(url, data, headers={"HX-Request": "true"})
        if response.status_code != 200:
            raise SystemExit(f"POST {url} {data} answered {response.status_code}")
        return response

    return send


def profile_request(fleet: BenchFleet) -> None:
    from django.test import Client
    from django.urls import reverse

    client = Client()
    client.force_login(fleet.operator)
    url = reverse("fleet:capacity-set-detail", args=[SET_NAME])
    client.get(url)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(PROFILED):
        client.get(url)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).sort_stats("cumulative")
    stats.print_stats(r"gpucap|template|partials", 40)
    print(
        f"\ncProfile of {PROFILED} full-page requests at {fleet.node_count:,} nodes "
        f"(cumulative; divide by {PROFILED} for one request):"
    )
    print(out.getvalue())
    query_breakdown("page", lambda: client.get(url))
    what_if = what_if_request(client, fleet)
    if what_if is not None:
        query_breakdown("what-if", what_if)


def query_breakdown(label: str, send) -> None:
    """The costliest statements of one request, alike statements (numbers aside) together, and
    every statement run more than once."""
    import re
    from collections import defaultdict

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        send()
    groups: dict[str, list[float]] = defaultdict(list)
    for query in queries.captured_queries:
        groups[re.sub(r"\b\d+\b", "N", query["sql"])].append(float(query["time"]) * 1000)
    print(f"{label}: {len(queries)} queries; costliest (ms in all, times run, statement):")
    costliest = sorted(groups.items(), key=lambda item: -sum(item[1]))
    shown = costliest[:5] + [item for item in costliest[5:] if len(item[1]) > 1]  # + repeated
    for sql, times in shown:
        print(f"  {sum(times):7.1f} {len(times):4}x  {sql[:150]}")
    print()


# --- output -----------------------------------------------------------------------------------


def report(rows) -> None:
    header = (
        f"{'nodes':>6} {'GPUs':>6} {'held':>5} {'VMs':>5} {'demands':>8} {'plan s':>7} "
        f"{'preempt':>8} {'request':<12} {'median ms':>10} {'p90 ms':>7} {'SQL ms':>7} "
        f"{'render ms':>10} {'CPU ms':>7} {'queries':>8} {'KiB':>6}"
    )
    print(header)
    print("-" * len(header))
    for nodes, counts, _, plan, plan_seconds, measured in rows:
        first = True
        for kind, figures in measured.items():
            lead = (
                f"{nodes:>6,} {counts['gpus']:>6,} {counts['held'] / counts['gpus']:>5.0%} "
                f"{counts['running']:>5,} {counts['pending']:>8,} {plan_seconds:>7.2f} "
                f"{plan.preemptions:>8,}"
                if first
                else " " * 51
            )
            first = False
            print(
                f"{lead} {kind:<12} {figures['median']:>10.1f} {figures['p90']:>7.1f} "
                f"{figures['sql']:>7.1f} {figures['render']:>10.1f} {figures['cpu']:>7.1f} "
                f"{figures['queries']:>8} "
                f"{figures['bytes'] / 1024:>6.0f}"
            )
    print(
        "\n(held: share of the set's GPUs held by running VMs; VMs: running; demands: pending "
        "VMs;\n preempt: reclaims in the plan; page: the full page; poll: its live regions (what "
        "the 5 s\n poll gets after a change); poll 204: the poll when nothing changed; what-if: "
        "the preview form's POST "
        "(32 GPUs in 8s);\n what-if cold: the same, the first after a change; SQL and "
        "render: of the median request (render includes the queries "
        "the template runs);\n CPU ms: median CPU time of this process per request (view and "
        "template, without\n PostgreSQL's own work; steadier than wall time on a busy machine); "
        "KiB: response size)"
    )
    if "what-if" not in rows[-1][5]:
        print("what-if preview: the page has no what-if URL yet; not measured")


def verdict(rows) -> int:
    """The page's goal: its median at GOAL_NODES, and fixed queries for the page and its HTMX
    refreshes (what the page costs to show). The what-if POST is reported beside it."""
    counts = {}
    for kind in rows[-1][5]:
        counts[kind] = [row[5][kind]["queries"] for row in rows if kind in row[5]]
    growing = {kind: n for kind, n in counts.items() if len(set(n)) > 1}
    steady = ", ".join(f"{kind} {n[0]}" for kind, n in counts.items() if kind not in growing)
    if len(rows) < 2:
        steady = ", ".join(f"{kind} {n[0]}" for kind, n in counts.items())
        print(f"\nquery count: one size only, cannot tell whether it is fixed ({steady})")
    elif growing:
        grows = "; ".join(f"{kind}: {' -> '.join(map(str, n))}" for kind, n in growing.items())
        print(f"\nquery count: NOT fixed across sizes ({grows}; fixed: {steady or 'none'})")
    else:
        print(f"\nquery count: fixed across sizes ({steady})")
    at_goal = [row for row in rows if row[0] == GOAL_NODES]
    goal = f"goal (<{GOAL_MS} ms median at {GOAL_NODES} nodes, fixed queries)"
    if not at_goal:
        print(f"{goal}: not measured")
        return 0
    measured = at_goal[0][5]
    compared = len(rows) > 1

    def queries(*kinds: str) -> str:
        if not compared:
            return "not compared (one size)"
        return "NOT fixed" if any(kind in growing for kind in kinds) else "fixed"

    page_queries = queries("page", "poll", "poll 204", "fragment", "plan part")
    median = measured["page"]["median"]
    met = page_queries == "fixed" and median < GOAL_MS
    print(f"{goal}: {'met' if met else 'not met'} (page {median:.0f} ms, queries {page_queries})")
    if "what-if" in measured:
        what_if = measured["what-if"]["median"]
        what_if_met = what_if < GOAL_WHAT_IF_MS
        met = met and what_if_met
        print(
            f"{'PASS' if what_if_met else 'FAIL'} what-if preview at {GOAL_NODES} nodes: "
            f"{what_if:.0f} ms median (target < {GOAL_WHAT_IF_MS} ms), queries "
            f"{queries('what-if')}"
        )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
