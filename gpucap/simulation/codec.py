"""A simulation's result as JSON, to be stored and drawn: the steps as columns (one list per
series, a value per step, ready for a chart), the events, the worst moments with the plan the
arbiter made then (DESIGN.md section 7's plan form) and the figures. Times are ISO 8601 UTC;
an unbounded wait (no replica ready) is null."""

from __future__ import annotations

from datetime import datetime

from gpucap.arbiter.codec import plan_to_dict
from gpucap.simulation.result import DeploymentStep, PoolStep, SimulationResult

DEPLOYMENT_SERIES = tuple(
    name for name in DeploymentStep.__dataclass_fields__ if name != "deployment"
)
POOL_SERIES = tuple(name for name in PoolStep.__dataclass_fields__ if name != "pool")


def result_to_dict(result: SimulationResult) -> dict:
    steps = result.steps
    deployments: dict[str, dict[str, list]] = {}
    pools: dict[str, dict[str, list]] = {}
    for step in steps:
        for record in step.deployments:
            series = deployments.setdefault(
                record.deployment, {name: [] for name in DEPLOYMENT_SERIES}
            )
            for name in DEPLOYMENT_SERIES:
                series[name].append(_number(getattr(record, name)))
        for record in step.pools:
            series = pools.setdefault(record.pool, {name: [] for name in POOL_SERIES})
            for name in POOL_SERIES:
                series[name].append(getattr(record, name))
    return {
        "start": _time(result.start),
        "step_seconds": result.step_seconds,
        "plans_made": result.plans_made,
        "steps": {
            "at": [_time(step.at) for step in steps],
            "notices": [step.notices for step in steps],
            "resumes": [step.resumes for step in steps],
            "planned": [step.planned for step in steps],
            "deployments": deployments,
            "pools": pools,
        },
        "events": [
            {
                "at": _time(event.at),
                "kind": event.kind,
                "pool": event.pool,
                "vm": event.vm,
                "node": event.node,
                "tenant": event.tenant,
                "reason": event.reason,
            }
            for event in result.events
        ],
        "worst": [
            {
                "kind": moment.kind,
                "step": moment.step,
                "at": _time(moment.at),
                "value": moment.value,
                "words": moment.words,
                "plan_step": moment.made.step if moment.made is not None else None,
                "plan": plan_to_dict(moment.made.plan) if moment.made is not None else None,
            }
            for moment in result.worst
        ],
        "figures": [
            {
                "key": figure.key,
                "label": figure.label,
                "value": figure.value,
                "unit": figure.unit,
                "shown": figure.shown(),
            }
            for figure in result.figures()
        ],
    }


def _number(value: float | int | None) -> float | int | None:
    if isinstance(value, float):
        return round(value, 3)
    return value


def _time(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
