"""Celery tasks that drive VMs through their cluster's driver. Services send them by name after
their transaction commits; each takes ids, loads what it needs and calls a driver or a service.

Every task is idempotent and safe to retry or to run twice at once: it acts only while the VM is
in the state the task is for (a late or duplicated task finds nothing to do), driver calls are
idempotent, the services' transitions are conditional, and driver work on one VM is serialised
by ``vm_driver_lock``. Transient driver errors (``DriverUnavailable``) are retried with
exponential backoff; booting and stopping VMs are polled with a countdown, never by sleeping in
the worker. After a bounded number of polls the reconciler (``rentals.reconcile``, on beat)
takes over, and it also finishes work a killed worker left behind.
"""

import logging

from celery import shared_task
from celery.utils.time import get_exponential_backoff_interval
from django.conf import settings
from django.db import OperationalError

from gpucap.drivers.base import (
    FAILED,
    MISSING,
    RUNNING,
    STOPPED,
    DriverError,
    DriverUnavailable,
    GpuDevice,
    VmSpec,
    VmStatus,
)
from gpucap.drivers.registry import driver_for
from gpucap.fleet.models import Node
from gpucap.rentals import services
from gpucap.rentals.guest_network import guest_network_for
from gpucap.rentals.models import Allocation, VirtualMachine
from gpucap.rentals.reconcile import vm_driver_lock, vms_reconcile
from gpucap.rentals.selectors import image_for

logger = logging.getLogger(__name__)

# A transaction that lost a PostgreSQL deadlock (two services locking the same rows in the other
# order) or met a restarting database is simply run again, with backoff.
_DATABASE_RETRY = {
    "autoretry_for": (OperationalError,),
    "retry_backoff": 1,
    "retry_backoff_max": 60,
    "retry_jitter": True,
}

State = VirtualMachine.State


@shared_task(name="rentals.vm_provision", bind=True, max_retries=None, **_DATABASE_RETRY)
def vm_provision(self, vm_id: int, polls: int = 0, failures: int = 0) -> None:
    """Create a placed VM on its node's hypervisor and mark it running once it has booted."""
    with vm_driver_lock(vm_id) as taken:
        if not taken:
            return _poll_again(self, "provision", vm_id, polls)
        vm = _load(vm_id, State.PROVISIONING)
        if vm is None:
            return None  # already running, stopping, failed...: nothing left to do
        try:
            status = _create(driver_for(vm.node.cluster), vm, first=polls == 0)
        except DriverUnavailable as exc:
            if failures < settings.RENTALS_DRIVER_MAX_RETRIES:
                raise _retry_transient(self, exc, polls=polls, failures=failures) from exc
            return _fail(vm, f"{exc} (still failing after {failures} retries)")
        except DriverError as exc:  # permanent, or the cluster's driver settings are wrong
            return _fail(vm, str(exc))
        if status.state == RUNNING:
            services.vm_mark_running(
                vm=vm, ip_address=status.ip_address, endpoint_url=status.endpoint_url
            )
            return None
        if status.state == FAILED:
            return _fail(vm, status.message or "the hypervisor could not start the VM")
        return _poll_again(self, "provision", vm_id, polls)


@shared_task(name="rentals.vm_stop", bind=True, max_retries=None, **_DATABASE_RETRY)
def vm_stop(self, vm_id: int, polls: int = 0, failures: int = 0) -> None:
    """Shut a stopping VM down (gracefully, forced after the grace period); once the hypervisor
    says it is off, the service decides where it goes (stopped, pending again, terminated)."""
    with vm_driver_lock(vm_id) as taken:
        if not taken:
            return _poll_again(self, "stop", vm_id, polls)
        vm = _load(vm_id, State.STOPPING)
        if vm is None:
            return None
        try:
            # Returns once the VM is off, forced after the cluster's grace period.
            status = driver_for(vm.node.cluster).stop(vm.instance_id, vm.node.hostname)
        except DriverUnavailable as exc:
            if failures < settings.RENTALS_DRIVER_MAX_RETRIES:
                raise _retry_transient(self, exc, polls=polls, failures=failures) from exc
            # The VM may still hold its GPUs on the host: keep it stopping (the reconciler sends
            # the stop again) rather than hand the GPUs to someone else.
            logger.error("%s: stop still failing after %s retries: %s", vm, failures, exc)
            return None
        except DriverError as exc:
            services.vm_mark_failed(vm=vm, reason=str(exc))
            return None
        if status.state in (STOPPED, MISSING, FAILED):
            services.vm_mark_stopped(vm=vm)
            return None
        return _poll_again(self, "stop", vm_id, polls)


@shared_task(name="rentals.vm_destroy", bind=True, max_retries=None, **_DATABASE_RETRY)
def vm_destroy(self, vm_id: int, polls: int = 0, failures: int = 0) -> None:
    """Remove what the hypervisor still has of a terminated (or failed) VM. No state change."""
    with vm_driver_lock(vm_id) as taken:
        if not taken:
            return _poll_again(self, "destroy", vm_id, polls)
        vm = (
            VirtualMachine.objects.select_related("node__cluster")
            .filter(pk=vm_id, state__in=(State.TERMINATED, State.FAILED), node__isnull=False)
            .first()
        )
        if vm is None:
            return None  # gone, never placed, or placed again since it failed
        try:
            driver_for(vm.node.cluster).destroy(vm.instance_id, vm.node.hostname)
        except DriverUnavailable as exc:
            if failures < settings.RENTALS_DRIVER_MAX_RETRIES:
                raise _retry_transient(self, exc, polls=polls, failures=failures) from exc
            logger.error("%s: destroy still failing after %s retries: %s", vm, failures, exc)
        except DriverError as exc:
            logger.error("%s: the hypervisor refused to destroy it: %s", vm, exc)
    return None


@shared_task(name="rentals.vm_destroy_left", bind=True, max_retries=None, **_DATABASE_RETRY)
def vm_destroy_left(self, vm_id: int, node_id: int, polls: int = 0, failures: int = 0) -> None:
    """Remove what the hypervisor of a node a VM left (it was placed again elsewhere) still has
    of it. Never the node the VM is on now. Harmless twice: destroying nothing is nothing."""
    with vm_driver_lock(vm_id) as taken:
        if not taken:
            return _poll_again(self, "destroy-left", vm_id, polls)
        vm = VirtualMachine.objects.filter(pk=vm_id).exclude(node_id=node_id).first()
        node = Node.objects.select_related("cluster").filter(pk=node_id).first()
        if vm is None or node is None:
            return None  # back on that node (its disk is in use again), or the node is gone
        try:
            driver_for(node.cluster).destroy(vm.instance_id, node.hostname)
        except DriverUnavailable as exc:
            if failures < settings.RENTALS_DRIVER_MAX_RETRIES:
                raise _retry_transient(self, exc, polls=polls, failures=failures) from exc
            logger.error(
                "%s: left on %s, still failing after %s retries: %s", vm, node, failures, exc
            )
        except DriverError as exc:
            logger.error("%s: %s refused to destroy what it had of it: %s", vm, node, exc)
    return None


@shared_task(name="rentals.reconcile")
def reconcile() -> int:
    """Beat: repair drift between the hypervisors and the database. Returns the repairs made."""
    return len(vms_reconcile())


# --- helpers -----------------------------------------------------------------------------------


def _load(vm_id: int, state: str) -> VirtualMachine | None:
    return (
        VirtualMachine.objects.select_related("node__cluster").filter(pk=vm_id, state=state).first()
    )


def _spec(vm: VirtualMachine) -> VmSpec:
    allocations = (
        Allocation.objects.filter(vm=vm, released_at=None)
        .select_related("gpu")
        .order_by("gpu__index")
    )
    gpus = tuple(
        GpuDevice(index=a.gpu.index, uuid=a.gpu.uuid, pci_address=a.gpu.pci_address)
        for a in allocations
    )
    image = image_for(vm)
    return VmSpec(
        instance_id=vm.instance_id,
        node=vm.node.hostname,
        gpus=gpus,
        image=vm.image,
        ssh_public_key=vm.ssh_public_key,
        role=vm.role,
        # NVSwitch nodes: the NVLink partition these GPUs form, as Fabric Manager numbers it.
        fabric_partition=vm.node.fabric_partition_id(gpu.index for gpu in gpus),
        network=guest_network_for(vm),
        user_data=vm.user_data,
        base_image=image.base_for(vm.node.hostname) if image is not None else "",
        # An inference replica's model server listens on its image's first port.
        service_port=image.ports[0]
        if image is not None and image.ports and vm.role == VirtualMachine.Role.INFERENCE_REPLICA
        else None,
    )


def _create(driver, vm: VirtualMachine, *, first: bool) -> VmStatus:
    """Create on the first run; later runs poll, creating again only if the VM went missing or
    is off. A VM that exists but is off (placed again on the node that keeps its disk) is
    created again over its disk: redefined with the GPUs, address and seed it has now, which may
    differ from those of its last boot."""
    status = None if first else driver.status(vm.instance_id, vm.node.hostname)
    if status is None or status.state in (MISSING, STOPPED):
        status = driver.create(_spec(vm))
    return status


def _fail(vm: VirtualMachine, reason: str) -> None:
    """Give up on provisioning: remove what the hypervisor has of the VM (best effort), then
    mark it failed, which releases its GPUs."""
    try:
        driver_for(vm.node.cluster).destroy(vm.instance_id, vm.node.hostname)
    except DriverError as exc:
        logger.warning("%s: could not clean up after a failed provision: %s", vm, exc)
    services.vm_mark_failed(vm=vm, reason=reason)


def _retry_transient(task, exc: Exception, *, polls: int, failures: int):
    countdown = get_exponential_backoff_interval(
        factor=settings.RENTALS_DRIVER_RETRY_BACKOFF_SECONDS,
        retries=failures,
        maximum=settings.RENTALS_DRIVER_RETRY_BACKOFF_MAX_SECONDS,
        full_jitter=True,
    )
    return task.retry(
        exc=exc,
        countdown=countdown,
        kwargs={"polls": polls, "failures": failures + 1},
    )


def _poll_again(task, what: str, vm_id: int, polls: int) -> None:
    """Look again after a countdown, a bounded number of times; then the reconciler takes
    over (it checks every VM that holds GPUs on each pass)."""
    if polls >= settings.RENTALS_POLLS:
        logger.info("vm-%s: %s still in progress; the reconciler takes over", vm_id, what)
        return
    raise task.retry(
        countdown=settings.RENTALS_POLL_SECONDS, kwargs={"polls": polls + 1, "failures": 0}
    )
