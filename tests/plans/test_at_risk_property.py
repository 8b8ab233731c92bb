"""At risk over both fabrics, by hypothesis (issue #17): after any sequence of requests,
withdrawals, approvals and ticks in a dry-run set, NVSwitch (h100-east) or PCIe (l40s-east),
the VMs at risk are exactly the victims of the set's proposed plan (none once it is applied or
does nothing), and a VM that stays at risk keeps the time it first became so."""

from contextlib import suppress

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucap.arbiter.topology import block_sizes
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.plans import services as plans
from gpucap.plans.invariants import invariants_audit
from gpucap.plans.models import Plan, PlanAction
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from tests.rentals.vm_helpers import request_vm, running_vm

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("request"), st.integers(0, 3)),  # a block size of the fabric, by index
        st.tuples(st.just("withdraw"), st.integers(0, 7)),  # one of globex's VMs, by index
        st.tuples(st.just("approve"), st.none()),
        st.tuples(st.just("replan"), st.none()),  # the set changes; who is reclaimed may not
    ),
    min_size=1,
    max_size=8,
)


@pytest.fixture
def both_fabrics(fleet_east, tenant, other_tenant, full_set):
    """h100-east full of acme's 4-GPU spot VMs (``full_set``) and l40s-east full of acme's
    1-GPU spot VMs; globex rents on-demand VMs in both. Set name -> (set, on-demand pool)."""
    pools, nodes, l40s = fleet_east["pools"], fleet_east["nodes"], fleet_east["sets"]["l40s-east"]
    fleet.pool_set_tenants(pool=pools["h100-ondemand"], tenants=[other_tenant])
    l40s_spot = fleet.pool_create(
        name="l40s-spot", kind="spot", cluster=fleet_east["cluster"], capacity_set=l40s, rank=2
    )
    fleet.pool_set_tenants(pool=l40s_spot, tenants=[tenant])
    for n, node in enumerate(("l40s-001", "l40s-002")):
        for gpu in range(4):
            running_vm(
                tenant,
                l40s_spot,
                nodes[node],
                [gpu],
                name=f"l40s-spot-{n}{gpu}",
                ip=f"10.51.{n}.{gpu}",
            )
    return {
        "h100-east": (fleet_east["sets"]["h100-east"], pools["h100-ondemand"]),
        "l40s-east": (l40s, pools["l40s-ondemand"]),
    }


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(name=st.sampled_from(["h100-east", "l40s-east"]), steps=STEPS)
def test_at_risk_is_exactly_the_proposed_plans_victims_after_any_ticks(
    both_fabrics, other_tenant, operator, name, steps
):
    capacity_set, ondemand = both_fabrics[name]
    sizes = block_sizes(capacity_set.fabric)
    # Each example in a transaction rolled back after it: the next one starts from the fixture.
    with transaction.atomic():
        before: dict[int, object] = {}
        for n, (step, arg) in enumerate(steps):
            _act(
                step,
                arg,
                n,
                capacity_set=capacity_set,
                ondemand=ondemand,
                sizes=sizes,
                tenant=other_tenant,
                operator=operator,
            )
            plans.capacity_set_tick(capacity_set_id=capacity_set.pk)
            now = _at_risk(capacity_set)
            assert set(now) == _victims_of_proposal(capacity_set), steps[: n + 1]
            for vm_id in set(now) & set(before):
                assert now[vm_id] == before[vm_id], "a replan moved noticeTime forward"
            before = now
        report = invariants_audit()
        assert not [v for v in report.violations if v.rule == "at_risk_matches_plans"]
        transaction.set_rollback(True)


def _act(step, arg, n, *, capacity_set, ondemand, sizes, tenant, operator) -> None:
    if step == "request":
        request_vm(tenant, ondemand, name=f"od-{n}", gpu_count=sizes[arg % len(sizes)])
    elif step == "withdraw":
        mine = list(
            VirtualMachine.objects.filter(pool=ondemand)
            .exclude(state=VirtualMachine.State.TERMINATED)
            .order_by("pk")
        )
        if mine:
            rentals.vm_terminate(vm=mine[arg % len(mine)], actor=operator)
    elif step == "approve":
        proposal = Plan.objects.filter(capacity_set=capacity_set, status="proposed").first()
        # A stale approval is refused and the fresh plan kept, as an operator would see it.
        if proposal is not None:
            with suppress(Conflict):
                plans.plan_approve(plan=proposal, actor=operator)
    else:
        node = capacity_set.nodes.order_by("hostname").first()
        fleet.node_cordon(node=node, actor=operator)
        fleet.node_uncordon(node=node, actor=operator)


def _at_risk(capacity_set) -> dict[int, object]:
    flagged = VirtualMachine.objects.filter(pool__capacity_set=capacity_set).exclude(
        at_risk_since=None
    )
    return dict(flagged.values_list("pk", "at_risk_since"))


def _victims_of_proposal(capacity_set) -> set[int]:
    return set(
        PlanAction.objects.filter(
            plan__capacity_set=capacity_set,
            plan__status=Plan.Status.PROPOSED,
            kind=PlanAction.Kind.PREEMPTION,
        ).values_list("vm_id", flat=True)
    )
