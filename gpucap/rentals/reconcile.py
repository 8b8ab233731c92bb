"""The reconciler: what each cluster's hypervisor says against what the database says.

Tasks can be lost (a worker killed mid-task, a message dropped) and hypervisors can lose VMs.
Every pass (Celery beat, ``rentals.reconcile``) asks the driver about each VM that holds GPUs and
repairs the drift it finds, logging each repair and recording it in the audit log:

- provisioning, the driver says running → mark it running;
- provisioning, the driver has no such VM after a grace period → send ``vm_provision`` again;
- provisioning for longer than the boot timeout, or the driver says failed → mark it failed;
- stopping, the driver says stopped or has no such VM → mark it stopped;
- stopping, still up after a grace period → send ``vm_stop`` again;
- running or notified, the driver has no such VM → its host was lost (``vm_host_lost``): a
  spot VM goes back to pending to resume elsewhere on a fresh disk, any other VM is failed;
- running, the guest shut itself down → stop it as its owner would;
- notified, the guest shut itself down before its deadline → say so (``guest_shut_down_early``):
  notices releases its GPUs now and completes the notice as ``guest_shutdown``;
- pending in a standalone pool → ask the cluster's placement to look again.

Every repair is conditional: it happens under the VM's row lock and only if the VM is still in
the very state (same state, same ``updated_at``) the reconciler judged, so a task finishing the
same work at the same moment wins cleanly and nothing happens twice. VMs that a task is driving
right now (``vm_driver_lock`` is taken) are left to that task.
"""

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpucap import locks
from gpucap.audit.services import audit_record
from gpucap.drivers.base import FAILED, MISSING, RUNNING, STOPPED, DriverError, VmStatus
from gpucap.drivers.registry import driver_for
from gpucap.rentals import services
from gpucap.rentals.models import VirtualMachine
from gpucap.rentals.signals import guest_shut_down_early
from gpucap.tasks import enqueue_on_commit

logger = logging.getLogger(__name__)

State = VirtualMachine.State

LOST_BY_HYPERVISOR = "the hypervisor no longer knows this VM"
_CHECKED = (State.PROVISIONING, State.RUNNING, State.NOTIFIED, State.STOPPING)


@dataclass(frozen=True)
class Repair:
    """One piece of drift the reconciler found and what it did about it."""

    vm_id: int
    state: str  # in the database, when judged
    driver_state: str
    action: str

    def __str__(self) -> str:
        return (
            f"vm-{self.vm_id}: {self.state} here, {self.driver_state} on the hypervisor: "
            f"{self.action}"
        )


@contextmanager
def vm_driver_lock(vm_id: int) -> Iterator[bool]:
    """Serialise driver work on one VM across workers: yields whether the lock was taken.

    A PostgreSQL session advisory lock, so it is released when the holder's connection ends,
    a worker killed with SIGKILL included. It is never held while waiting for another."""
    with locks.session_try_lock(locks.DRIVER_WORK, vm_id) as taken:
        yield taken


def vms_reconcile(
    *,
    grace_seconds: int | None = None,
    boot_timeout_seconds: int | None = None,
    now: datetime | None = None,
) -> list[Repair]:
    """One pass over every VM that holds GPUs, then a nudge to standalone placement. Returns
    the repairs made. Safe to run while tasks run, and on several workers at once."""
    grace = timedelta(
        seconds=settings.RENTALS_RECONCILE_GRACE_SECONDS if grace_seconds is None else grace_seconds
    )
    boot_timeout = timedelta(
        seconds=settings.RENTALS_BOOT_TIMEOUT_SECONDS
        if boot_timeout_seconds is None
        else boot_timeout_seconds
    )
    now = now or timezone.now()
    repairs = []
    vms = (
        VirtualMachine.objects.filter(state__in=_CHECKED, node__isnull=False)
        .select_related("node__cluster")
        .order_by("pk")
    )
    for vm in vms:
        with vm_driver_lock(vm.pk) as taken:
            if not taken:
                continue  # a task is driving this VM right now
            status = _driver_status(vm)
            if status is None:
                continue
            repair = _repair(vm, status, grace=grace, boot_timeout=boot_timeout, now=now)
        if repair is not None:
            logger.warning("reconciler repaired drift: %s", repair)
            repairs.append(repair)
    _nudge_standalone_placement()
    return repairs


def _driver_status(vm: VirtualMachine) -> VmStatus | None:
    try:
        return driver_for(vm.node.cluster).status(vm.instance_id, vm.node.hostname)
    except DriverError as exc:
        logger.warning("reconciler skips %s: its driver did not answer: %s", vm.instance_id, exc)
        return None


def _repair(
    vm: VirtualMachine, status: VmStatus, *, grace: timedelta, boot_timeout: timedelta, now
) -> Repair | None:
    since = now - vm.updated_at  # time in the current state: only transitions save a VM
    driver_state = status.state
    if vm.state == State.PROVISIONING:
        if driver_state == RUNNING:
            return _apply(vm, status, "marked running", _mark_running)
        if driver_state == FAILED:
            return _apply(vm, status, "marked failed", _mark_failed(status.message))
        if since > boot_timeout:
            reason = f"did not boot within {int(boot_timeout.total_seconds())} s"
            return _apply(vm, status, "marked failed", _mark_failed(reason, destroy=True))
        if driver_state == MISSING and since > grace:
            return _apply(vm, status, "sent rentals.vm_provision again", _resend("provision"))
    elif vm.state in (State.RUNNING, State.NOTIFIED):
        if driver_state == MISSING:
            return _apply(vm, status, "its host was lost", _host_lost)
        if driver_state == FAILED:
            reason = status.message or "the hypervisor reports the VM failed"
            return _apply(vm, status, "marked failed", _mark_failed(reason, destroy=True))
        if driver_state == STOPPED and vm.state == State.RUNNING:
            return _apply(vm, status, "stopping it: the guest shut down", _stop_as_owner)
        if driver_state == STOPPED:  # notified: the guest finished before its deadline
            action = "released its GPUs: the guest shut down before its notice deadline"
            return _apply(vm, status, action, _guest_shut_down_early)
    elif vm.state == State.STOPPING:
        if driver_state in (STOPPED, MISSING, FAILED):
            return _apply(vm, status, "marked stopped", _mark_stopped)
        if since > grace:
            return _apply(vm, status, "sent rentals.vm_stop again", _resend("stop"))
    return None


@transaction.atomic
def _apply(vm: VirtualMachine, status: VmStatus, action: str, act) -> Repair | None:
    """Repair under the VM's row lock, only if the VM is still exactly as judged."""
    locked = VirtualMachine.objects.select_for_update(no_key=True).get(pk=vm.pk)
    if (locked.state, locked.updated_at) != (vm.state, vm.updated_at):
        return None  # a task or a person moved it meanwhile: nothing to repair any more
    audit_record(
        actor=None,
        verb="vm.reconcile",
        target=locked,
        before={"state": vm.state, "driver_state": status.state},
        after={"action": action},
        message=f"reconciler: {vm.state} here, {status.state} on the hypervisor: {action}",
    )
    act(locked, status)
    return Repair(vm_id=vm.pk, state=vm.state, driver_state=status.state, action=action)


def _mark_running(vm: VirtualMachine, status: VmStatus) -> None:
    services.vm_mark_running(vm=vm, ip_address=status.ip_address, endpoint_url=status.endpoint_url)


def _mark_failed(reason: str, *, destroy: bool = False):
    def act(vm: VirtualMachine, status: VmStatus) -> None:
        services.vm_mark_failed(vm=vm, reason=reason)
        if destroy:  # what is left on the hypervisor must not keep the GPUs
            enqueue_on_commit("rentals.vm_destroy", vm.pk)

    return act


def _host_lost(vm: VirtualMachine, status: VmStatus) -> None:
    services.vm_host_lost(vm=vm, reason=LOST_BY_HYPERVISOR)


def _mark_stopped(vm: VirtualMachine, status: VmStatus) -> None:
    services.vm_mark_stopped(vm=vm)


def _stop_as_owner(vm: VirtualMachine, status: VmStatus) -> None:
    services.vm_stop(vm=vm)


def _guest_shut_down_early(vm: VirtualMachine, status: VmStatus) -> None:
    guest_shut_down_early.send(sender=VirtualMachine, vm=vm)


def _resend(what: str):
    def act(vm: VirtualMachine, status: VmStatus) -> None:
        enqueue_on_commit(f"rentals.vm_{what}", vm.pk)

    return act


def _nudge_standalone_placement() -> None:
    """Pending VMs of standalone pools wait for capacity; placement looks again each pass (a
    lost placement task, or capacity that came back without an event, e.g. a healed GPU)."""
    cluster_ids = (
        VirtualMachine.objects.filter(state=State.PENDING, pool__capacity_set__isnull=True)
        .values_list("pool__cluster_id", flat=True)
        .distinct()
        .order_by("pool__cluster_id")
    )
    for cluster_id in cluster_ids:
        logger.info("reconciler: standalone VMs pending on cluster %s; placing", cluster_id)
        enqueue_on_commit("rentals.standalone_place", cluster_id)
