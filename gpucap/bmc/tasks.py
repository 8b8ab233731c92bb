"""The BMC app's Celery tasks: thin, ids in, a service called. Each is idempotent.

- ``bmc.hypervisor_watch`` (beat, every ``HYPERVISOR_WATCH_SECONDS``) probes the hypervisors of
  the nodes that are not down and marks down those silent for ``NODE_DOWN_AFTER_SECONDS``
  (``gpucap.bmc.hypervisor_watch``).
- ``bmc.power_cycle`` (sent when a cycle starts) switches the node's machine off and on through
  its BMC, once per attempt however often it is delivered (``gpucap.bmc.power_cycle``).
- ``bmc.recovery_tick`` (beat, every ``RECOVERY_TICK_SECONDS``) starts automatic cycles, brings
  back nodes whose hypervisor answers after one, and fails cycles past their deadline.
"""

from celery import shared_task

from gpucap.bmc import power_cycle as cycles
from gpucap.bmc.hypervisor_watch import hypervisor_watch as watch


@shared_task(name="bmc.hypervisor_watch")
def hypervisor_watch() -> int:
    """Returns how many nodes it marked down."""
    return len(watch())


@shared_task(name="bmc.power_cycle")
def power_cycle(attempt_id: int) -> bool:
    """Returns whether the machine was switched back on (False: a repeated delivery, or the
    cycle failed, which its attempt records)."""
    return cycles.power_cycle_carry_out(attempt_id=attempt_id)


@shared_task(name="bmc.recovery_tick")
def recovery_tick() -> dict[str, list[int]]:
    return cycles.recovery_tick()
