"""``/metrics``: the fleet in Prometheus' text format, for operators and for a Prometheus server
holding ``METRICS_TOKEN``.

A scrape answers from three sources:

- the fleet as the database has it now (GPUs by state per capacity set, pools against their
  floors, pending demand, open notices, VMs, inference replicas), read by `FleetCollector` in a
  fixed number of queries however large the fleet is;
- the shared counters every process adds to in Redis (`gpucap.metrics.SHARED_COUNTERS`: plans
  made and applied, Celery task failures and retries), in one round trip;
- the request counters and latency histograms of the serving processes (`gpucap.metrics`:
  instance metadata endpoint, inference router). The web server runs several uvicorn workers;
  with ``PROMETHEUS_MULTIPROC_DIR`` set (the Procfile sets it and empties it at start), each
  worker writes its own file there and a scrape adds them all up, whichever worker answers it.
"""

import hmac
import logging
import os
from collections import Counter, defaultdict
from collections.abc import Iterator
from functools import cache

import redis
from django.conf import settings
from django.db.models import (
    Count,
    F,
    Func,
    IntegerField,
    OuterRef,
    Q,
    Subquery,
    Sum,
)
from django.db.models.functions import Coalesce, Greatest
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client import REGISTRY, CollectorRegistry, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from gpucap import metrics
from gpucap.celery import app
from gpucap.fleet.models import CapacitySet, Gpu, Node, Pool
from gpucap.fleet.selectors import with_holders
from gpucap.inference.models import InferenceDeployment
from gpucap.inference.services import LIVE
from gpucap.notices.models import InterruptionNotice
from gpucap.rentals.models import VirtualMachine
from gpucap.roles import is_operator
from gpucap.usage.models import BillingWebhook, UsageRecord

logger = logging.getLogger(__name__)

State = VirtualMachine.State
# What a GPU is doing, as ``gpucap_gpus{state=}`` says it; the states add up to the set's GPUs.
GPU_STATES = ("free", "held", "reserved", "failed", "unavailable")


# --- the view ------------------------------------------------------------------------------------


@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(scrape_registry()), content_type=content_type)


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """None when the caller may read the metrics: a bearer token equal to ``METRICS_TOKEN``
    (compared in constant time), or an operator's session. A wrong token is refused even with
    a session, so a misconfigured scraper is noticed."""
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        expected = settings.METRICS_TOKEN
        if expected and hmac.compare_digest(credentials.strip().encode(), expected.encode()):
            return None
        return _unauthorized()
    if is_operator(request.user):
        return None
    if request.user.is_authenticated:
        return HttpResponse("/metrics is for operators.\n", status=403, content_type="text/plain")
    return _unauthorized()


def _unauthorized() -> HttpResponse:
    response = HttpResponse(
        "/metrics needs an operator's session or Authorization: Bearer <METRICS_TOKEN>.\n",
        status=401,
        content_type="text/plain",
    )
    response["WWW-Authenticate"] = 'Bearer realm="gpucap metrics"'
    return response


def scrape_registry() -> CollectorRegistry:
    """What one scrape exposes. Built per scrape: the fleet is read only when asked for."""
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Every worker's files, this one's included (prometheus_client's documented setup).
        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_ThisProcess())
    registry.register(FleetCollector())
    registry.register(SharedCountersCollector())
    return registry


class _ThisProcess:
    """Outside multiprocess mode: this process's own metrics (and its process_* gauges)."""

    def collect(self) -> Iterator[Metric]:
        return REGISTRY.collect()


# --- counters shared through Redis ---------------------------------------------------------------


class SharedCountersCollector:
    """`gpucap.metrics.SHARED_COUNTERS`, each at 0 for the label values known to exist (every
    capacity set and mode, every registered task), so a first increment shows as one."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "gpucap_shared_counters_up",
            "1 when the counters kept in Redis (plans, Celery tasks) could be read.",
        )
        try:
            counts = metrics.shared_counts()
        except redis.RedisError as exc:
            logger.warning("metrics: the shared counters could not be read: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        sets = list(CapacitySet.objects.values_list("name", flat=True))
        tasks = _task_names()
        known = {
            metrics.PLANS_MADE: [(s, m) for s in sets for m in CapacitySet.Mode.values],
            metrics.PLANS_FOLDED: [(s,) for s in sets],
            metrics.PLANS_APPLIED: [(s, m) for s in sets for m in CapacitySet.Mode.values],
            metrics.CELERY_TASK_FAILURES: [(t,) for t in tasks],
            metrics.CELERY_TASK_RETRIES: [(t,) for t in tasks],
            metrics.ON_COMMIT_FAILURES: [],
        }
        for counter, values in counts.items():
            family = CounterMetricFamily(
                counter.name, counter.documentation, labels=counter.labelnames
            )
            for labels in sorted({*known[counter], *values}):
                family.add_metric(list(labels), values.get(labels, 0))
            yield family


@cache
def _task_names() -> tuple[str, ...]:
    """Every gpucap task, once per process: a web process imports the task modules a worker
    would (the tasks it only sends by name are not imported otherwise)."""
    app.loader.import_default_modules()
    return tuple(sorted(name for name in app.tasks if not name.startswith("celery.")))


# --- the fleet, from the database ----------------------------------------------------------------


class FleetCollector:
    """Gauges read from the database at scrape time: seven queries, whatever the fleet's size."""

    def collect(self) -> Iterator[Metric]:
        yield from self._gpus_and_pools()
        yield self._notices_open()
        yield self._vms()
        yield from self._inference_replicas()
        yield from self._billing()

    def _gpus_and_pools(self) -> Iterator[Metric]:
        sets = list(CapacitySet.objects.values_list("name", "cluster__name", "mode"))
        gpus, held_by_pool, reserved_for_pool = _gpu_counts()
        gauge = GaugeMetricFamily(
            "gpucap_gpus",
            "GPUs by capacity set and state (set is empty for standalone nodes): free, held by "
            "a VM, reserved (held by a VM stopping for another VM's placement), failed, or "
            "unavailable (on a node that is not ready). The states add up to the set's GPUs.",
            labels=("cluster", "set", "state"),
        )
        places = {(cluster, name) for name, cluster, _ in sets} | set(gpus)
        for cluster, name in sorted(places):
            for state in GPU_STATES:
                gauge.add_metric([cluster, name, state], gpus[cluster, name][state])
        yield gauge

        enforcing = GaugeMetricFamily(
            "gpucap_capacity_set_enforcing",
            "1 when the capacity set applies every plan as it is made; 0 in dry-run.",
            labels=("set",),
        )
        for name, _, mode in sets:
            enforcing.add_metric([name], int(mode == CapacitySet.Mode.ENFORCE))
        yield enforcing

        labels = ("pool", "kind", "set")
        held = GaugeMetricFamily(
            "gpucap_pool_gpus_held",
            "GPUs held by the pool's VMs (those under notice included).",
            labels=labels,
        )
        floor = GaugeMetricFamily(
            "gpucap_pool_floor_gpus",
            "GPUs the arbiter never reclaims the pool below: its floor in force (the capacity "
            "set's schedule's, else its own).",
            labels=labels,
        )
        reserved = GaugeMetricFamily(
            "gpucap_pool_gpus_reserved",
            "GPUs other VMs are giving up for the pool's VMs (held by them until they stop).",
            labels=labels,
        )
        pending = GaugeMetricFamily(
            "gpucap_pool_pending_gpus",
            "GPUs the pool's pending VMs ask for (demand waiting for capacity).",
            labels=labels,
        )
        for pool in _pools():
            values = [pool["name"], pool["kind"], pool["capacity_set__name"] or ""]
            held.add_metric(values, held_by_pool[pool["pk"]])
            reserved.add_metric(values, reserved_for_pool[pool["pk"]])
            floor.add_metric(values, pool["floor_in_force"])
            pending.add_metric(values, pool["pending_gpus"])
        yield from (held, reserved, floor, pending)

    def _notices_open(self) -> Metric:
        open_by_reason = dict(
            InterruptionNotice.objects.filter(completed_at=None)
            .values_list("reason")
            .annotate(n=Count("pk"))
            .order_by()
        )
        gauge = GaugeMetricFamily(
            "gpucap_notices_open",
            "Interruption notices whose VM has not stopped yet, by reason (arbiter, drain, "
            "reclaim).",
            labels=("reason",),
        )
        for reason in InterruptionNotice.Reason.values:
            gauge.add_metric([reason], open_by_reason.get(reason, 0))
        return gauge

    def _vms(self) -> Metric:
        counts = {
            (state, kind): n
            for state, kind, n in VirtualMachine.objects.values_list("state", "pool__kind")
            .annotate(n=Count("pk"))
            .order_by()
        }
        gauge = GaugeMetricFamily(
            "gpucap_vms",
            "VMs (rentals and inference replicas) by state and pool kind.",
            labels=("state", "kind"),
        )
        for state in State.values:
            for kind in Pool.Kind.values:
                gauge.add_metric([state, kind], counts.get((state, kind), 0))
        return gauge

    def _inference_replicas(self) -> Iterator[Metric]:
        deployments = (
            InferenceDeployment.objects.annotate(
                ready=Count(
                    "replicas",
                    filter=Q(replicas__state=State.RUNNING, replicas__probe__ready=True)
                    & ~Q(replicas__endpoint_url=""),
                ),
                target=Count("replicas", filter=Q(replicas__state__in=LIVE)),
                # The range in force (InferenceDeployment.min/max_replicas_in_force, in SQL).
                low=Coalesce("scheduled_min_replicas", "min_replicas"),
            )
            .annotate(high=Greatest(Coalesce("scheduled_max_replicas", "max_replicas"), "low"))
            .values_list("slug", "ready", "target", "low", "high")
            .order_by("slug")
        )
        families = {
            "ready": GaugeMetricFamily(
                "gpucap_inference_replicas_ready",
                "Replicas the router sends requests to (running, and their model server "
                "answered its readiness probe).",
                labels=("deployment",),
            ),
            "target": GaugeMetricFamily(
                "gpucap_inference_replicas_target",
                "Replicas the deployment has asked for: pending, booting or running.",
                labels=("deployment",),
            ),
            "min": GaugeMetricFamily(
                "gpucap_inference_replicas_min",
                "min_replicas in force (the capacity set's schedule's, else the deployment's).",
                labels=("deployment",),
            ),
            "max": GaugeMetricFamily(
                "gpucap_inference_replicas_max",
                "max_replicas in force (the capacity set's schedule's, else the deployment's).",
                labels=("deployment",),
            ),
        }
        for slug, ready, target, low, high in deployments:
            for key, value in (("ready", ready), ("target", target), ("min", low), ("max", high)):
                families[key].add_metric([slug], value)
        yield from families.values()

    def _billing(self) -> Iterator[Metric]:
        """Usage records the billing webhook has yet to deliver (above the receiver's cursor:
        an index range count), when a webhook is configured."""
        waiting = (
            UsageRecord.objects.filter(pk__gt=OuterRef("cursor"))
            .order_by()
            .annotate(n=Func(F("pk"), function="COUNT"))
            .values("n")
        )
        webhook = (
            BillingWebhook.objects.filter(pk=BillingWebhook.SINGLETON)
            .annotate(waiting=Subquery(waiting, output_field=IntegerField()))
            .values("enabled", "waiting", "consecutive_failures")
            .first()
        )
        if webhook is None:
            return
        yield GaugeMetricFamily(
            "gpucap_billing_records_waiting",
            "Usage records the billing webhook's receiver has not accepted yet.",
            value=webhook["waiting"],
        )
        yield GaugeMetricFamily(
            "gpucap_billing_webhook_enabled",
            "1 when usage records are pushed to the billing webhook.",
            value=int(webhook["enabled"]),
        )
        yield GaugeMetricFamily(
            "gpucap_billing_webhook_consecutive_failures",
            "Deliveries to the billing webhook that failed since the last accepted one.",
            value=webhook["consecutive_failures"],
        )


def _gpu_counts() -> tuple[dict, Counter, Counter]:
    """GPUs by (cluster, set) and state, GPUs held by pool id, and GPUs reserved for a pool id
    (held by VMs stopping for its VMs): one grouped query."""
    rows = (
        with_holders(Gpu.objects.all())
        .values(
            "health",
            cluster=F("node__cluster__name"),
            set=F("node__capacity_set__name"),
            node_state=F("node__state"),
            pool=F("live__vm__pool_id"),
            # The pool of the VM the holder stops for: the GPUs are reserved for it.
            reserved_for=F("live__vm__preempted_for__pool_id"),
        )
        .annotate(n=Count("pk"))
        .order_by()
    )
    gpus: dict[tuple[str, str], Counter] = defaultdict(Counter)
    held_by_pool: Counter = Counter()
    reserved_for_pool: Counter = Counter()
    for row in rows:
        place = (row["cluster"], row["set"] or "")
        if row["pool"] is not None:
            held_by_pool[row["pool"]] += row["n"]
        if row["reserved_for"] is not None:
            reserved_for_pool[row["reserved_for"]] += row["n"]
        if row["health"] == Gpu.Health.FAILED:
            state = "failed"
        elif row["pool"] is not None:
            state = "reserved" if row["reserved_for"] is not None else "held"
        elif row["node_state"] != Node.State.READY:
            state = "unavailable"
        else:
            state = "free"
        gpus[place][state] += row["n"]
    return gpus, held_by_pool, reserved_for_pool


def _pools() -> list[dict]:
    pending = (
        VirtualMachine.objects.filter(pool=OuterRef("pk"), state=State.PENDING)
        .order_by()
        .values("pool")
        .annotate(total=Sum("gpu_count"))
        .values("total")
    )
    return list(
        Pool.objects.annotate(
            pending_gpus=Coalesce(Subquery(pending, output_field=IntegerField()), 0),
            floor_in_force=Coalesce("scheduled_floor_gpus", "floor_gpus"),
        )
        .values("pk", "name", "kind", "capacity_set__name", "floor_in_force", "pending_gpus")
        .order_by("name")
    )
