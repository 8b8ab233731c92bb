"""Changing what gpucap keeps about BMCs: a node's credentials (set, forget, sealed again with a
new key). Every write is validated first, atomic and audited, and no password ever reaches the
audit log."""

import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from gpucap.audit.services import Actor, audit_record
from gpucap.bmc.models import BmcCredential
from gpucap.bmc.passwords import SealError, password_open, password_reseal, password_seal
from gpucap.bmc.redfish import BmcTarget
from gpucap.fleet.models import Node
from gpucap.inputs import text_problem

_SYSTEM_ID = re.compile(r"^[A-Za-z0-9._-]{0,64}$")


@transaction.atomic
def bmc_credential_set(
    *,
    node: Node,
    username: str,
    password: str | None,
    verify_tls: bool = True,
    system_id: str = "",
    actor: Actor = None,
) -> BmcCredential:
    """Store how to log in to ``node``'s BMC. ``password`` None keeps the stored one (a
    credential being created needs one). Setting what is stored already changes nothing."""
    node = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    credential = BmcCredential.objects.filter(node=node).first()
    errors = _problems(
        node=node, username=username, password=password, system_id=system_id, new=not credential
    )
    if errors:
        raise ValidationError(errors)
    before = _described(credential) if credential else None
    password_changed = password is not None and (
        credential is None
        or password != password_open(credential.password_sealed, node=node.hostname)
    )
    if credential is None:
        credential = BmcCredential(node=node)
    credential.username, credential.verify_tls, credential.system_id = (
        username,
        verify_tls,
        system_id,
    )
    if password_changed:
        try:
            credential.password_sealed = password_seal(password)
        except SealError as error:
            raise ValidationError({"password": str(error)}) from None
    after = _described(credential)
    if before == after and not password_changed:
        return credential
    credential.save()
    after["password"] = "changed" if password_changed else "unchanged"
    audit_record(actor=actor, verb="bmc.credential_set", target=node, before=before, after=after)
    return credential


@transaction.atomic
def bmc_credential_delete(*, node: Node, actor: Actor = None) -> None:
    """Forget how to log in to ``node``'s BMC (its address stays on the node)."""
    credential = BmcCredential.objects.select_for_update().filter(node=node).first()
    if credential is None:
        return
    before = _described(credential)
    credential.delete()
    audit_record(actor=actor, verb="bmc.credential_delete", target=node, before=before)


def bmc_credentials_reseal() -> int:
    """Seal every stored password again with the first of ``BMC_CREDENTIAL_KEYS``
    (``manage.py bmc_rotate_keys``); how many were. One row at a time, each under its lock, so
    a credential changed meanwhile is never overwritten with its old password."""
    count = 0
    for pk in BmcCredential.objects.order_by("pk").values_list("pk", flat=True):
        with transaction.atomic():
            credential = (
                BmcCredential.objects.select_for_update(of=("self",))
                .select_related("node")
                .filter(pk=pk)
                .first()
            )
            if credential is None:
                continue
            credential.password_sealed = password_reseal(
                credential.password_sealed, node=credential.node.hostname
            )
            credential.save(update_fields=["password_sealed"])
            count += 1
    return count


def bmc_target(node: Node) -> BmcTarget:
    """How to reach ``node``'s BMC, password opened, for the Redfish client. Raises
    ``ValidationError`` naming the node when it has no address or no credentials."""
    credential = BmcCredential.objects.filter(node=node).first()
    if not node.bmc_address or credential is None:
        missing = "BMC address" if not node.bmc_address else "BMC credentials"
        raise ValidationError({"bmc": f"node {node.hostname} has no {missing}"})
    try:
        password = password_open(credential.password_sealed, node=node.hostname)
    except SealError as error:
        raise ValidationError({"bmc": str(error)}) from None
    return BmcTarget(
        name=f"node {node.hostname}",
        address=node.bmc_address,
        username=credential.username,
        password=password,
        verify_tls=credential.verify_tls,
        system_id=credential.system_id,
        **bmc_target_settings(),
    )


def bmc_target_settings() -> dict:
    """What every ``BmcTarget`` takes from the settings: the CA bundle and the timeouts."""
    return {
        "ca_bundle": settings.BMC_CA_BUNDLE,
        "connect_timeout": settings.BMC_CONNECT_TIMEOUT_SECONDS,
        "read_timeout": settings.BMC_READ_TIMEOUT_SECONDS,
    }


def _problems(
    *, node: Node, username: str, password: str | None, system_id: str, new: bool
) -> dict[str, str]:
    errors = {}
    if not node.bmc_address:
        errors["bmc_address"] = f"node {node.hostname} has no BMC address; set it first"
    if not isinstance(username, str) or not username.strip():
        errors["username"] = "is required"
    elif len(username) > 128:
        errors["username"] = "must be at most 128 characters"
    elif problem := text_problem(username, name=True):
        errors["username"] = problem
    if password is None:
        if new:
            errors["password"] = "is required for a BMC without stored credentials"
    elif not isinstance(password, str) or not password:
        errors["password"] = "must not be empty"
    elif len(password) > 256:
        errors["password"] = "must be at most 256 characters"
    elif problem := text_problem(password):
        errors["password"] = problem
    if not isinstance(system_id, str) or not _SYSTEM_ID.match(system_id):
        errors["system_id"] = "must be a Redfish id: letters, digits, '.', '_' and '-' (at most 64)"
    return errors


def _described(credential: BmcCredential) -> dict:
    """What the audit log records of a credential: never the password."""
    return {
        "username": credential.username,
        "verify_tls": credential.verify_tls,
        "system_id": credential.system_id,
    }
