"""Applying a fleet file: compare it with the database (`FleetDiff`), then make every change
through the fleet and tenancy services, in one transaction."""

from dataclasses import asdict

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from gpucap.audit.services import Actor
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.fleet.fleetfile.diff import PHASES, FleetDiff, Step
from gpucap.fleet.fleetfile.sections import set_section_action
from gpucap.fleet.fleetfile.spec import (
    ApplyResult,
    CapacitySetSpec,
    FleetFile,
    FleetFileError,
    ImageSpec,
    NodeSpec,
    PoolSpec,
)
from gpucap.fleet.models import CapacitySet, Cluster, Node, Pool
from gpucap.tenancy import services as tenancy
from gpucap.tenancy.models import Tenant


def fleet_file_apply(
    fleet_file: FleetFile, *, dry_run: bool = False, actor: Actor = None
) -> ApplyResult:
    """Make the database hold what the file declares, through the fleet services, in one
    transaction. Nothing is deleted but the rows of a set's section (its schedule) that the
    set's entry declares whole (`sections`). Checks against the database come first and report
    every problem; a service that still refuses a step rolls the whole apply back. With ``dry_run``
    only the checks run and the result lists what would change."""
    with transaction.atomic():
        diff = FleetDiff(fleet_file, actor=actor)
        diff.plan()
        if diff.problems:
            raise FleetFileError([f"{fleet_file.source}: {p}" for p in diff.problems])
        if not dry_run:
            _run(diff)
    return diff.result(dry_run=dry_run)


def _run(diff: FleetDiff) -> None:
    source = diff.file.source
    for phase in PHASES:
        for step in diff.steps[phase]:
            try:
                _call(step, actor=diff.actor)
            except ValidationError as exc:
                raise FleetFileError(
                    [f"{source}: {step.where}: {text}" for text in _validation_messages(exc)]
                ) from None
            except Conflict as exc:
                raise FleetFileError([f"{source}: {step.where}: {exc.message}"]) from None
            except IntegrityError as exc:
                first_line = str(exc).splitlines()[0] if str(exc) else "integrity error"
                raise FleetFileError(
                    [f"{source}: {step.where}: the database refused the change: {first_line}"]
                ) from None


def _call(step: Step, *, actor: Actor) -> None:
    action = _ACTIONS.get(step.action) or set_section_action(step.action)
    action(**step.kwargs, actor=actor)


# Service fields whose fleet-file key has another name.
_FILE_KEYS = {"gpu_count": "gpus", "gpus": "gpu_list", "pools": "rank"}


def _validation_messages(exc: ValidationError) -> list[str]:
    if not hasattr(exc, "error_dict"):
        return list(exc.messages)
    return [
        f"{_FILE_KEYS.get(field, field)}: {message}"
        if field not in ("__all__", "non_field_errors")
        else message
        for field, messages in exc.message_dict.items()
        for message in messages
    ]


# --- service calls that look objects up when they run (earlier steps create them) --------------


def _capacity_set_create(*, spec: CapacitySetSpec, actor: Actor) -> None:
    fleet.capacity_set_create(
        cluster=Cluster.objects.get(name=spec.cluster),
        name=spec.name,
        gpu_model=spec.gpu_model,
        fabric=spec.fabric,
        notice_seconds=spec.notice_seconds,
        actor=actor,
    )


def _node_create(*, spec: NodeSpec, actor: Actor) -> None:
    gpus = [
        {key: value for key, value in asdict(gpu).items() if value is not None} for gpu in spec.gpus
    ]
    fleet.node_create(
        cluster=Cluster.objects.get(name=spec.cluster),
        hostname=spec.hostname,
        gpu_model=spec.gpu_model,
        fabric=spec.fabric,
        gpu_count=spec.gpu_count,
        partitions=spec.partitions,
        bmc_address=spec.bmc_address,
        labels=spec.labels,
        state=spec.state or Node.State.READY,
        gpus=gpus,
        guest_bridge=spec.guest_bridge,
        guest_subnet=spec.guest_subnet,
        actor=actor,
    )


def _node_set_state(*, node: Node, state: str, actor: Actor) -> None:
    fleet.node_set_state(node=node, state=state, actor=actor, message="fleet file")


def _node_join(*, cluster: str, hostname: str, capacity_set: str, actor: Actor) -> None:
    fleet.node_join_set(
        node=Node.objects.get(cluster__name=cluster, hostname=hostname),
        capacity_set=CapacitySet.objects.select_related("cluster").get(name=capacity_set),
        actor=actor,
    )


def _pool_create(*, spec: PoolSpec, rank: int, actor: Actor) -> None:
    fleet.pool_create(
        name=spec.name,
        kind=spec.kind,
        cluster=Cluster.objects.get(name=spec.cluster),
        capacity_set=(
            CapacitySet.objects.select_related("cluster").get(name=spec.capacity_set)
            if spec.capacity_set
            else None
        ),
        rank=rank,
        floor_gpus=spec.floor_gpus,
        protect_seconds=spec.protect_seconds,
        gpu_model=spec.gpu_model or "",
        fabric=spec.fabric or "",
        actor=actor,
    )


def _pools_rerank(
    *, cluster: str, capacity_set: str | None, order: list[str], actor: Actor
) -> None:
    if capacity_set is None:
        fleet.pool_rerank(cluster=Cluster.objects.get(name=cluster), pool_names=order, actor=actor)
    else:
        fleet.pool_rerank(
            capacity_set=CapacitySet.objects.get(name=capacity_set), pool_names=order, actor=actor
        )


def _pool_set_tenants(*, name: str, slugs: tuple[str, ...], actor: Actor) -> None:
    fleet.pool_set_tenants(
        pool=Pool.objects.get(name=name),
        tenants=list(Tenant.objects.filter(slug__in=slugs)),
        actor=actor,
    )


def _node_dedicate(*, cluster: str, hostname: str, slug: str | None, actor: Actor) -> None:
    """Dedicate a node to a tenant (None: share it). Other tenants' spot VMs and replicas on a
    newly dedicated node get their notices from the periodic sweep
    (`gpucap.notices.dedications.dedications_sweep`): the fleet sits below the notices."""
    fleet.node_set_dedicated_tenant(
        node=Node.objects.get(cluster__name=cluster, hostname=hostname),
        tenant=Tenant.objects.get(slug=slug) if slug else None,
        actor=actor,
    )


def _image_create(*, spec: ImageSpec, actor: Actor) -> None:
    fleet.image_create(
        cluster=Cluster.objects.get(name=spec.cluster), name=spec.name, actor=actor, **spec.fields()
    )


def _membership_set(*, username: str, slug: str, role: str, actor: Actor) -> None:
    tenancy.membership_set(
        user=get_user_model().objects.get(username=username),
        tenant=Tenant.objects.get(slug=slug),
        role=role,
        actor=actor,
    )


def _operator_grant(*, username: str, actor: Actor) -> None:
    tenancy.operator_grant(user=get_user_model().objects.get(username=username), actor=actor)


# What each action of a `Step` calls.
_ACTIONS = {
    "user_create": tenancy.user_create,
    "user_update": tenancy.user_update,
    "tenant_create": tenancy.tenant_create,
    "tenant_rename": tenancy.tenant_rename,
    "membership_set": _membership_set,
    "operator_grant": _operator_grant,
    "cluster_create": fleet.cluster_create,
    "cluster_update": fleet.cluster_update,
    "capacity_set_create": _capacity_set_create,
    "capacity_set_update": fleet.capacity_set_update,
    "node_create": _node_create,
    "node_update": fleet.node_update,
    "node_set_state": _node_set_state,
    "gpu_set_health": fleet.gpu_set_health,
    "node_set_module_ids": fleet.node_set_module_ids,
    "node_join_set": _node_join,
    "node_leave_set": fleet.node_leave_set,
    "pool_create": _pool_create,
    "pools_rerank": _pools_rerank,
    "pool_set_floor": fleet.pool_set_floor,
    "pool_set_protect": fleet.pool_set_protect,
    "pool_set_tenants": _pool_set_tenants,
    "node_set_dedicated_tenant": _node_dedicate,
    "image_create": _image_create,
    "image_update": fleet.image_update,
}
