"""The tenants' quotas in the fleet file: its top-level ``quotas:`` key.

The fleet file (gpucap/fleet/fleetfile/) sits below this app; `QUOTAS` is handed to it from
`AllocationConfig.ready()` (gpucap/fleet/fleetfile/sections.py). Each item is one quota::

    quotas:
      - {tenant: acme, pool: h100-spot, max_gpus: 16, max_pending: 4}
      - {tenant: acme, gpu_model: H100-SXM5-80GB, max_gpus: 64}

``pool`` or ``gpu_model``, exactly one; ``max_pending`` left out is no limit. Left out, the
quotas are left as they are; given (even ``quotas: []``), the quotas are what the file lists:
those it does not list are removed. They are written through `quota_set` / `quota_delete`,
only when they differ from the file, so applying a file twice changes nothing.
"""

from __future__ import annotations

from gpucap.allocation import services
from gpucap.allocation.models import TenantQuota
from gpucap.fleet.fleetfile.sections import SectionPlan, SectionSpec, list_problems
from gpucap.fleet.fleetfile.words import shown, unknown_key
from gpucap.fleet.models import Pool
from gpucap.tenancy.models import Tenant

KEYS = ("tenant", "pool", "gpu_model", "max_gpus", "max_pending")


class QuotaSection:
    key = "quotas"
    noun = "quota"
    plural = "quotas"

    @property
    def actions(self) -> dict:
        return {"quota_save": _quota_save, "quota_remove": _quota_remove}

    # --- as written ---------------------------------------------------------------------------

    def check(self, section: SectionSpec) -> list[str]:
        return list_problems(
            section,
            noun_plural="quotas",
            label=_label,
            item_problems=_written_problems,
            identity=_scope,
            twice=("tenant", "a second quota in this scope (first at {seen})"),
        )

    # --- against the database -----------------------------------------------------------------

    def plan(self, plan: SectionPlan) -> None:
        if not plan.specs:
            labels = [str(quota) for quota in _rows()]
            if labels:
                plan.left_as_is(labels)
            return
        (section,) = plan.specs
        tenants, pools, models = plan.tenant_slugs(), plan.pool_names(), plan.gpu_models()
        wanted: dict[tuple, tuple[str, dict]] = {}
        for i, item in enumerate(section.value):
            where = section.where(i, _label(item))
            if item["tenant"] not in tenants:
                plan.problem(where, f"tenant: no tenant {item['tenant']!r} in the fleet or file")
            elif item.get("pool") is not None and item["pool"] not in pools:
                plan.problem(where, f"pool: no pool {item['pool']!r} in the fleet or file")
            elif item.get("gpu_model") and item["gpu_model"] not in models:
                known = ", ".join(sorted(models)) or "none"
                plan.problem(
                    where, f"gpu_model: no pool or node has {item['gpu_model']!r}; known: {known}"
                )
            else:
                wanted[_scope(item)] = (where, item)
        stored = {_scope(_written(quota)): quota for quota in _rows()}
        for scope in sorted(set(stored) - set(wanted), key=str):
            quota = stored[scope]
            plan.change("delete", _label(_written(quota)), f"{quota.max_gpus} GPUs")
            plan.step("quotas", "quota_remove", quota_id=quota.pk)
        for scope, (where, item) in wanted.items():
            label = _label(item)
            before = stored.get(scope)
            after = (item["max_gpus"], item.get("max_pending"))
            if before is None:
                plan.change("create", label, _limits(*after))
            elif (before.max_gpus, before.max_pending) == after:
                plan.unchanged()
                continue
            else:
                plan.change(
                    "update",
                    label,
                    f"{_limits(before.max_gpus, before.max_pending)} -> {_limits(*after)}",
                )
            plan.step(where, "quota_save", item=dict(item))

    # --- export ---------------------------------------------------------------------------------

    def export_file(self) -> list:
        return [_written(quota) for quota in _rows()]


QUOTAS = QuotaSection()


def _rows():
    return TenantQuota.objects.select_related("tenant", "pool").order_by(
        "tenant__slug", "pool__name", "gpu_model"
    )


def _written(quota: TenantQuota) -> dict:
    item: dict = {"tenant": quota.tenant.slug}
    if quota.pool_id is not None:
        item["pool"] = quota.pool.name
    else:
        item["gpu_model"] = quota.gpu_model
    item["max_gpus"] = quota.max_gpus
    if quota.max_pending is not None:
        item["max_pending"] = quota.max_pending
    return item


def _scope(item: dict) -> tuple:
    return (item["tenant"], item.get("pool") or "", item.get("gpu_model") or "")


def _label(item: dict) -> str:
    tenant = item.get("tenant")
    if item.get("pool") is not None:
        return f"{tenant} in pool {item.get('pool')}"
    return f"{tenant} on {item.get('gpu_model')} GPUs"


def _limits(max_gpus: int, max_pending: int | None) -> str:
    pending = "" if max_pending is None else f", at most {max_pending} pending"
    return f"{max_gpus} GPUs{pending}"


def _written_problems(item: dict) -> dict[str, str]:
    """What is wrong with a quota as written (the same rules as the API's, `quota_problems`;
    whether its tenant and pool exist is checked against the database and the file)."""
    problems: dict[str, str] = {}
    for key in item:
        if key not in KEYS:
            problems[str(key)] = unknown_key(str(key), KEYS)
    if not isinstance(item.get("tenant"), str) or not item["tenant"].strip():
        problems["tenant"] = "is required: the tenant's slug"
    pool = item.get("pool")
    if pool is not None and not isinstance(pool, str):
        problems["pool"] = f"must be a pool's name, got {shown(pool)}"
    found = services.quota_problems(
        pool=Pool(name=pool) if isinstance(pool, str) else None,
        gpu_model=item.get("gpu_model") if item.get("gpu_model") is not None else "",
        max_gpus=item.get("max_gpus"),
        max_pending=item.get("max_pending"),
        check_model=False,
    )
    for key, reason in found.items():
        problems.setdefault(key, reason)
    return problems


# --- the steps, run when the file applies (tenants and pools exist by then) ---------------------


def _quota_save(*, item: dict, actor) -> None:
    services.quota_set(
        tenant=Tenant.objects.get(slug=item["tenant"]),
        pool=Pool.objects.get(name=item["pool"]) if item.get("pool") is not None else None,
        gpu_model=item.get("gpu_model") or "",
        max_gpus=item["max_gpus"],
        max_pending=item.get("max_pending"),
        actor=actor,
    )


def _quota_remove(*, quota_id: int, actor) -> None:
    quota = TenantQuota.objects.filter(pk=quota_id).first()
    if quota is not None:
        services.quota_delete(quota=quota, actor=actor)
