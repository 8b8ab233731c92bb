"""Least disruption over the whole plan (rules 7 and 8), against an exact integer program.

Disruption is rule 7's order over all the victims of a plan, as the planner reads rule 7
(`planner.disruption_cost`): the most important pool touched, as unimportant as possible; then
fewest preempted GPUs; then fewest preempted VMs; then least progress lost. As one number, for
a ratio (`exact.scalar`):

    D = W(top) x (GPUs + (VMs + lost) / (G + 1)),   W(rank) = 1024 ** (lowest rank - rank)

where ``top`` is the rank of the most important pool the plan preempts from, ``G`` the set's
GPUs (<= 512) and ``lost`` the victims' running time as a fraction in [0, 1). Touching a more
important pool costs at least 1024 / 513 times more than anything that touches only less
important ones, so a plan that touches a pool the optimum spares has a ratio far above 1.5;
within a level the ratio is about the ratio of preempted GPUs. A plan with no victim is 0.

The optimum (`exact.least_disruption`, HiGHS) serves exactly the groups the plan served, with
rule 6 (free capacity first) and the order of service relaxed: it only lowers the optimum, so
the comparison is stricter than "the best legal plan that serves the same demands".

The sets (`contested.contested_set`) have up to 64 nodes of both fabrics, node-specific
partition tables (HGX non-adjacent pairs, crossed tables), failed GPUs, cordoned and down nodes,
four or five ranked pools with floors, deployments with min_replicas, notified VMs, and pending
gang groups of 1-6 demands from several pools asking for more GPUs than are free, so most sets
need reclaims on both fabrics. The bar is asserted over the sets where the plan preempts (at
least 300, at least 120 of each fabric); the mean over all sets, counting a set without victims
as 1, is printed for reference.

Measured (400 sets, 318 with victims): mean 1.0088 over the sets with victims (NVSwitch 142
sets, 1.0197; PCIe 176 sets, 1.0000), worst 1.216 (NVSwitch seed 107); 1.0070 over all sets.
The NVSwitch half alone is not within 1 % (see improve.py for what is left).
"""

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucap.arbiter.planner import plan
from tests.arbiter.contested import contested_set
from tests.arbiter.exact import (
    disruption_of,
    least_disruption,
    plan_disruption,
    scalar,
    served_groups,
)
from tests.arbiter.fleets import snapshots
from tests.arbiter.oracle import Oracle, service_order
from tests.arbiter.rules import rule_violations

SETS_PER_FABRIC = 200
MEAN_BAR = 1.01
WORST_BAR = 1.5


class _OracleWithoutRule6(Oracle):
    """The exhaustive oracle with rule 6 relaxed, as in the integer program."""

    def _free_block_exists(self, fleet, size):
        return False


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), fabric=st.sampled_from(("nvswitch", "pcie")))
def test_the_integer_program_agrees_with_exhaustive_search_on_single_groups(data, fabric):
    snapshot = data.draw(
        snapshots(fabric=fabric, max_nodes=4, min_demands=1, max_demands=3, crowded=True)
    )
    groups = service_order(snapshot)
    for group, demands in groups:
        oracle = _OracleWithoutRule6(snapshot)
        options = oracle.group_placements(oracle.start(), demands)
        expected = None
        for _, victims, _ in options:
            found = disruption_of(snapshot, [oracle.vms[v] for v in victims])
            if expected is None or found.key < expected.key:
                expected = found
        exact = least_disruption(snapshot, {group})
        if expected is None:
            assert exact is None
            continue
        assert exact is not None
        assert exact.key[:3] == expected.key[:3]
        assert abs(exact.seconds_lost - expected.seconds_lost) < 1e-6


def test_plans_are_within_1_percent_of_the_exact_optimum_on_sets_with_victims():
    ratios: dict[str, list[float]] = {"nvswitch": [], "pcie": []}
    every: list[float] = []
    worst = (0.0, "")
    for fabric in ("nvswitch", "pcie"):
        for seed in range(SETS_PER_FABRIC):
            snapshot = contested_set(random.Random(seed), fabric)
            result = plan(snapshot)
            assert not rule_violations(snapshot, result), (fabric, seed)
            planned = scalar(snapshot, plan_disruption(snapshot, result))
            optimum = least_disruption(snapshot, served_groups(snapshot, result))
            assert optimum is not None, f"{fabric} {seed}: the plan itself serves these groups"
            best = scalar(snapshot, optimum)
            assert best <= planned * (1 + 1e-9), f"{fabric} {seed}: the optimum exceeds the plan"
            if planned == 0:
                every.append(1.0)
                continue
            ratio = planned / best if best else float("inf")
            ratios[fabric].append(ratio)
            every.append(ratio)
            worst = max(worst, (ratio, f"{fabric} seed {seed}"))
    contested = ratios["nvswitch"] + ratios["pcie"]
    mean = sum(contested) / len(contested)
    per_fabric = ", ".join(
        f"{fabric} {len(found)} sets mean {sum(found) / len(found):.4f}"
        for fabric, found in ratios.items()
    )
    figures = (
        f"disruption / exact optimum over the {len(contested)} sets with victims: mean "
        f"{mean:.4f}, worst {worst[0]:.3f} ({worst[1]}); {per_fabric}; over all "
        f"{len(every)} sets: mean {sum(every) / len(every):.4f}"
    )
    print(figures)
    assert len(contested) >= 300, figures
    assert min(len(found) for found in ratios.values()) >= 120, figures
    assert mean <= MEAN_BAR, figures
    assert worst[0] <= WORST_BAR, figures
