"""What the instance metadata endpoint serves, kept in Redis by the services that change it.

One key per VM address: ``gpucap:imds:ip:<address>`` -> JSON ``{"vm": "vm-42", "ip": address,
"key": the tenant's SSH public key, "user": the image's login user, "user_data": the tenant's
user-data (left out when empty), "notice": null | {"reason", "issued_at", "deadline"},
"at_risk_since": null | when a proposed plan first named the VM as a victim}`` (times as UTC
ISO-8601 with ``Z``). A document written before a field existed lacks it, and the
endpoint answers 404 for what it would serve until the next publish or resync. A VM is served
from placement (provisioning, once it has an address: cloud-init reads while it boots) until
it lets go of its GPUs. The endpoint reads
only this key, so it needs no session, template or ORM work per request. Services publish after
their transaction commits; ``metadata_resync`` rebuilds every key (run by the periodic sweep) so
a lost publish heals within one sweep interval.

Each full resync also writes ``SYNCED_KEY``. A Redis that comes back empty lacks it: the
endpoint then answers 503 rather than "no VM at this address" and has the store rebuilt at once
(gpucap/edge/resync.py), one process of the fleet at a time (``RESYNC_CLAIM_KEY``).
"""

import json
import time
from collections.abc import Iterable
from datetime import UTC, datetime

from gpucap.cache_flush import publish_on_commit
from gpucap.notices.models import InterruptionNotice
from gpucap.redis_clients import metadata_redis
from gpucap.rentals.models import VirtualMachine
from gpucap.rentals.selectors import vm_login_user, with_login_user

KEY_PREFIX = "gpucap:imds:ip:"
SYNCED_KEY = "gpucap:imds:synced"  # when the last full resync ended (epoch seconds)
RESYNC_CLAIM_KEY = "gpucap:imds:resync-claim"


def metadata_key(ip_address: str) -> str:
    return f"{KEY_PREFIX}{ip_address}"


def metadata_document(vm, notice) -> dict:
    document = {
        "vm": vm.instance_id,
        "ip": vm.ip_address,
        "key": vm.ssh_public_key.strip(),
        "user": vm_login_user(vm),
        "notice": None
        if notice is None
        else {
            "reason": notice.reason,
            "issued_at": utc_z(notice.issued_at),
            "deadline": utc_z(notice.deadline),
        },
        # gpucap.plans.at_risk keeps it, and has the document republished when it changes.
        "at_risk_since": None if vm.at_risk_since is None else utc_z(vm.at_risk_since),
    }
    if vm.user_data:
        document["user_data"] = vm.user_data
    return document


def utc_z(moment: datetime) -> str:
    """2026-11-29T18:02:00Z, as EC2 writes times."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def metadata_publish_on_commit(vm_id: int) -> None:
    """Publish this VM's document once the transaction commits, in one flush with every other
    VM named in the same transaction (gpucap/cache_flush.py)."""
    publish_on_commit("metadata", vm_id, metadata_publish_many)


def metadata_publish(vm_id: int) -> None:
    """Write (or remove) the metadata of one VM as the database says now."""
    metadata_publish_many({vm_id})


def metadata_publish_many(vm_ids: Iterable[int]) -> None:
    """Write (or remove) the metadata of these VMs as the database says now, in one pipelined
    round trip."""
    loaded = with_login_user(VirtualMachine.objects.filter(pk__in=list(vm_ids)))
    vms = [vm for vm in loaded if vm.ip_address]
    if not vms:
        return
    served = [vm.pk for vm in vms if vm.state in _SERVED_STATES]
    # At most one open notice per VM (a constraint).
    notices = {
        n.vm_id: n for n in InterruptionNotice.objects.filter(vm_id__in=served, completed_at=None)
    }
    pipe = metadata_redis().pipeline(transaction=False)
    for vm in vms:
        key = metadata_key(vm.ip_address)
        if vm.state in _SERVED_STATES:
            pipe.set(key, json.dumps(metadata_document(vm, notices.get(vm.pk))))
        else:
            # Delete only if the key still describes this VM (the address may be reused already).
            pipe.eval(_DELETE_IF_VM, 1, key, vm.instance_id)
    pipe.execute()


def metadata_resync() -> int:
    """Rebuild every key from the database; returns how many VMs are served."""
    notices = {n.vm_id: n for n in InterruptionNotice.objects.filter(completed_at=None)}
    served = with_login_user(
        VirtualMachine.objects.filter(state__in=_SERVED_STATES).exclude(ip_address=None)
    )
    documents = {
        metadata_key(vm.ip_address): json.dumps(metadata_document(vm, notices.get(vm.pk)))
        for vm in served
    }
    client = metadata_redis()
    stale = set(client.scan_iter(match=f"{KEY_PREFIX}*", count=1000)) - {
        key.encode() for key in documents
    }
    pipe = client.pipeline(transaction=False)
    for key, document in documents.items():
        pipe.set(key, document)
    for key in stale:
        pipe.delete(key)
    # Last, in the same round trip: present only once every document is.
    pipe.set(SYNCED_KEY, str(time.time()))
    pipe.execute()
    return len(documents)


# A guest can ask while it boots, runs, is notified or is shutting down. A booting VM has an
# address only where gpucap gave it one (vm_place); elsewhere the driver reports it at running.
_SERVED_STATES = ("provisioning", "running", "notified", "stopping")
# Deletes KEYS[1] if its document is the one of VM ARGV[1], in the same round trip as the writes.
_DELETE_IF_VM = """
local current = redis.call('GET', KEYS[1])
if current and cjson.decode(current)['vm'] == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""
