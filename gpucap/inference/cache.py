"""What the router reads, kept in Redis by the services that change it (as the metadata
documents are, gpucap/notices/cache.py): the router answers from Redis alone, never the ORM.

- ``gpucap:inference:route:<slug>`` -> JSON route document of a deployment:
  ``{"deployment": id, "slug", "model", "tenant", "created": epoch seconds,
  "replica_concurrency", "queue_limit", "cold_start_timeout": seconds, "replicas": [{"id":
  "vm-42", "url": "http://..."}]}``.
  Only ready replicas are listed: running, with an endpoint, and answering their readiness probe
  (gpucap/inference/probe.py). A replica under notice, stopping, booting, or whose model server
  is not up (yet, or any more) gets no request. ``created`` is what ``/v1/models`` reports.
- ``gpucap:inference:key:<prefix>`` -> JSON key document: ``{"tenant", "deployment": slug or
  null (every deployment of the tenant), "salt", "digest", "expires_at": epoch seconds or null,
  "revoked": bool}``.

Router processes keep copies of these documents and Redis tells them when one changes
(client-side caching, gpucap/inference/redis_batch.py): writing a document is all it takes.

Counters the router keeps (and the autoscaler and pages read), per deployment slug:

- ``gpucap:inference:inflight:<slug>``: hash replica id -> requests in flight;
- ``gpucap:inference:queued:<slug>``: requests waiting for a replica;
- ``gpucap:inference:requests:<slug>:<epoch second>``: requests sent to a replica in that
  second (counted when the router sends one; expires ``REQUESTS_TTL_SECONDS`` after; the load
  recorder, gpucap/inference/load_history.py, keeps them by the minute);
- ``gpucap:inference:failing:<slug>``: sorted set replica id -> until when (epoch seconds) the
  router avoids it, after a connection to it failed;
- ``gpucap:inference:used:<prefix>``: epoch seconds a key was last used (flushed to the
  database by ``inference.keys_flush``).

Services publish after their transaction commits; ``inference_resync`` rebuilds every
document (beat), so a lost publish heals within one interval. Each full resync also writes
``synced_key()``: a Redis back without its data lacks it, and the router then answers 503 rather
than a false 401 and has the documents rebuilt at once (gpucap/edge/resync.py), one process of
the fleet at a time (``resync_claim_key()``).
"""

import json
import time
from collections.abc import Iterable

from django.db.models import Prefetch

from gpucap.cache_flush import publish_on_commit
from gpucap.inference.models import ApiKey, InferenceDeployment, replica_routable
from gpucap.redis_clients import inference_redis
from gpucap.rentals.models import VirtualMachine

PREFIX = "gpucap:inference:"
# The per-second request counters outlive every window that reads them: the pages' and the
# autoscaler's last seconds, and the load recorder's closed minutes (load_history.py).
REQUESTS_TTL_SECONDS = 120


def route_key(slug: str) -> str:
    return f"{PREFIX}route:{slug}"


def api_key_key(prefix: str) -> str:
    return f"{PREFIX}key:{prefix}"


def inflight_key(slug: str) -> str:
    return f"{PREFIX}inflight:{slug}"


def queued_key(slug: str) -> str:
    return f"{PREFIX}queued:{slug}"


def requests_key(slug: str, second: int) -> str:
    return f"{PREFIX}requests:{slug}:{second}"


def failing_key(slug: str) -> str:
    return f"{PREFIX}failing:{slug}"


def wake_key(slug: str) -> str:
    """Held a moment by the router process that woke the deployment (at zero replicas)."""
    return f"{PREFIX}wake:{slug}"


def used_key(prefix: str) -> str:
    return f"{PREFIX}used:{prefix}"


def synced_key() -> str:
    """When the last full resync ended (epoch seconds); absent: never synced, or data lost."""
    return f"{PREFIX}synced"


def resync_claim_key() -> str:
    return f"{PREFIX}resync-claim"


def route_document(deployment, replicas) -> dict:
    """The route of a deployment, listing those of ``replicas`` the router may send requests
    to (``replica_routable``; fetch them with ``select_related("probe")``)."""
    return {
        "deployment": deployment.pk,
        "slug": deployment.slug,
        "model": deployment.model_name,
        "tenant": deployment.tenant.slug,
        "created": int(deployment.created_at.timestamp()),
        "replica_concurrency": deployment.replica_concurrency,
        "queue_limit": deployment.queue_limit,
        "cold_start_timeout": deployment.cold_start_timeout_seconds,
        "replicas": [
            {"id": vm.instance_id, "url": vm.endpoint_url}
            for vm in sorted(replicas, key=lambda vm: vm.pk)
            if replica_routable(vm)
        ],
    }


def key_document(api_key) -> dict:
    return {
        "tenant": api_key.tenant.slug,
        "deployment": api_key.deployment.slug if api_key.deployment_id else None,
        "salt": api_key.salt,
        "digest": api_key.digest,
        "expires_at": api_key.expires_at.timestamp() if api_key.expires_at else None,
        "revoked": api_key.revoked_at is not None,
    }


def route_publish_on_commit(deployment_id: int) -> None:
    """Publish this deployment's route once the transaction commits, in one flush with every
    other route named in the same transaction (gpucap/cache_flush.py)."""
    publish_on_commit("inference-routes", deployment_id, route_publish_many)


def route_publish(deployment_id: int) -> None:
    """Write one deployment's route document from the database as it is now."""
    route_publish_many({deployment_id})


def route_publish_many(deployment_ids: Iterable[int]) -> None:
    """Write these deployments' route documents from the database as it is now, in one
    pipelined round trip."""
    deployments = list(_with_replicas().filter(pk__in=list(deployment_ids)))
    if not deployments:
        return
    pipe = inference_redis().pipeline(transaction=False)
    for deployment in deployments:
        document = route_document(deployment, deployment.replicas.all())
        pipe.set(route_key(deployment.slug), json.dumps(document))
    pipe.execute()


def _with_replicas():
    """Deployments with their tenant and running replicas (each with its probe): two queries."""
    running = VirtualMachine.objects.filter(state=VirtualMachine.State.RUNNING).select_related(
        "probe"
    )
    return InferenceDeployment.objects.select_related("tenant").prefetch_related(
        Prefetch("replicas", queryset=running)
    )


def key_publish_on_commit(api_key_id: int) -> None:
    """Publish this API key's document once the transaction commits, with every other key named
    in the same transaction."""
    publish_on_commit("inference-keys", api_key_id, key_publish_many)


def key_publish(api_key_id: int) -> None:
    key_publish_many({api_key_id})


def key_publish_many(api_key_ids: Iterable[int]) -> None:

    api_keys = list(
        ApiKey.objects.select_related("tenant", "deployment").filter(pk__in=list(api_key_ids))
    )
    if not api_keys:
        return
    pipe = inference_redis().pipeline(transaction=False)
    for api_key in api_keys:
        pipe.set(api_key_key(api_key.prefix), json.dumps(key_document(api_key)))
    pipe.execute()


def inference_resync() -> int:
    """Rewrite every route and key document from the database. Returns how many."""
    pipe = inference_redis().pipeline(transaction=False)
    count = 0
    for deployment in _with_replicas():
        pipe.set(
            route_key(deployment.slug),
            json.dumps(route_document(deployment, deployment.replicas.all())),
        )
        count += 1
    for api_key in ApiKey.objects.select_related("tenant", "deployment"):
        pipe.set(api_key_key(api_key.prefix), json.dumps(key_document(api_key)))
        count += 1
    # Last, in the same round trip: present only once every document is.
    pipe.set(synced_key(), str(time.time()))
    pipe.execute()
    return count


def load(slug: str) -> tuple[int, int, dict[str, int]]:
    """(queued, in flight, in flight per replica) of a deployment, from the router's counters."""
    return loads([slug])[slug]


def loads(slugs: list[str]) -> dict[str, tuple[int, int, dict[str, int]]]:
    """`load` for many deployments in one Redis round trip."""
    pipe = inference_redis().pipeline(transaction=False)
    for slug in slugs:
        pipe.get(queued_key(slug))
        pipe.hgetall(inflight_key(slug))
    replies = pipe.execute()
    found = {}
    for n, slug in enumerate(slugs):
        queued, inflight = replies[2 * n], replies[2 * n + 1]
        per_replica = {k.decode(): max(int(v), 0) for k, v in inflight.items()}
        found[slug] = (max(int(queued or 0), 0), sum(per_replica.values()), per_replica)
    return found
