"""Reads shared by the pages (the node page's BMC and provisioning panels, the cluster page's
discoveries) and the API, each a fixed number of queries."""

from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from gpucap.bmc.discovery_runs import run_result
from gpucap.bmc.models import BmcCredential, DiscoveryRun, NodeInventory, Provisioning
from gpucap.fleet.models import Node


@dataclass(frozen=True)
class CpuGroup:
    count: int
    model: str
    cores: int | None
    threads: int | None


@dataclass(frozen=True)
class BmcPanel:
    """What the node page shows of its BMC: how gpucap logs in (never the password), what the
    BMC last said the machine is, and the node's latest discovery with its change lines."""

    credential: BmcCredential | None
    inventory: NodeInventory | None
    run: DiscoveryRun | None
    stale_run: DiscoveryRun | None  # the run refused for the fresh preview ``run`` is
    lines: tuple[str, ...]
    summary: str
    can_rediscover: bool

    @property
    def polling(self) -> bool:
        """A discovery is being read or applied: the panel asks again shortly."""
        return self.run is not None and self.run.state in DiscoveryRun.ACTIVE

    @property
    def cpu_groups(self) -> list[CpuGroup]:
        """The CPUs as "2 x Xeon 8480+ (56 cores, 112 threads)": alike ones counted."""
        facts = self.inventory.facts if self.inventory else {}
        counted = Counter(
            (cpu.get("model", ""), cpu.get("cores"), cpu.get("threads"))
            for cpu in facts.get("cpus", [])
        )
        return [
            CpuGroup(n, model, cores, threads) for (model, cores, threads), n in counted.items()
        ]

    @property
    def gpu_models(self) -> list[tuple[str, int]]:
        """The GPUs' models, each with how many cards are of it."""
        facts = self.inventory.facts if self.inventory else {}
        return list(Counter(gpu.get("model", "") for gpu in facts.get("gpus", [])).items())


def bmc_panel(node: Node) -> BmcPanel:
    """The panel of ``node``: two queries (its credential and inventory; its latest run)."""
    found = (
        Node.objects.filter(pk=node.pk).select_related("bmc_credential", "bmc_inventory").first()
    )
    credential = getattr(found, "bmc_credential", None)
    inventory = getattr(found, "bmc_inventory", None)
    run = (
        DiscoveryRun.objects.filter(node=node)
        .select_related("stale_run")
        .order_by("-created_at", "-id")
        .first()
    )
    stale = getattr(run, "stale_run", None) if run is not None else None
    result = run_result(run) if run is not None else None
    return BmcPanel(
        credential=credential,
        inventory=inventory,
        run=run,
        stale_run=stale,
        lines=tuple(result.lines()) if result else (),
        summary=result.summary() if result else "",
        can_rediscover=bool(node.bmc_address) and credential is not None,
    )


# --- discoveries of a cluster (its page) -------------------------------------------------------

RECENT_DISCOVERIES = 10  # runs the cluster page lists


def discoveries_of_cluster(cluster: str, *, limit: int = RECENT_DISCOVERIES) -> list[DiscoveryRun]:
    """The runs that read a BMC of ``cluster`` (named by any of their entries: the page's, the
    API's, a node's Rediscover), newest first, with who asked. One query."""
    return list(
        DiscoveryRun.objects.filter(entries__contains=[{"cluster": cluster}])
        .select_related("requested_by")
        .order_by("-created_at", "-id")[:limit]
    )


def discovery_of_cluster(cluster: str, run_id: int) -> DiscoveryRun | None:
    """Run ``run_id`` if it read a BMC of ``cluster``, with its fresh run. One query."""
    return (
        DiscoveryRun.objects.filter(pk=run_id, entries__contains=[{"cluster": cluster}])
        .select_related("requested_by", "applied_by", "fresh_run")
        .first()
    )


# --- provisioning by virtual media ---------------------------------------------------------------

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
