"""Changes to tenant allocation: quotas here, reservations in `gpucap.allocation.reservations`
(re-exported below, so every change is found here). Operators only (the API, the console, the
fleet file call these). Every change is audited and bumps the generation of every capacity set
it touches, so their plans are made again.

A quota never stops anything: lowering it below what the tenant holds only refuses new
requests (``gpucap.rentals.services.vm_request``) and new placements (the arbiter), and the
answer says so (``QuotaSaved.note``)."""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import transaction

from gpucap.allocation.models import TenantQuota
from gpucap.allocation.reservations import (
    reservation_check,
    reservation_create,
    reservation_delete,
    reservation_update,
    reservations_boundary,
)
from gpucap.allocation.selectors import QuotaUse, names_words, quota_use
from gpucap.audit.services import Actor, audit_record
from gpucap.fleet.models import CapacitySet, Node, Pool
from gpucap.fleet.services import capacity_set_bump
from gpucap.tenancy.models import Tenant

__all__ = [
    "quota_delete",
    "quota_set",
    "reservation_check",
    "reservation_create",
    "reservation_delete",
    "reservation_update",
    "reservations_boundary",
]

# PostgreSQL's integer, what the counts are stored in.
INTEGER_MAX = 2**31 - 1


@dataclass(frozen=True)
class QuotaSaved:
    quota: TenantQuota
    created: bool
    use: QuotaUse
    note: str  # "" unless the quota is below what the tenant holds now


@transaction.atomic
def quota_set(
    *,
    tenant: Tenant,
    pool: Pool | None = None,
    gpu_model: str = "",
    max_gpus: int,
    max_pending: int | None = None,
    actor: Actor = None,
) -> QuotaSaved:
    """Create the tenant's quota in the scope (a pool, or a GPU model: exactly one), or change
    the one it has there. Bad input is refused naming the field, and nothing changes."""
    gpu_model = gpu_model.strip() if isinstance(gpu_model, str) else gpu_model
    errors = quota_problems(
        pool=pool, gpu_model=gpu_model, max_gpus=max_gpus, max_pending=max_pending
    )
    if errors:
        raise ValidationError(errors)
    scope = {"pool": pool} if pool is not None else {"pool": None, "gpu_model": gpu_model}
    quota = (
        TenantQuota.objects.select_for_update()
        .filter(tenant=tenant, **scope)
        .order_by("pk")
        .first()
    )
    created = quota is None
    before = {} if created else _fields(quota)
    if created:
        quota = TenantQuota.objects.create(
            tenant=tenant, max_gpus=max_gpus, max_pending=max_pending, **scope
        )
    elif (quota.max_gpus, quota.max_pending) != (max_gpus, max_pending):
        quota.max_gpus, quota.max_pending = max_gpus, max_pending
        quota.save(update_fields=["max_gpus", "max_pending", "updated_at"])
    use = quota_use(quota)
    if created or before != _fields(quota):
        _bump(quota)
        audit_record(
            actor=actor,
            verb="quota.set",
            target=quota,
            before=before,
            after=_fields(quota),
        )
    return QuotaSaved(quota=quota, created=created, use=use, note=below_use_note(quota, use))


@transaction.atomic
def quota_delete(*, quota: TenantQuota, actor: Actor = None) -> None:
    """Remove the quota: the tenant's requests in its scope are no longer limited by it."""
    locked = TenantQuota.objects.select_for_update().filter(pk=quota.pk).order_by("pk").first()
    if locked is None:
        return  # deleted already: harmless the second time
    before = _fields(locked)
    audit_record(actor=actor, verb="quota.delete", target=locked, before=before)
    _bump(locked)
    locked.delete()


def quota_problems(
    *,
    pool: object,
    gpu_model: object,
    max_gpus: object,
    max_pending: object,
    check_model: bool = True,
) -> dict[str, str]:
    """What is wrong with a quota's fields, by field (shared by the API, the console's form
    and the fleet file, so each refuses the same mistake in the same words). The fleet file
    checks a GPU model against the file too (``check_model=False``: not here)."""
    errors: dict[str, str] = {}
    if pool is not None and not isinstance(pool, Pool):
        errors["pool"] = f"unknown pool {pool!r}"
    if not isinstance(gpu_model, str):
        errors["gpu_model"] = "must be text"
    elif pool is None and not gpu_model:
        errors["pool"] = "give a pool or a GPU model (gpu_model) for the quota's scope"
    elif pool is not None and gpu_model:
        errors["gpu_model"] = (
            "give a pool or a GPU model, not both: a quota binds one pool or every pool of a model"
        )
    elif gpu_model and check_model and not _model_known(gpu_model):
        known = ", ".join(_models_known()) or "none yet"
        errors["gpu_model"] = f"no pool or node has GPU model {gpu_model!r}; known: {known}"
    for name, value, empty_ok in (
        ("max_gpus", max_gpus, False),
        ("max_pending", max_pending, True),
    ):
        if value is None and empty_ok:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            errors[name] = f"must be a whole number, got {value!r}"
        elif not 0 <= value <= INTEGER_MAX:
            errors[name] = f"must be 0 or more (and at most {INTEGER_MAX}), got {value}"
    return errors


def below_use_note(quota: TenantQuota, use: QuotaUse) -> str:
    """What the quota means now when the tenant already uses more than it allows."""
    slug = quota.tenant.slug
    scope = quota.scope_words
    if use.held_gpus > quota.max_gpus:
        return (
            f"{slug} holds {use.held_gpus} GPUs {scope} ({names_words(use.held_vms)}), over "
            f"the new quota of {quota.max_gpus}: nothing is stopped; new requests are refused "
            "until it is below"
        )
    if use.gpus > quota.max_gpus:
        return (
            f"{slug} holds {use.held_gpus} GPUs {scope} and asks for {use.pending_gpus} more "
            f"({names_words(use.pending_vms)}), over the new quota of {quota.max_gpus}: nothing "
            "is stopped or withdrawn; the arbiter places no more than the quota allows and new "
            "requests are refused until the use is below"
        )
    if quota.max_pending is not None and use.pending > quota.max_pending:
        return (
            f"{slug} has {use.pending} requests pending {scope}, over the new limit of "
            f"{quota.max_pending}: none is withdrawn; new requests are refused until fewer wait"
        )
    return ""


def quota_capacity_set_ids(quota: TenantQuota) -> list[int]:
    """The capacity sets whose plans the quota can change."""
    if quota.pool_id is not None:
        set_id = Pool.objects.filter(pk=quota.pool_id).values_list("capacity_set_id", flat=True)
        return [pk for pk in set_id if pk is not None]
    return list(
        CapacitySet.objects.filter(gpu_model=quota.gpu_model)
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def _bump(quota: TenantQuota) -> None:
    for capacity_set_id in quota_capacity_set_ids(quota):
        capacity_set_bump(capacity_set_id=capacity_set_id)


def _fields(quota: TenantQuota) -> dict:
    return {
        "tenant": quota.tenant.slug,
        "pool": quota.pool.name if quota.pool_id else None,
        "gpu_model": quota.gpu_model,
        "max_gpus": quota.max_gpus,
        "max_pending": quota.max_pending,
    }


def _model_known(gpu_model: str) -> bool:
    return (
        Pool.objects.filter(gpu_model=gpu_model).exists()
        or Node.objects.filter(gpu_model=gpu_model).exists()
    )


def _models_known() -> list[str]:
    models = set(Pool.objects.values_list("gpu_model", flat=True))
    models |= set(Node.objects.values_list("gpu_model", flat=True))
    return sorted(models)
