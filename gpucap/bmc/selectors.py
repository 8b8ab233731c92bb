"""Reads shared by the pages (the node page's BMC panel) and the API, each a fixed number of
queries."""

from collections import Counter
from dataclasses import dataclass

from gpucap.bmc.discovery_runs import run_result
from gpucap.bmc.models import BmcCredential, DiscoveryRun, NodeInventory
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
