"""Reads of what gpucap keeps about BMCs, shared by the node page and the API."""

from dataclasses import dataclass
from datetime import datetime

from gpucap.bmc.models import Provisioning
from gpucap.fleet.models import Node

State = Provisioning.State
HISTORY = 10  # runs the node page and the API show


@dataclass(frozen=True)
class ProvisioningStep:
    """One step of a run as the page and the API show it: ``status`` is "done", "current",
    "failed" or "pending"; ``at`` when it began (None: not yet)."""

    state: str
    label: str
    at: datetime | None
    status: str


def provisionings_of(node: Node, *, limit: int = HISTORY) -> list[Provisioning]:
    """The node's runs, newest first, with who asked. One query."""
    return list(
        Provisioning.objects.filter(node=node)
        .select_related("requested_by")
        .order_by("-started_at", "-id")[:limit]
    )


def provisioning_steps(run: Provisioning) -> list[ProvisioningStep]:
    """Inserting, booting, waiting and the outcome, each with when it began."""
    reached = _reached(run)
    steps = []
    began = ((State.INSERTING, run.started_at), (State.BOOTING, run.inserted_at))
    for position, (state, at) in enumerate((*began, (State.WAITING, run.reset_at))):
        if position < reached:
            status = "done"
        elif position > reached:
            status = "pending"
        else:
            status = "failed" if run.state == State.FAILED else "current"
        shown = at if position <= reached else None
        steps.append(ProvisioningStep(state, State(state).label, shown, status))
    outcome = State.FAILED if run.state == State.FAILED else State.DONE
    status = "pending" if run.finished_at is None else str(outcome)
    steps.append(ProvisioningStep(outcome, State(outcome).label, run.finished_at, status))
    return steps


def _reached(run: Provisioning) -> int:
    """Which of inserting (0), booting (1) and waiting (2) the run is in, or stopped in; 3 once
    it is done."""
    if run.state == State.DONE:
        return 3
    if run.state != State.FAILED:
        return [State.INSERTING, State.BOOTING, State.WAITING].index(run.state)
    if run.inserted_at is None:
        return 0
    return 1 if run.reset_at is None else 2
