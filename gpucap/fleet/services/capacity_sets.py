"""Capacity sets: the nodes of one cluster, GPU model and fabric that the arbiter plans as one.
Nodes join and leave a set through gpucap.fleet.services.nodes."""

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Sum

from gpucap.audit.services import Actor, audit_record
from gpucap.fleet import rules
from gpucap.fleet.models import CapacitySet, Cluster, Fabric
from gpucap.fleet.services._common import delete_unused, field_change


@transaction.atomic
def capacity_set_create(
    *,
    cluster: Cluster,
    name: str,
    gpu_model: str,
    fabric: str,
    notice_seconds: int = 120,
    actor: Actor = None,
) -> CapacitySet:
    errors = {}
    if CapacitySet.objects.filter(name=name).exists():
        errors["name"] = f"a capacity set named {name!r} already exists"
    if fabric not in Fabric.values:
        errors["fabric"] = f"unknown fabric {fabric!r}; choose pcie or nvswitch"
    if not gpu_model:
        errors["gpu_model"] = "is required"
    if _notice_problem(notice_seconds):
        errors["notice_seconds"] = _notice_problem(notice_seconds)
    if errors:
        raise ValidationError(errors)
    # A new set always starts in dry-run: operators preview before the arbiter acts.
    capacity_set = CapacitySet.objects.create(
        cluster=cluster,
        name=name,
        gpu_model=gpu_model,
        fabric=fabric,
        notice_seconds=notice_seconds,
    )
    audit_record(
        actor=actor,
        verb="capacity_set.create",
        target=capacity_set,
        after={"cluster": cluster.name, "gpu_model": gpu_model, "fabric": fabric},
    )
    return capacity_set


@transaction.atomic
def capacity_set_update(
    *, capacity_set: CapacitySet, notice_seconds: int, actor: Actor = None
) -> CapacitySet:
    if _notice_problem(notice_seconds):
        raise ValidationError({"notice_seconds": _notice_problem(notice_seconds)})
    capacity_set = CapacitySet.objects.select_for_update().get(pk=capacity_set.pk)
    # The notice length changes no plan: no generation bump.
    return field_change(
        capacity_set, "notice_seconds", notice_seconds, verb="capacity_set.update", actor=actor
    )


def _notice_problem(notice_seconds: object) -> str:
    low, high = rules.NOTICE_SECONDS_MIN, rules.NOTICE_SECONDS_MAX
    if not isinstance(notice_seconds, int) or not low <= notice_seconds <= high:
        return f"must be between {low} and {high} seconds, got {notice_seconds!r}"
    return ""


def capacity_set_gpu_total(*, capacity_set: CapacitySet) -> int:
    return capacity_set.nodes.aggregate(total=Sum("gpu_count"))["total"] or 0


@transaction.atomic
def capacity_set_delete(*, capacity_set: CapacitySet, actor: Actor = None) -> None:
    """Forget a capacity set that has no nodes and no pools left."""
    capacity_set = CapacitySet.objects.select_for_update().get(pk=capacity_set.pk)
    delete_unused(
        capacity_set,
        what=f"capacity set {capacity_set.name}",
        verb="capacity_set.delete",
        before={
            "gpu_model": capacity_set.gpu_model,
            "fabric": capacity_set.fabric,
            "mode": capacity_set.mode,
        },
        actor=actor,
    )
