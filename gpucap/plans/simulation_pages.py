"""What the pages show of a load simulation (issue 21), from stored result dicts
(``gpucap.simulation.codec.result_to_dict``): the figures, the charts, the worst moments with
the plan the arbiter made then, and the differences between two results.

The worst moments' plans are shown by templates/plans/plan_lines.html, the template that shows a
stored plan's lines: ``simulated_plan`` adapts a plan dict (DESIGN.md section 7's plan form) to
the names that template reads, so the explanations are the same words. A simulated VM or node is
a name only: it has no ``pk``, and the template links nothing. No query here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gpucap.plans.selectors import PoolBalance, pool_balance_rows
from gpucap.plans.services import placement_words
from gpucap.plans.simulation_charts import SimulationCharts, simulation_charts
from gpucap.web.charts import KIND_LABELS

# Figures whose smaller value is the better one (by the end of their key); the others (spot
# resumes) have no better side.
LOWER_IS_BETTER = (
    "notices_per_day",
    "most_below_floor",
    "p99_wait",
    "over_threshold_per_day",
    "refused_per_day",
    "most_queued",
)


@dataclass(frozen=True)
class SimulationShown:
    figures: list[dict]  # the result's figures: key, label, value, unit, shown
    charts: SimulationCharts
    worst: list[WorstShown]


@dataclass(frozen=True)
class WorstShown:
    kind: str  # notices, wait
    at: datetime
    words: str
    plan_at: datetime | None  # when the arbiter made the plan shown (None: no plan made yet)
    plan: SimulatedPlan | None
    lines: SimulatedLines | None


@dataclass(frozen=True)
class DifferenceRow:
    label: str
    before: str
    after: str
    direction: str  # better, worse, or "" where neither is clear


@dataclass(frozen=True)
class SimulationCompared:
    """Two results side by side: the differences, and each chart of one next to the same
    chart of the other."""

    today: SimulationShown
    edited: SimulationShown
    differences: list[DifferenceRow]

    @property
    def chart_pairs(self) -> list[tuple]:
        """(today's chart, the edited run's chart), one pair per chart either run has."""
        mine, theirs = self.today.charts.all, self.edited.charts.all
        width = max(len(mine), len(theirs))
        return [
            (mine[n] if n < len(mine) else None, theirs[n] if n < len(theirs) else None)
            for n in range(width)
        ]


def simulation_compared(
    result: Mapping,
    variant: Mapping,
    *,
    differences: Sequence[Mapping] | None = None,
    kinds: Mapping[str, str] | None = None,
) -> SimulationCompared:
    # Twin charts share a scale: drawn once to learn each axis's reach, then again to it.
    reach: dict[str, float] = {}
    for prefix, run in (("today", result), ("edited", variant)):
        for chart in simulation_charts(run, kinds=kinds, prefix=prefix).all:
            name = chart.chart_id.removeprefix(f"{prefix}-")
            reach[name] = max(reach.get(name, 0), _axis_max(chart.svg))
    return SimulationCompared(
        today=simulation_shown(result, kinds=kinds, prefix="today", reach=reach),
        edited=simulation_shown(variant, kinds=kinds, prefix="edited", reach=reach),
        differences=difference_rows(result, variant, differences=differences),
    )


def simulation_shown(
    result: Mapping,
    *,
    kinds: Mapping[str, str] | None = None,
    prefix: str = "sim",
    reach: Mapping[str, float] | None = None,
) -> SimulationShown:
    """One result as the page shows it. ``kinds``: pool name -> kind, for colours and badges."""
    kinds = kinds or {}
    at = result["steps"]["at"]
    worst = []
    for moment in result["worst"]:
        plan_step = moment["plan_step"]
        plan = lines = None
        if moment["plan"] is not None:
            plan, lines = simulated_plan(moment["plan"], result=result, step=plan_step, kinds=kinds)
        worst.append(
            WorstShown(
                kind=moment["kind"],
                at=_parse(moment["at"]),
                words=moment["words"],
                plan_at=_parse(at[plan_step]) if plan_step is not None else None,
                plan=plan,
                lines=lines,
            )
        )
    return SimulationShown(
        figures=list(result["figures"]),
        charts=simulation_charts(result, kinds=kinds, prefix=prefix, reach=reach),
        worst=worst,
    )


def difference_rows(
    result: Mapping, variant: Mapping, *, differences: Sequence[Mapping] | None = None
) -> list[DifferenceRow]:
    """Today's result against the edited one: ``differences`` as stored
    ([{"label", "before", "after"}]), or without them the figures whose shown values differ;
    each with its direction."""
    if differences is None:
        theirs = {figure["key"]: figure for figure in variant["figures"]}
        differences = [
            {"label": figure["label"], "before": figure["shown"], "after": other["shown"]}
            for figure in result["figures"]
            if (other := theirs.get(figure["key"])) and other["shown"] != figure["shown"]
        ]
    return [_row(d, result["figures"], variant["figures"]) for d in differences]


def _row(difference: Mapping, before: list[dict], after: list[dict]) -> DifferenceRow:
    """A difference with its direction, read from the two figures of its label."""
    label = difference["label"]
    old = next((f for f in before if f["label"] == label), None)
    new = next((f for f in after if f["label"] == label), None)
    direction = ""
    if old and new and old["key"].endswith(LOWER_IS_BETTER):
        old_value, new_value = _value(old), _value(new)
        if new_value < old_value:
            direction = "better"
        elif new_value > old_value:
            direction = "worse"
    return DifferenceRow(label, difference["before"], difference["after"], direction)


def _axis_max(svg: str) -> float:
    """The top of a chart's (left) axis, as its root's ``data-max`` says ("1,200")."""
    found = re.search(r'data-max="([0-9.,]+)"', svg)
    return float(found.group(1).replace(",", "")) if found else 0.0


def _value(figure: Mapping) -> float:
    return math.inf if figure["value"] is None else float(figure["value"])


# --- a simulated plan, in the names templates/plans/plan_lines.html reads -----------------------


@dataclass(frozen=True)
class SimulatedVm:
    name: str
    gpu_count: int | str = ""
    pk: None = None  # nothing to link to
    instance_id: str = ""


@dataclass(frozen=True)
class SimulatedNode:
    hostname: str
    pk: None = None


@dataclass(frozen=True)
class SimulatedTenant:
    name: str


@dataclass(frozen=True)
class SimulatedPool:
    name: str
    kind: str = ""

    @property
    def get_kind_display(self) -> str:
        return KIND_LABELS.get(self.kind, self.kind)


@dataclass(frozen=True)
class SimulatedAction:
    vm: SimulatedVm
    gpus: list[int]
    reason: str
    tenant: SimulatedTenant | None = None
    pool: SimulatedPool | None = None
    node: SimulatedNode | None = None
    for_vm: SimulatedVm | None = None
    running_since: None = None
    waits_until: datetime | None = None


@dataclass(frozen=True)
class SimulatedPlan:
    """A plan's counts, as the headings of plans/plan_lines.html read them."""

    complete: bool
    placements: int
    preemptions: int
    preempted_gpus: int
    unsatisfied: int
    pools: int
    status: str = "simulated"


@dataclass(frozen=True)
class SimulatedLines:
    placements: list[SimulatedAction]
    preemptions: list[SimulatedAction]
    unsatisfied: list[SimulatedAction]
    balances: list[PoolBalance]
    # Every line is shown: none is held back for a "see all" link.
    placements_not_shown: int = field(default=0)
    preemptions_not_shown: int = field(default=0)
    unsatisfied_not_shown: int = field(default=0)


def simulated_plan(
    plan: Mapping, *, result: Mapping, step: int, kinds: Mapping[str, str]
) -> tuple[SimulatedPlan, SimulatedLines]:
    """A plan dict the simulator's arbiter made at ``step`` of ``result``, with each pool's
    rank and pending GPUs then."""
    pools = result["steps"]["pools"]

    def pool(name: str) -> SimulatedPool:
        return SimulatedPool(name, kinds.get(name, ""))

    placements = [
        SimulatedAction(
            vm=SimulatedVm(p["demand"]),
            gpus=list(p["gpus"]),
            reason=placement_words(p["preempts"]),
            node=SimulatedNode(p["node"]),
        )
        for p in plan["placements"]
    ]
    preemptions = [
        SimulatedAction(
            vm=SimulatedVm(p["vm"]),
            gpus=list(p["gpus"]),
            reason=p["reason"],
            tenant=SimulatedTenant(p.get("tenant") or ""),
            pool=pool(p["pool"]),
            node=SimulatedNode(p["node"]),
            for_vm=SimulatedVm(p["for"]),
        )
        for p in plan["preemptions"]
    ]
    unsatisfied = [
        SimulatedAction(
            vm=SimulatedVm(u["demand"]),
            gpus=[],
            reason=u["reason"],
            waits_until=_parse(u["waits_until"]) if u.get("waits_until") else None,
        )
        for u in plan["unsatisfied"]
    ]
    balances = pool_balance_rows(
        [
            {
                **entry,
                "rank": pools[entry["name"]]["rank"][step] if entry["name"] in pools else 0,
                "kind": kinds.get(entry["name"], ""),
                "pending_gpus": (
                    pools[entry["name"]]["pending_gpus"][step] if entry["name"] in pools else 0
                ),
            }
            for entry in plan["pools"]
        ]
    )
    counts = SimulatedPlan(
        complete=plan["complete"],
        placements=len(placements),
        preemptions=len(preemptions),
        preempted_gpus=sum(len(p.gpus) for p in preemptions),
        unsatisfied=len(unsatisfied),
        pools=len(balances),
    )
    return counts, SimulatedLines(placements, preemptions, unsatisfied, balances)


def _parse(moment: str) -> datetime:
    return datetime.fromisoformat(moment.replace("Z", "+00:00"))
