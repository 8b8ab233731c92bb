"""Power cycles through the BMC and the tick that drives recovery (docs/bmc.md, Recovery).

``power_cycle_carry_out`` (the ``bmc.power_cycle`` task, once per attempt): ForceOff, wait for
the power to read Off, On — a real power cycle, which also works on a hung OS where
ForceRestart may not — then the node waits for its hypervisor. Nothing here depends on the
driver or the BMC's make: the hypervisor is asked through ``Driver.hypervisor_answers``, the
BMC through the Redfish client, and every wait is a setting.

``recovery_tick`` (the ``bmc.recovery_tick`` beat task) fails a cycle whose worker was lost;
brings back each waiting node whose hypervisor answers, and fails those past their boot
deadline; and starts an automatic cycle for each down node whose cluster's policy asks for one,
once the node has been down ``grace_seconds`` and any backoff has passed. A BMC that cannot be
reached is tried again (with backoff, within ``max_attempts``); one that refuses is reported at
once and recovery stops for the node.
"""

import logging
import time
from datetime import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.utils import timezone

from gpucap.bmc import recovery
from gpucap.bmc.bare_metal_selectors import rented_node_ids
from gpucap.bmc.hypervisor_watch import hypervisors_answer
from gpucap.bmc.power import power_state_read, system_reset
from gpucap.bmc.recovery_models import NodeRecovery, RecoveryAttempt, RecoveryPolicy
from gpucap.bmc.redfish import BmcError, BmcTarget
from gpucap.bmc.services import bmc_target
from gpucap.fleet.models import Node

logger = logging.getLogger(__name__)
State = NodeRecovery.State


class _GivenUp(Exception):
    """The cycle is no longer this worker's to finish (the tick failed it meanwhile)."""


def power_cycle_carry_out(*, attempt_id: int) -> bool:
    """Power-cycle the node of an open attempt, once: a second delivery of the task finds the
    attempt claimed and does nothing. Returns whether the machine was switched back on."""
    now = timezone.now()
    cycling = NodeRecovery.objects.filter(
        node__recovery_attempts__pk=attempt_id, state=State.CYCLING
    ).exists()
    # The claim's conditions are the row's own columns: a filter through a relation would make
    # the UPDATE a subquery read before the other delivery's claim committed, and both would
    # win. On its own columns PostgreSQL checks them again on the row it waited for. (A cycle
    # given up between the check and the claim is found by _still_ours before any reset.)
    claimed = (
        RecoveryAttempt.objects.filter(pk=attempt_id, claimed_at=None, finished_at=None).update(
            claimed_at=now
        )
        if cycling
        else 0
    )
    if claimed != 1:
        return False
    attempt = RecoveryAttempt.objects.select_related("node__cluster").get(pk=attempt_id)
    node = attempt.node
    try:
        target = bmc_target(node)
    except ValidationError as error:
        return _failed(node, "; ".join(error.messages), retry=False)
    try:
        words = _switch_off_and_on(target, node)
    except BmcError as error:
        return _failed(node, error.message, retry=error.transient)
    except _GivenUp:
        return False
    timeout = recovery.policy_of(node.cluster).boot_timeout_seconds
    return recovery.cycle_powered_on(attempt=attempt, boot_timeout_seconds=timeout, words=words)


def recovery_tick(*, now: datetime | None = None) -> dict[str, list[int]]:
    """One round of recovery; what it did, by node id: cycles ``started``, nodes ``recovered``,
    cycles ``failed``. ``now`` (tests) stands for the time of the round."""
    now = now or timezone.now()
    done = {"started": [], "recovered": [], "failed": []}
    lost = NodeRecovery.objects.filter(state=State.CYCLING, deadline__lte=now).select_related(
        "node"
    )
    for row in lost:
        if recovery.cycle_failed(
            node_id=row.node_id,
            leaving=State.CYCLING,
            error=f"the power cycle of {row.node.hostname} did not finish by "
            f"{row.deadline:%H:%M:%S} UTC (its worker was lost)",
            retry=True,
        ):
            done["failed"].append(row.node_id)
    waiting = list(
        NodeRecovery.objects.filter(state=State.WAITING)
        .select_related("node__cluster")
        .order_by("node_id")
    )
    answers = hypervisors_answer([row.node for row in waiting])
    for row in waiting:
        if answers.get(row.node_id) and recovery.cycle_recovered(node_id=row.node_id):
            done["recovered"].append(row.node_id)
        elif row.deadline <= now and _boot_timed_out(row):
            done["failed"].append(row.node_id)
    # Last, so a cycle that failed above may start again in this round when its policy allows.
    for node in _due_for_a_cycle(now):
        attempt = recovery.cycle_start(
            node=node,
            trigger=RecoveryAttempt.Trigger.AUTOMATIC,
            message=f"automatic power cycle: {node.hostname} down since "
            f"{node.recovery.down_since:%Y-%m-%d %H:%M:%S} UTC",
        )
        if attempt is not None:
            done["started"].append(node.pk)
    return done


def _switch_off_and_on(target: BmcTarget, node: Node) -> str:
    """ForceOff (unless the machine is off already), wait for Off, then On. What happened, in
    words, for the attempt's history."""
    off_at = None
    if power_state_read(target) != "off":
        system_reset(target, "force_off")
        deadline = time.monotonic() + settings.RECOVERY_POWER_OFF_TIMEOUT_SECONDS
        while (power := power_state_read(target)) != "off":
            _still_ours(node)
            if time.monotonic() >= deadline:
                raise BmcError(
                    f"node {node.hostname}: its power is still {power or 'unknown'} "
                    f"{settings.RECOVERY_POWER_OFF_TIMEOUT_SECONDS} s after ForceOff",
                    kind="unreachable",  # a slow machine: another cycle may do
                )
            time.sleep(settings.RECOVERY_POLL_SECONDS)
        off_at = timezone.now()
    _still_ours(node)
    system_reset(target, "on")
    on_at = timezone.now()
    off = f"power Off at {off_at:%H:%M:%S}" if off_at else "power was Off already"
    return f"{off}, On at {on_at:%H:%M:%S} UTC"


def _still_ours(node: Node) -> None:
    if not NodeRecovery.objects.filter(node=node, state=State.CYCLING).exists():
        raise _GivenUp


def _failed(node: Node, error: str, *, retry: bool) -> bool:
    recovery.cycle_failed(node_id=node.pk, leaving=State.CYCLING, error=error, retry=retry)
    return False


def _boot_timed_out(row: NodeRecovery) -> bool:
    timeout = recovery.policy_of(row.node.cluster).boot_timeout_seconds
    return recovery.cycle_failed(
        node_id=row.node_id,
        leaving=State.WAITING,
        error=f"node {row.node.hostname}: its hypervisor did not answer within {timeout} s "
        "of power on",
        retry=True,
    )


def _due_for_a_cycle(now: datetime) -> list[Node]:
    """Down nodes of clusters with ``auto_power_cycle`` on, whose recovery is idle, past the
    grace and any backoff. A down node without a recovery row yet (down before recovery knew)
    gets one, its grace counted from now."""
    clusters = RecoveryPolicy.objects.filter(auto_power_cycle=True).values_list(
        "cluster_id", flat=True
    )
    # A machine rented whole is its tenant's to switch: never cycled by automation.
    down = Node.objects.filter(state=Node.State.DOWN, cluster_id__in=clusters).exclude(
        pk__in=rented_node_ids()
    )
    for node in down.filter(Q(recovery__isnull=True) | Q(recovery__down_since__isnull=True)):
        recovery.node_went_down(node_id=node.pk, at=now)
    due = []
    candidates = (
        down.filter(recovery__state=State.IDLE)
        .filter(Q(recovery__next_attempt_at__isnull=True) | Q(recovery__next_attempt_at__lte=now))
        .select_related("recovery", "cluster__recovery_policy")
        .order_by("pk")
    )
    for node in candidates:
        grace = node.cluster.recovery_policy.grace_seconds
        if (now - node.recovery.down_since).total_seconds() >= grace:
            due.append(node)
    return due
