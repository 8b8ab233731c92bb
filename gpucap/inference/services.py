"""Every change to inference deployments and API keys goes through here: validated, atomic,
audited. Replicas are VMs and change state through `gpucap.rentals.services`; this module only
asks for them (``replicas_scale``), records what their readiness probes find
(``replica_probe_record``, from gpucap/inference/probe.py) and keeps the router's documents
current."""

import re
from datetime import UTC, datetime

from django.conf import settings as django_settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from gpucap.arbiter.topology import gpu_count_problem
from gpucap.audit.services import Actor, audit_record
from gpucap.fleet.models import Pool
from gpucap.fleet.selectors import images_offered
from gpucap.inference import cache, keys
from gpucap.inference.models import MAX_REPLICAS, ApiKey, InferenceDeployment, ReplicaProbe
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from gpucap.tenancy.models import Tenant

State = VirtualMachine.State
# Replicas that count towards a deployment's size: asked for, booting, serving. A replica under
# notice or stopping is leaving and no longer counts.
LIVE = (State.PENDING, State.PROVISIONING, State.RUNNING)
_SLUG = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
# The image replicas boot when a deployment names none: gpucap's own model server.
REPLICA_IMAGE = "gpucap-model-server"
# Replicas need no tenant SSH access: the platform manages them.
REPLICA_SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGdwdWNhcC1pbmZlcmVuY2UtcmVwbGljYQ gpucap"

# Fields an operator or tenant may set, with their bounds (name -> (minimum, maximum)).
_BOUNDS = {
    "min_replicas": (0, MAX_REPLICAS),
    "max_replicas": (1, MAX_REPLICAS),
    "target_in_flight": (1, 1000),
    "replica_concurrency": (1, 1000),
    "queue_limit": (0, 100_000),
    "scale_down_cooldown_seconds": (0, 86_400),
    "cold_start_timeout_seconds": (1, 3600),
}
_DEFAULTS = {
    "min_replicas": 1,
    "max_replicas": 1,
    "target_in_flight": 4,
    "replica_concurrency": 8,
    "queue_limit": 64,
    "scale_down_cooldown_seconds": 300,
    "cold_start_timeout_seconds": 300,
}


# --- deployments ---------------------------------------------------------------------------------


@transaction.atomic
def deployment_create(
    *,
    tenant: Tenant,
    pool: Pool,
    name: str,
    model_name: str,
    gpus_per_replica: int,
    slug: str | None = None,
    image: str = REPLICA_IMAGE,
    actor: Actor = None,
    **settings,
) -> InferenceDeployment:
    """A tenant deploys a model in an inference pool. Its ``min_replicas`` replicas are asked
    for at once, as one demand group."""
    values = {**_DEFAULTS, **settings}
    given_slug, slug = slug, slug or f"{tenant.slug}-{name}"
    errors = _settings_problems(values, unknown=set(settings) - set(_DEFAULTS))
    if pool.kind != Pool.Kind.INFERENCE:
        errors["pool"] = (
            f"pool {pool.name} is a {pool.kind} pool; deployments need an inference pool"
        )
    elif not pool.tenants.filter(pk=tenant.pk).exists():
        errors["pool"] = f"tenant {tenant.slug} may not use pool {pool.name}"
    else:
        if not _whole(gpus_per_replica):
            errors["gpus_per_replica"] = f"must be a whole number, got {gpus_per_replica!r}"
        elif problem := gpu_count_problem(pool.fabric, gpus_per_replica):
            errors["gpus_per_replica"] = f"pool {pool.name}: {problem}"
        if problem := _replica_image_problem(pool, image):
            errors["image"] = problem
    if not isinstance(name, str) or not _SLUG.match(name):
        errors["name"] = (
            "must be 1-63 lowercase letters, digits or hyphens, starting and ending with a "
            "letter or digit"
        )
    elif InferenceDeployment.objects.filter(tenant=tenant, name=name).exists():
        errors["name"] = f"your tenant already has a deployment named {name!r}"
    elif not _SLUG.match(slug):
        errors["name" if given_slug is None else "slug"] = (
            f"too long for the router path /inference/{tenant.slug}-<name>/ (at most "
            f"{62 - len(tenant.slug)} characters for tenant {tenant.slug})"
            if given_slug is None
            else "must be 1-63 lowercase letters, digits or hyphens"
        )
    elif InferenceDeployment.objects.filter(slug=slug).exists():
        errors["slug"] = f"the router path /inference/{slug}/ is taken; choose another name"
    if not isinstance(model_name, str) or not model_name.strip() or len(model_name) > 200:
        errors["model_name"] = "is required (up to 200 characters), e.g. meta-llama/Llama-3.1-8B"
    if errors:
        raise ValidationError(errors)
    deployment = InferenceDeployment.objects.create(
        tenant=tenant,
        pool=pool,
        name=name,
        slug=slug,
        model_name=model_name.strip(),
        image=image,
        gpus_per_replica=gpus_per_replica,
        created_by=actor if actor is not None and actor.is_authenticated else None,
        **values,
    )
    audit_record(
        actor=actor,
        verb="deployment.create",
        target=deployment,
        after={"pool": pool.name, "model": deployment.model_name, "image": image, **values},
    )
    replicas_scale(deployment=deployment, to=deployment.min_replicas, reason="created")
    cache.route_publish_on_commit(deployment.pk)
    return deployment


@transaction.atomic
def deployment_update(
    *, deployment: InferenceDeployment, actor: Actor = None, **changes
) -> InferenceDeployment:
    """Change a deployment's range or its router and autoscaler settings. The replicas follow
    at the autoscaler's next run (outside a set) or the set's next plan (inside one)."""
    locked = InferenceDeployment.objects.select_for_update(no_key=True).get(pk=deployment.pk)
    values = {field: getattr(locked, field) for field in _DEFAULTS}
    values.update(changes)
    errors = _settings_problems(values, unknown=set(changes) - set(_DEFAULTS))
    if errors:
        raise ValidationError(errors)
    before = {field: getattr(locked, field) for field in changes}
    if before == {field: values[field] for field in changes}:
        return locked
    for field in changes:
        setattr(locked, field, values[field])
    locked.save(update_fields=[*changes, "updated_at"])
    audit_record(actor=actor, verb="deployment.update", target=locked, before=before, after=changes)
    # The range bounds the replicas at once: below min or above max needs no queue signal. The
    # range in force, which a capacity set's schedule may hold instead of this one meanwhile.
    live = replicas_live(locked).count()
    low, high = locked.min_replicas_in_force, locked.max_replicas_in_force
    if live < low:
        replicas_scale(deployment=locked, to=low, reason="range changed")
    elif live > high:
        replicas_scale(deployment=locked, to=high, reason="range changed")
    cache.route_publish_on_commit(locked.pk)
    deployment.__dict__.update(locked.__dict__)
    return locked


def _settings_problems(values: dict, *, unknown: set[str]) -> dict[str, str]:
    errors = dict.fromkeys(sorted(unknown), "is not a deployment setting")
    for field, (low, high) in _BOUNDS.items():
        value = values.get(field)
        if not _whole(value) or not low <= value <= high:
            errors[field] = f"must be a whole number from {low} to {high}, got {value!r}"
    if not errors.keys() & {"min_replicas", "max_replicas"} and (
        values["min_replicas"] > values["max_replicas"]
    ):
        errors["min_replicas"] = (
            f"must not exceed the maximum of {values['max_replicas']} replicas, "
            f"got {values['min_replicas']}"
        )
    if not errors.keys() & {"target_in_flight", "replica_concurrency"} and (
        values["replica_concurrency"] < values["target_in_flight"]
    ):
        errors["replica_concurrency"] = (
            f"must be at least target_in_flight ({values['target_in_flight']}), "
            f"got {values['replica_concurrency']}"
        )
    return errors


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- replicas ------------------------------------------------------------------------------------


def _replica_image_problem(pool: Pool, image: object) -> str:
    """Why ``image`` cannot serve replicas in ``pool``: it must be an enabled image of the
    catalogue of the pool's cluster that serves a port (the first is the OpenAI endpoint)."""
    serving = [
        offered.name for offered in images_offered(cluster_id=pool.cluster_id) if offered.ports
    ]
    if not serving:
        return (
            f"no replica image (one that serves a port) is offered for pool {pool.name}; an "
            "operator adds one to the catalogue of its cluster"
        )
    if image not in serving:
        return (
            f"{image!r} is not a replica image offered for pool {pool.name}; choose one of: "
            f"{', '.join(serving)}"
        )
    return ""


def replicas_live(deployment: InferenceDeployment):
    return deployment.replicas.filter(state__in=LIVE)


@transaction.atomic
def replicas_scale(
    *, deployment: InferenceDeployment, to: int, reason: str, actor: Actor = None
) -> list[VirtualMachine]:
    """Bring the deployment to ``to`` live replicas, clamped to its range. Up: new replica VMs,
    asked for together as one demand group (the arbiter places them all or none). Down: pending
    replicas are withdrawn first, then the most recently started go. Returns the VMs asked for
    or stopped. Serialised per deployment (row lock), so two autoscaler runs cannot both add.
    The range is the one in force: a capacity set's schedule or override may hold another."""
    locked = InferenceDeployment.objects.select_for_update(no_key=True).get(pk=deployment.pk)
    to = max(locked.min_replicas_in_force, min(to, locked.max_replicas_in_force))
    live = list(replicas_live(locked).order_by("pk"))
    now = timezone.now()
    changed: list[VirtualMachine] = []
    if to > len(live):
        group = f"{locked.slug}@{now:%Y%m%dT%H%M%S.%f}"
        for _ in range(to - len(live)):
            changed.append(
                rentals.vm_request(
                    tenant=locked.tenant,
                    pool=locked.pool,
                    name=_replica_name(locked),
                    gpu_count=locked.gpus_per_replica,
                    image=locked.image,
                    ssh_public_key=REPLICA_SSH_KEY,
                    actor=actor,
                    role=VirtualMachine.Role.INFERENCE_REPLICA,
                    deployment=locked,
                    demand_group=group,
                )
            )
    elif to < len(live):
        # Withdraw what serves nobody yet first; then the newest (least warm cache, least work).
        order = {State.PENDING: 0, State.PROVISIONING: 1, State.RUNNING: 2}
        leaving = sorted(
            live, key=lambda vm: (order[vm.state], -(vm.started_at or now).timestamp(), -vm.pk)
        )[: len(live) - to]
        for vm in leaving:
            changed.append(rentals.vm_terminate(vm=vm, actor=actor, for_deployment=True))
    if changed:
        locked.last_scaled_at = now
        locked.scale_down_since = None
        locked.save(update_fields=["last_scaled_at", "scale_down_since", "updated_at"])
        audit_record(
            actor=actor,
            verb="deployment.scale",
            target=locked,
            before={"replicas": len(live)},
            after={"replicas": to},
            message=reason,
        )
    return changed


def _replica_name(deployment: InferenceDeployment) -> str:
    # VM names are unique per tenant: avoid the tenant's rentals' names too.
    taken = set(
        VirtualMachine.objects.filter(tenant_id=deployment.tenant_id)
        .exclude(state=State.TERMINATED)
        .values_list("name", flat=True)
    )
    number = len(taken) + 1
    while f"{deployment.name[:50]}-r{number}" in taken:
        number += 1
    return f"{deployment.name[:50]}-r{number}"


# --- replica readiness ---------------------------------------------------------------------------


@transaction.atomic
def replica_probe_record(
    *,
    vm_id: int,
    endpoint_url: str,
    seen_at: datetime | None,
    ok: bool,
    error: str = "",
    at: datetime,
) -> bool:
    """Record one readiness probe of a running replica's model server at ``endpoint_url``, made by a
    prober that had read the replica's probe as last recorded at ``seen_at`` (None: never).
    One answer makes the replica ready; ``INFERENCE_PROBE_FAILURES`` failures in a row make it
    not ready. A change of readiness republishes the deployment's route and is audited.

    Returns whether the probe counted. It does not when another probe was recorded since that
    read (two probers at once, two beat ticks overlapping: the later one to record is dropped,
    so one failure is never counted twice) or when the replica no longer runs with that
    endpoint (it went down meanwhile: no stale result outlives it). Serialised with the
    replica's lifecycle by its row lock, the lock ``vm_transition`` takes."""
    vm = (
        VirtualMachine.objects.select_for_update(no_key=True)
        .filter(pk=vm_id, state=State.RUNNING, endpoint_url=endpoint_url)
        .exclude(deployment=None)
        .first()
    )
    if vm is None:
        return False
    probe = ReplicaProbe.objects.filter(vm_id=vm_id).first()
    if (probe.last_probe_at if probe is not None else None) != seen_at:
        return False
    created = probe is None
    if created:
        probe = ReplicaProbe(vm=vm)
    was_ready = probe.ready
    probe.last_probe_at = at
    if ok:
        probe.consecutive_failures, probe.last_error = 0, ""
        if not probe.ready:
            probe.ready, probe.ready_since = True, at
    else:
        probe.consecutive_failures += 1
        probe.last_error = (error.strip() or "the probe failed")[:300]
        if probe.ready and probe.consecutive_failures >= django_settings.INFERENCE_PROBE_FAILURES:
            probe.ready, probe.ready_since = False, None
    probe.save(force_insert=created)
    if probe.ready != was_ready:
        audit_record(
            actor=None,
            verb="replica.ready" if probe.ready else "replica.not_ready",
            target=vm,
            before={"ready": was_ready},
            after={"ready": probe.ready},
            message=(
                "its readiness probe answered: the router sends it requests"
                if probe.ready
                else f"{probe.consecutive_failures} readiness probes in a row failed, the "
                f"router sends it nothing until one answers: {probe.last_error}"
            ),
        )
        cache.route_publish_on_commit(vm.deployment_id)
    return True


@transaction.atomic
def replica_probe_forget(*, vm: VirtualMachine) -> int:
    """The replica's guest went down: what its probes found no longer holds. When it runs
    again it waits for a fresh probe before the router sends it anything. Returns how many
    rows went (0 or 1); harmless twice."""
    deleted, _ = ReplicaProbe.objects.filter(vm_id=vm.pk).delete()
    return deleted


# --- API keys ------------------------------------------------------------------------------------


@transaction.atomic
def api_key_create(
    *,
    tenant: Tenant,
    name: str,
    deployment: InferenceDeployment | None = None,
    expires_at: datetime | None = None,
    actor: Actor = None,
) -> tuple[ApiKey, str]:
    """A new API key for one deployment (or every deployment of the tenant). Returns the key
    and its secret, which is shown this once and never stored."""
    errors = {}
    if not isinstance(name, str) or not name.strip() or len(name) > 100:
        errors["name"] = "is required (up to 100 characters), e.g. 'production chatbot'"
    if deployment is not None and deployment.tenant_id != tenant.pk:
        errors["deployment"] = "is not one of your tenant's deployments"
    if expires_at is not None and expires_at <= timezone.now():
        errors["expires_at"] = "must be in the future"
    if errors:
        raise ValidationError(errors)
    secret, prefix, salt, digest = keys.key_new()
    api_key = ApiKey.objects.create(
        tenant=tenant,
        deployment=deployment,
        name=name.strip(),
        prefix=prefix,
        salt=salt,
        digest=digest,
        expires_at=expires_at,
        created_by=actor if actor is not None and actor.is_authenticated else None,
    )
    audit_record(
        actor=actor,
        verb="api_key.create",
        target=api_key,
        after={
            "prefix": prefix,
            "deployment": deployment.slug if deployment else None,
            "expires_at": expires_at.isoformat() if expires_at else None,
        },
    )
    cache.key_publish_on_commit(api_key.pk)
    return api_key, secret


@transaction.atomic
def api_key_revoke(*, api_key: ApiKey, actor: Actor = None) -> ApiKey:
    """Revoke a key: the router refuses it from the moment this commits. Harmless twice."""
    locked = ApiKey.objects.select_for_update().get(pk=api_key.pk)
    if locked.revoked_at is not None:
        return locked
    locked.revoked_at = timezone.now()
    locked.save(update_fields=["revoked_at"])
    audit_record(actor=actor, verb="api_key.revoke", target=locked, after={"prefix": locked.prefix})
    cache.key_publish_on_commit(locked.pk)
    api_key.__dict__.update(locked.__dict__)
    return locked


def api_keys_used_flush() -> int:
    """Copy the router's last-used times from Redis to the keys (one Redis round trip).
    Returns how many moved."""
    api_keys = list(ApiKey.objects.filter(revoked_at=None).only("pk", "prefix", "last_used_at"))
    if not api_keys:
        return 0
    used_at = cache.inference_redis().mget([cache.used_key(k.prefix) for k in api_keys])
    moved = 0
    for api_key, raw in zip(api_keys, used_at, strict=True):
        if raw is None:
            continue
        used = datetime.fromtimestamp(float(raw), tz=UTC)
        if api_key.last_used_at is None or used > api_key.last_used_at:
            ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=used)
            moved += 1
    return moved
