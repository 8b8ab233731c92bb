"""The BMC app's Celery tasks: thin, ids in, a service called. Each is idempotent.

``bmc.hypervisor_watch`` (beat, every ``HYPERVISOR_WATCH_SECONDS``) probes the hypervisors of the
nodes that are not down and marks down those silent for ``NODE_DOWN_AFTER_SECONDS``
(``gpucap.bmc.hypervisor_watch``).
"""

from celery import shared_task

from gpucap.bmc.hypervisor_watch import hypervisor_watch as watch


@shared_task(name="bmc.hypervisor_watch")
def hypervisor_watch() -> int:
    """Returns how many nodes it marked down."""
    return len(watch())
