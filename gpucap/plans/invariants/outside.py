"""The optional rules that look outside the database: what the hypervisor runs and what the
metadata endpoint serves, each against the snapshot. One query for the VMs (and one for their
notices), then the driver or Redis: these are not bound by the audit's query budget, and what
changed after the snapshot may show as a difference."""

import json

from gpucap.drivers.base import BOOTING, FAILED, RUNNING, STOPPED, DriverError
from gpucap.drivers.registry import driver_for
from gpucap.notices import cache
from gpucap.notices.models import InterruptionNotice
from gpucap.plans.invariants.base import HOLDING_STATES, Audit, Violation
from gpucap.rentals.models import VirtualMachine
from gpucap.rentals.selectors import with_login_user

State = VirtualMachine.State

# What the hypervisor may say of a VM in each database state that holds GPUs. A provisioning
# VM may not be defined yet (its task is on its way); a stopping one may be anywhere on its way
# out, but not failed.
_AGREES = {
    State.PROVISIONING: {"missing", BOOTING, RUNNING},
    State.RUNNING: {BOOTING, RUNNING},
    State.NOTIFIED: {BOOTING, RUNNING},
    State.STOPPING: {"missing", BOOTING, RUNNING, "stopping", STOPPED},
}


def hypervisor_agrees(audit: Audit) -> list[Violation]:
    vms = (
        VirtualMachine.objects.filter(state__in=HOLDING_STATES, node__isnull=False)
        .select_related("node__cluster")
        .order_by("pk")
    )
    drivers, found = {}, []
    for vm in vms:
        cluster = vm.node.cluster
        try:
            if cluster.pk not in drivers:
                drivers[cluster.pk] = driver_for(cluster)
            status = drivers[cluster.pk].status(vm.instance_id, vm.node.hostname)
        except DriverError as exc:
            found.append(_hypervisor(vm, f"its driver did not answer: {exc}", driver_state=None))
            continue
        if status.state not in _AGREES[vm.state]:
            why = f"the database says {vm.state}, the hypervisor says {status.state}"
            if status.state == FAILED and status.message:
                why += f" ({status.message})"
            found.append(_hypervisor(vm, why, driver_state=status.state))
        elif (
            vm.state in (State.RUNNING, State.NOTIFIED)
            and status.ip_address
            and vm.ip_address
            and status.ip_address != vm.ip_address
        ):
            why = (
                f"the database says its address is {vm.ip_address}, "
                f"the hypervisor {status.ip_address}"
            )
            found.append(_hypervisor(vm, why, driver_state=status.state))
        if len(found) >= audit.limit:
            break
    return found


def _hypervisor(vm: VirtualMachine, why: str, *, driver_state: str | None) -> Violation:
    return Violation(
        rule="hypervisor_agrees",
        subject=f"vm-{vm.pk}",
        why=f"on {vm.node.hostname}: {why}",
        rows={
            "vm": vm.pk,
            "state": vm.state,
            "node": vm.node.hostname,
            "driver_state": driver_state,
        },
    )


def metadata_agrees(audit: Audit) -> list[Violation]:
    """Every served VM (holding GPUs, with an address) has exactly the document the database
    gives it; no key is left for a VM that is not served."""
    served = with_login_user(
        VirtualMachine.objects.filter(state__in=HOLDING_STATES).exclude(ip_address=None)
    ).order_by("pk")
    notices = {n.vm_id: n for n in InterruptionNotice.objects.filter(completed_at=None)}
    expected = {
        cache.metadata_key(vm.ip_address): (vm, cache.metadata_document(vm, notices.get(vm.pk)))
        for vm in served
    }
    client = cache.metadata_redis()
    keys = sorted(
        set(expected)
        | {k.decode() for k in client.scan_iter(match=f"{cache.KEY_PREFIX}*", count=1000)}
    )
    stored = dict(zip(keys, client.mget(keys), strict=True)) if keys else {}
    found = []
    for key in keys:
        raw = stored.get(key)
        document = _parsed(raw)
        vm, wanted = expected.get(key, (None, None))
        if vm is None:
            found.append(
                _metadata(
                    key, "it is served, but no VM that holds GPUs has this address", document, None
                )
            )
        elif raw is None:
            found.append(
                _metadata(
                    key, f"vm-{vm.pk} is {vm.state}, but its guests get no document", None, wanted
                )
            )
        elif document != wanted:
            differs = sorted(
                k
                for k in set(document or {}) | set(wanted)
                if (document or {}).get(k) != wanted.get(k)
            )
            found.append(
                _metadata(
                    key,
                    f"the document of vm-{vm.pk} differs from the database in {', '.join(differs)}",
                    document,
                    wanted,
                )
            )
        if len(found) >= audit.limit:
            break
    return found


def _parsed(raw: bytes | None) -> dict | None:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"unreadable": raw.decode(errors="replace")}


def _metadata(key: str, why: str, stored: dict | None, expected: dict | None) -> Violation:
    address = key.removeprefix(cache.KEY_PREFIX)
    # The tenant's SSH key and user-data are not the monitor's business: named, never shown.
    return Violation(
        rule="metadata_agrees",
        subject=f"address {address}",
        why=why,
        rows={
            "key": key,
            "stored_vm": (stored or {}).get("vm"),
            "expected_vm": (expected or {}).get("vm"),
            "stored_notice": (stored or {}).get("notice"),
            "expected_notice": (expected or {}).get("notice"),
        },
    )
