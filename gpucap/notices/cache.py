"""What the instance metadata endpoint serves, kept in Redis by the services that change it.

One key per VM address: ``gpucap:imds:ip:<address>`` -> JSON ``{"vm": "vm-42", "notice": null |
{"reason", "issued_at", "deadline"}}`` (times as UTC ISO-8601 with ``Z``). The endpoint reads
only this key, so it needs no session, template or ORM work per request. Services publish after
their transaction commits; ``metadata_resync`` rebuilds every key (run by the periodic sweep) so
a lost publish heals within one sweep interval.
"""

import json
from datetime import UTC, datetime

import redis
from django.conf import settings
from django.db import transaction

KEY_PREFIX = "gpucap:imds:ip:"
_client: redis.Redis | None = None


def metadata_redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(settings.METADATA_REDIS_URL)
    return _client


def metadata_key(ip_address: str) -> str:
    return f"{KEY_PREFIX}{ip_address}"


def metadata_document(vm, notice) -> dict:
    return {
        "vm": vm.instance_id,
        "notice": None
        if notice is None
        else {
            "reason": notice.reason,
            "issued_at": utc_z(notice.issued_at),
            "deadline": utc_z(notice.deadline),
        },
    }


def utc_z(moment: datetime) -> str:
    """2026-11-29T18:02:00Z, as EC2 writes times."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def metadata_publish_on_commit(vm_id: int) -> None:
    transaction.on_commit(lambda: metadata_publish(vm_id))


def metadata_publish(vm_id: int) -> None:
    """Write (or remove) the metadata of one VM as the database says now."""
    from gpucap.notices.models import InterruptionNotice
    from gpucap.rentals.models import VirtualMachine

    vm = VirtualMachine.objects.filter(pk=vm_id).first()
    if vm is None:
        return
    client = metadata_redis()
    if vm.ip_address and vm.state in _SERVED_STATES:
        notice = InterruptionNotice.objects.filter(vm=vm, completed_at=None).first()
        client.set(metadata_key(vm.ip_address), json.dumps(metadata_document(vm, notice)))
        return
    if vm.ip_address:
        # Delete only if the key still describes this VM (the address may be reused already).
        key = metadata_key(vm.ip_address)
        current = client.get(key)
        if current and json.loads(current).get("vm") == vm.instance_id:
            client.delete(key)


def metadata_resync() -> int:
    """Rebuild every key from the database; returns how many VMs are served."""
    from gpucap.notices.models import InterruptionNotice
    from gpucap.rentals.models import VirtualMachine

    notices = {n.vm_id: n for n in InterruptionNotice.objects.filter(completed_at=None)}
    served = VirtualMachine.objects.filter(state__in=_SERVED_STATES).exclude(ip_address=None)
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
    pipe.execute()
    return len(documents)


# A guest can ask while it runs, is notified or is shutting down.
_SERVED_STATES = ("running", "notified", "stopping")
