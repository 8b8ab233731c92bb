"""Why a pending VM waits, as ``/api/vms/`` shows it (``waiting``).

The answer needs the arbiter's plans, which sit above rentals: ``gpucap.plans`` hands its reader
in here from its ``AppConfig.ready()`` (``waiting_source_set``), so rentals never imports plans.
Without a reader (plans not installed) no VM says why it waits.
"""

from collections.abc import Callable, Iterable

from gpucap.rentals.models import VirtualMachine

# VMs in, {vm id: {"reason", "message", "starts_by"}} out for those that are pending.
WaitingSource = Callable[[Iterable[VirtualMachine]], dict[int, dict]]

_source: WaitingSource | None = None


def waiting_source_set(source: WaitingSource | None) -> None:
    global _source
    _source = source


def waiting_for(vms: Iterable[VirtualMachine]) -> dict[int, dict]:
    """Each pending VM of ``vms`` (by id) with why it waits; a fixed number of queries."""
    return _source(vms) if _source is not None else {}
