"""Clusters: a group of nodes under one VM driver."""

from django.core.exceptions import ValidationError
from django.db import transaction

from gpucap.audit.services import Actor, audit_record
from gpucap.errors import Conflict
from gpucap.fleet.models import Cluster, Node
from gpucap.fleet.services._common import delete_unused


@transaction.atomic
def cluster_create(
    *,
    name: str,
    driver: str = Cluster.Driver.SIMULATED,
    driver_settings: dict | None = None,
    actor: Actor = None,
) -> Cluster:
    _check_driver(driver)
    if Cluster.objects.filter(name=name).exists():
        raise ValidationError({"name": f"a cluster named {name!r} already exists"})
    cluster = Cluster(name=name, driver=driver, driver_settings=driver_settings or {})
    cluster.full_clean()
    cluster.save()
    audit_record(actor=actor, verb="cluster.create", target=cluster, after={"driver": driver})
    return cluster


@transaction.atomic
def cluster_update(
    *, cluster: Cluster, driver: str, driver_settings: dict, actor: Actor = None
) -> Cluster:
    """Change which VM driver runs a cluster and its settings (e.g. a libvirt URI template).
    The settings are checked against the driver; the driver changes only while no VM runs on
    the cluster (their guests live under the old one)."""
    _check_driver(driver)
    if not isinstance(driver_settings, dict):
        raise ValidationError({"driver_settings": "must be a mapping of setting names to values"})
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    before = {"driver": cluster.driver, "driver_settings": cluster.driver_settings}
    after = {"driver": driver, "driver_settings": driver_settings}
    if before == after:
        return cluster
    if driver != cluster.driver and (busy := cluster_driver_busy(cluster, driver=driver)):
        raise Conflict(busy, code="in_use")
    cluster.driver = driver
    cluster.driver_settings = driver_settings
    cluster.full_clean(exclude=["name"])
    cluster.save(update_fields=["driver", "driver_settings"])
    audit_record(actor=actor, verb="cluster.update", target=cluster, before=before, after=after)
    return cluster


# VMs in these states have no guest under the cluster's driver.
_NO_GUEST = ("pending", "terminated", "failed")


def cluster_driver_busy(cluster: Cluster, *, driver: str) -> str:
    """Why ``cluster``'s driver cannot become ``driver`` now ("": it can): the VMs on its nodes
    have guests under the present driver, which the new one would not know."""
    # The VMs are rentals', above this app: reached through the relation, not imported.
    vm_model = Node._meta.get_field("vms").related_model
    live = (
        vm_model.objects.filter(node__cluster=cluster).exclude(state__in=_NO_GUEST).order_by("pk")
    )
    names = [f"{vm.instance_id} ({vm.name}, {vm.state})" for vm in live[:11]]
    if not names:
        return ""
    shown = ", ".join(names[:10]) + (f" and {live.count() - 10} more" if len(names) > 10 else "")
    return (
        f"cluster {cluster.name} has VMs under the {cluster.driver} driver: {shown}; its driver "
        f"can change to {driver} only when none run there (terminate or move them first)"
    )


def _check_driver(driver: str) -> None:
    if driver not in Cluster.Driver.values:
        choices = ", ".join(Cluster.Driver.values)
        raise ValidationError({"driver": f"unknown driver {driver!r}; choose one of {choices}"})


@transaction.atomic
def cluster_rename(*, cluster: Cluster, name: str, actor: Actor = None) -> Cluster:
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    before = cluster.name
    if name == before:
        return cluster
    if Cluster.objects.filter(name=name).exists():
        raise ValidationError({"name": f"a cluster named {name!r} already exists"})
    cluster.name = name
    cluster.full_clean(exclude=["driver", "driver_settings"])
    cluster.save(update_fields=["name"])
    audit_record(
        actor=actor,
        verb="cluster.rename",
        target=cluster,
        before={"name": before},
        after={"name": name},
    )
    return cluster


@transaction.atomic
def cluster_delete(*, cluster: Cluster, actor: Actor = None) -> None:
    """Forget a cluster that no capacity set, node or pool belongs to any more."""
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    delete_unused(
        cluster,
        what=f"cluster {cluster.name}",
        verb="cluster.delete",
        before={"driver": cluster.driver},
        actor=actor,
    )
