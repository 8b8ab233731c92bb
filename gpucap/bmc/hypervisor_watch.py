"""The hypervisor watch (docs/bmc.md, Recovery, "Down"): every ``HYPERVISOR_WATCH_SECONDS`` the
hypervisor of each node that is not down is asked whether it answers, through its cluster's
driver (``Driver.hypervisor_answers``), a bounded number at a time. A node whose hypervisor has
not answered for ``NODE_DOWN_AFTER_SECONDS`` is marked down, with no actor and the message
"hypervisor unreachable since …"; the fleet's ``node_went_down`` then fails or re-queues its
VMs. One answer before that clears the silence: the node is not marked.

Each result is recorded under the node's row lock and only if no later probe was recorded
first (``HypervisorProbe.probed_at``), so two watches running at once mark a node down once,
and never on a silence an answer has ended since.
"""

import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpucap.bmc.bare_metal_selectors import rented_node_ids
from gpucap.bmc.recovery_models import HypervisorProbe
from gpucap.drivers.base import Driver, DriverError
from gpucap.drivers.registry import driver_for
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Node

logger = logging.getLogger(__name__)


def hypervisor_watch(*, now: datetime | None = None) -> list[Node]:
    """Probe every node that is not down and record what each said; returns the nodes marked
    down. ``now`` (tests) stands for the moment the probes are sent."""
    # A down node is not watched (recovery asks its hypervisor itself): its silence ends there,
    # so the watch starts afresh when the node is back.
    HypervisorProbe.objects.filter(node__state=Node.State.DOWN, silent_since__isnull=False).update(
        silent_since=None
    )
    # A node rented whole runs its tenant's system: no hypervisor there to answer.
    nodes = list(
        Node.objects.exclude(state=Node.State.DOWN)
        .exclude(pk__in=rented_node_ids())
        .select_related("cluster")
        .order_by("pk")
    )
    at = now or timezone.now()
    answers = hypervisors_answer(nodes)
    marked = []
    for node in nodes:
        if node.pk in answers and _record(node, answered=answers[node.pk], at=at):
            marked.append(node)
    return marked


def hypervisors_answer(nodes: Iterable[Node]) -> dict[int, bool]:
    """Whether each node's hypervisor answers, by node id, asked in parallel by at most
    ``HYPERVISOR_PROBE_CONCURRENCY`` threads (each driver bounds its own wait). A node whose
    cluster's driver cannot be built (its settings are wrong) is left out: that says nothing
    about the node."""
    drivers: dict[int, Driver | None] = {}
    asks = []
    for node in nodes:
        if node.cluster_id not in drivers:
            drivers[node.cluster_id] = _driver(node)
        if drivers[node.cluster_id] is not None:
            asks.append((node.pk, drivers[node.cluster_id], node.hostname))
    if not asks:
        return {}
    workers = min(settings.HYPERVISOR_PROBE_CONCURRENCY, len(asks))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hypervisor-probe") as pool:
        futures = {
            node_id: pool.submit(_asked, driver, hostname) for node_id, driver, hostname in asks
        }
    return {node_id: future.result() for node_id, future in futures.items()}


def unreachable_words(since: datetime) -> str:
    return f"hypervisor unreachable since {since:%Y-%m-%d %H:%M:%S} UTC"


@transaction.atomic
def _record(node: Node, *, answered: bool, at: datetime) -> bool:
    """Record one probe of ``node`` sent at ``at``; mark the node down when its hypervisor has
    now been silent for long enough. Returns whether it did."""
    locked = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    probe, _ = HypervisorProbe.objects.get_or_create(node=locked, defaults={"probed_at": at})
    if probe.probed_at > at:
        return False  # a later probe was recorded meanwhile: it knows better
    probe.probed_at = at
    marked = False
    if answered:
        probe.answered_at, probe.silent_since = at, None
    elif locked.state != Node.State.DOWN:
        probe.silent_since = probe.silent_since or at
        if at - probe.silent_since >= timedelta(seconds=settings.NODE_DOWN_AFTER_SECONDS):
            fleet.node_set_state(
                node=locked,
                state=Node.State.DOWN,
                actor=None,
                message=unreachable_words(probe.silent_since),
            )
            probe.silent_since, marked = None, True
    probe.save()
    return marked


def _driver(node: Node) -> Driver | None:
    try:
        return driver_for(node.cluster)
    except DriverError as error:
        logger.warning("hypervisor watch: %s; its nodes are not probed", error)
        return None


def _asked(driver: Driver, hostname: str) -> bool:
    try:
        return bool(driver.hypervisor_answers(hostname))
    except Exception:  # a driver must not raise here; if one does, that is no answer
        logger.exception("hypervisor probe of %s raised", hostname)
        return False
