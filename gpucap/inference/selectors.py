"""Reads of inference deployments for the pages, each in a fixed number of queries, and the
router's live counters for them in ONE Redis round trip per page (``deployment_loads``).

A tenant member sees their own tenants' deployments and keys; another tenant's are a 404, as
if they did not exist. Operators see every deployment.
"""

import itertools
import time
from dataclasses import dataclass, field
from datetime import datetime

import redis
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, Q, QuerySet
from django.http import Http404

from gpucap.fleet.models import Pool
from gpucap.inference import cache
from gpucap.inference.models import (
    ApiKey,
    InferenceDeployment,
    Readiness,
    readiness,
    readiness_label,
    replica_probe,
)
from gpucap.inference.services import LIVE
from gpucap.notices.selectors import with_open_notice
from gpucap.rentals.models import VirtualMachine
from gpucap.rentals.selectors import vms_with_gpus
from gpucap.roles import is_operator, tenant_ids_for
from gpucap.tenancy.models import Tenant

State = VirtualMachine.State
# requests/s is the mean over this many whole seconds before the current one.
REQUESTS_WINDOW_SECONDS = 10
# The replica states a deployment's row counts, in lifecycle order. Stopped and terminated
# replicas have left: they are not counted.
COUNTED_STATES = (
    State.PENDING,
    State.PROVISIONING,
    State.RUNNING,
    State.NOTIFIED,
    State.STOPPING,
    State.FAILED,
)


# --- the router's counters -----------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """What the router's counters say about one deployment now."""

    queued: int
    in_flight: int
    per_replica: dict[str, int]  # replica instance id -> requests in flight
    requests_per_second: float

    @property
    def queue_depth(self) -> int:
        """Requests the deployment holds: waiting for a replica plus being answered."""
        return self.queued + self.in_flight


def deployment_loads(slugs: list[str], *, now: float | None = None) -> dict[str, Load] | None:
    """The load of each deployment (by slug), read in ONE pipelined Redis round trip however
    many there are. ``None`` when Redis does not answer: a page then says the load is unknown
    rather than failing."""
    slugs = list(dict.fromkeys(slugs))
    if not slugs:
        return {}
    current = int(time.time() if now is None else now)
    window = range(current - REQUESTS_WINDOW_SECONDS, current)
    pipe = cache.inference_redis().pipeline(transaction=False)
    for slug in slugs:
        pipe.get(cache.queued_key(slug))
        pipe.hgetall(cache.inflight_key(slug))
        pipe.mget([cache.requests_key(slug, second) for second in window])
    try:
        replies = pipe.execute()
    except redis.RedisError:
        return None
    loads = {}
    for slug, queued, inflight, requests in zip(
        slugs, replies[0::3], replies[1::3], replies[2::3], strict=True
    ):
        per_replica = {key.decode(): max(int(value), 0) for key, value in inflight.items()}
        answered = sum(max(int(count), 0) for count in requests if count is not None)
        loads[slug] = Load(
            queued=max(int(queued or 0), 0),
            in_flight=sum(per_replica.values()),
            per_replica=per_replica,
            requests_per_second=answered / REQUESTS_WINDOW_SECONDS,
        )
    return loads


# --- deployments ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaCount:
    state: str
    label: str
    count: int


@dataclass(frozen=True)
class DeploymentRow:
    """A deployment as a list shows it: replicas per state and the router's load (None: the
    counters could not be read)."""

    deployment: InferenceDeployment
    load: Load | None

    @property
    def live(self) -> int:
        """Replicas that count towards the deployment's size (asked for, booting, serving)."""
        return sum(getattr(self.deployment, f"replicas_{state}") for state in LIVE)

    @property
    def ready(self) -> int:
        """Replicas the router sends requests to: running, and their readiness probe answered."""
        return self.deployment.replicas_ready

    @property
    def states(self) -> list[ReplicaCount]:
        """The replica states that hold any replica, in lifecycle order."""
        counts = (
            ReplicaCount(state, State(state).label, getattr(self.deployment, f"replicas_{state}"))
            for state in COUNTED_STATES
        )
        return [count for count in counts if count.count]


# The replicas the router sends requests to (gpucap.inference.models.replica_routable).
ROUTABLE = Q(replicas__state=State.RUNNING, replicas__probe__ready=True) & ~Q(
    replicas__endpoint_url=""
)


def deployments_counted() -> QuerySet[InferenceDeployment]:
    """Deployments with their tenant and pool, ``replicas_<state>`` counts and
    ``replicas_ready`` (those the router sends requests to): one query."""
    counts = {
        f"replicas_{state}": Count("replicas", filter=Q(replicas__state=state))
        for state in COUNTED_STATES
    }
    counts["replicas_ready"] = Count("replicas", filter=ROUTABLE)
    return InferenceDeployment.objects.select_related(
        "tenant", "pool__capacity_set", "pool__cluster"
    ).annotate(**counts)


def _rows(deployments: list[InferenceDeployment]) -> list[DeploymentRow]:
    loads = deployment_loads([deployment.slug for deployment in deployments])
    return [
        DeploymentRow(deployment, None if loads is None else loads[deployment.slug])
        for deployment in deployments
    ]


@dataclass(frozen=True)
class DeploymentList:
    rows: list[DeploymentRow]

    @property
    def load_known(self) -> bool:
        return all(row.load is not None for row in self.rows)

    @property
    def live_replicas(self) -> int:
        return sum(row.live for row in self.rows)

    @property
    def ready_replicas(self) -> int:
        return sum(row.ready for row in self.rows)

    @property
    def queue_depth(self) -> int:
        return sum(row.load.queue_depth for row in self.rows if row.load)

    @property
    def requests_per_second(self) -> float:
        return sum(row.load.requests_per_second for row in self.rows if row.load)


def tenant_deployments(*, tenant: Tenant) -> DeploymentList:
    """A tenant's deployments by name, with replica counts and load. One query, one Redis
    round trip."""
    return DeploymentList(_rows(list(deployments_counted().filter(tenant=tenant))))


@dataclass(frozen=True)
class PoolDeployments:
    pool: Pool
    rows: list[DeploymentRow] = field(default_factory=list)


@dataclass(frozen=True)
class FleetDeployments(DeploymentList):
    pools: list[PoolDeployments] = field(default_factory=list)


def all_deployments() -> FleetDeployments:
    """Every deployment, grouped by pool (pools in set rank order, then standalone pools;
    deployments by tenant and name). One query, one Redis round trip."""
    deployments = deployments_counted().order_by(
        "pool__cluster__name",
        "pool__capacity_set__name",
        "pool__rank",
        "pool__name",
        "tenant__slug",
        "name",
    )
    rows = _rows(list(deployments))
    pools = [
        PoolDeployments(pool=group[0].deployment.pool, rows=group)
        for group in (
            list(rows) for _, rows in itertools.groupby(rows, key=lambda r: r.deployment.pool_id)
        )
    ]
    return FleetDeployments(rows=rows, pools=pools)


def deployment_visible_to(*, user: AbstractBaseUser, slug: str, name: str) -> DeploymentRow:
    """Tenant ``slug``'s deployment ``name`` with its counts and load, if the user may see it;
    otherwise 404 (never 403: outsiders must not learn it exists). One query for operators,
    two for members (their memberships, cached for the request)."""
    deployments = deployments_counted().filter(tenant__slug=slug, name=name)
    if not is_operator(user):
        deployments = deployments.filter(tenant_id__in=tenant_ids_for(user))
    deployment = deployments.first()
    if deployment is None:
        raise Http404("No such deployment.")
    return _rows([deployment])[0]


def deployment_replicas(deployment: InferenceDeployment) -> list[VirtualMachine]:
    """The deployment's replicas that still exist, oldest first, with the GPUs each holds, its
    open notice and its ``readiness`` (``ReplicaReadiness``). Two queries."""
    replicas = (
        with_open_notice(vms_with_gpus())
        .select_related("probe")
        .filter(deployment=deployment)
        .exclude(state=State.TERMINATED)
    )
    replicas = list(replicas.order_by("pk"))
    for vm in replicas:
        vm.readiness = replica_readiness(vm)
    return replicas


@dataclass(frozen=True)
class ReplicaReadiness:
    """A replica's readiness as pages and the API show it. ``status`` is None when the replica
    is not running: its state says why the router sends it nothing."""

    status: Readiness | None
    label: str
    last_probe_at: datetime | None = None
    consecutive_failures: int = 0
    last_error: str = ""


def replica_readiness(vm: VirtualMachine) -> ReplicaReadiness:
    """What the readiness probe says of a replica (read from ``select_related("probe")``)."""
    if vm.state != State.RUNNING:
        return ReplicaReadiness(status=None, label="")
    if not vm.endpoint_url:
        return ReplicaReadiness(status=Readiness.WAITING, label="waiting for its endpoint")
    probe = replica_probe(vm)
    return ReplicaReadiness(
        status=readiness(probe),
        label=readiness_label(probe),
        last_probe_at=probe.last_probe_at if probe else None,
        consecutive_failures=probe.consecutive_failures if probe else 0,
        last_error=probe.last_error if probe else "",
    )


def inference_pools(*, tenant: Tenant) -> QuerySet[Pool]:
    """The inference pools a tenant may deploy in."""
    return (
        tenant.pools.filter(kind=Pool.Kind.INFERENCE)
        .select_related("capacity_set", "cluster")
        .order_by("cluster__name", "capacity_set__name", "rank")
    )


# --- API keys ------------------------------------------------------------------------------------


def deployment_keys(deployment: InferenceDeployment) -> list[ApiKey]:
    """The keys that open a deployment: its own and its tenant's keys for every deployment,
    newest first. One query."""
    keys = ApiKey.objects.filter(tenant_id=deployment.tenant_id).filter(
        Q(deployment=deployment) | Q(deployment=None)
    )
    return list(keys.order_by("-created_at", "-id"))


def deployment_key(*, deployment: InferenceDeployment, pk: int) -> ApiKey:
    """One key that opens the deployment, or 404."""
    api_key = (
        ApiKey.objects.filter(tenant_id=deployment.tenant_id, pk=pk)
        .filter(Q(deployment=deployment) | Q(deployment=None))
        .first()
    )
    if api_key is None:
        raise Http404("No such API key.")
    return api_key
