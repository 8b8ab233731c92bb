"""Recovery's state changes (docs/bmc.md, Recovery): a power cycle started (by an operator, or
automatically by the tick), failed, or ended with the node back; recovery cleared after it
stopped; a cluster's policy set. Each move of ``NodeRecovery.state`` is a conditional update on
the state it leaves, under the row's lock, so two workers never start, finish or fail one
cycle twice; the database allows one open ``RecoveryAttempt`` per node besides. Every change is
audited. The BMC itself is spoken to by ``gpucap.bmc.power_cycle``, never here.
"""

from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from gpucap.audit.services import Actor, audit_record
from gpucap.bmc.bare_metal_selectors import rented_node_ids
from gpucap.bmc.recovery_models import (
    BOOT_TIMEOUT_SECONDS_MAX,
    GRACE_SECONDS_MAX,
    MAX_ATTEMPTS_MAX,
    NodeRecovery,
    RecoveryAttempt,
    RecoveryPolicy,
)
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster, Node
from gpucap.tasks import enqueue_on_commit

State = NodeRecovery.State
Trigger = RecoveryAttempt.Trigger
Outcome = RecoveryAttempt.Outcome
BACKOFF_MAX_SECONDS = 3600


def policy_of(cluster: Cluster) -> RecoveryPolicy:
    """The cluster's policy, or the defaults (unsaved) when it has none."""
    policy = RecoveryPolicy.objects.filter(cluster=cluster).first()
    return policy or RecoveryPolicy(cluster=cluster)


@transaction.atomic
def power_cycle_request(*, node: Node, actor: Actor) -> RecoveryAttempt:
    """An operator's Power-cycle of a down node, whatever the cluster's policy says: allowed
    when recovery is idle or stopped (a stopped recovery stays stopped if this one fails too).
    Refused (409) for a node that is not down, has no BMC to ask, or is being cycled already."""
    locked = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    if locked.state != Node.State.DOWN:
        raise Conflict(
            f"node {locked.hostname} is {locked.state}, not down: a power cycle would cut "
            "the power under its VMs",
            code="node_not_down",
        )
    if rented_node_ids().filter(node_id=locked.pk).exists():
        raise Conflict(
            f"node {locked.hostname} is rented whole to a tenant: its power is the tenant's "
            "(power on, off and reset on its Machines page); reclaim the rental first",
            code="node_rented",
        )
    if not locked.bmc_address or not hasattr(locked, "bmc_credential"):
        missing = "BMC address" if not locked.bmc_address else "BMC credentials"
        raise Conflict(
            f"node {locked.hostname} has no {missing}: set its BMC before power-cycling it",
            code="no_bmc",
        )
    attempt = cycle_start(
        node=locked, trigger=Trigger.OPERATOR, actor=actor, from_states=(State.IDLE, State.STOPPED)
    )
    if attempt is None:
        raise Conflict(
            f"node {locked.hostname} is being power-cycled already; wait for that cycle to end",
            code="cycle_running",
        )
    return attempt


@transaction.atomic
def cycle_start(
    *,
    node: Node,
    trigger: str,
    actor: Actor = None,
    from_states: tuple[str, ...] = (State.IDLE,),
    message: str = "",
) -> RecoveryAttempt | None:
    """Start a power cycle of ``node`` if its recovery is in one of ``from_states``: the state
    becomes ``cycling``, an attempt opens and ``bmc.power_cycle`` is sent once this commits.
    None when another worker started one first, or the state forbids it."""
    now = timezone.now()
    recovery_row(node=node)
    started = NodeRecovery.objects.filter(node=node, state__in=from_states).update(
        state=State.CYCLING,
        deadline=now + timedelta(seconds=cycle_seconds()),
        next_attempt_at=None,
        updated_at=now,
    )
    if started != 1:
        return None
    attempt = RecoveryAttempt.objects.create(
        node=node,
        trigger=trigger,
        actor=actor if actor is not None and actor.is_authenticated else None,
        started_at=now,
    )
    audit_record(
        actor=actor,
        verb="bmc.power_cycle",
        target=node,
        after={"trigger": trigger},
        message=message or f"power cycle of {node.hostname} requested",
    )
    enqueue_on_commit("bmc.power_cycle", attempt.pk)
    return attempt


@transaction.atomic
def cycle_powered_on(*, attempt: RecoveryAttempt, boot_timeout_seconds: int, words: str) -> bool:
    """The machine was switched off and on: wait for its hypervisor until the boot deadline.
    False when the cycle was given up meanwhile (the tick failed it): nothing changes."""
    now = timezone.now()
    moved = NodeRecovery.objects.filter(node_id=attempt.node_id, state=State.CYCLING).update(
        state=State.WAITING,
        deadline=now + timedelta(seconds=boot_timeout_seconds),
        updated_at=now,
    )
    if moved != 1:
        return False
    RecoveryAttempt.objects.filter(pk=attempt.pk, finished_at=None).update(
        powered_on_at=now,
        message=f"{words}; waiting for its hypervisor until "
        f"{now + timedelta(seconds=boot_timeout_seconds):%H:%M:%S} UTC",
    )
    return True


@transaction.atomic
def cycle_recovered(*, node_id: int) -> bool:
    """The hypervisor of a node waiting for it answers: recovery is idle again, its failures
    forgotten, and the node ``ready`` (``node_recovered``). False if it was not waiting."""
    recovery = _locked(node_id, State.WAITING)
    if recovery is None:
        return False
    attempt = _open_attempt(node_id)
    now = timezone.now()
    since = attempt.powered_on_at if attempt and attempt.powered_on_at else now
    words = f"its hypervisor answered {int((now - since).total_seconds())} s after power on"
    _move(recovery, State.IDLE, attempts=0, last_error="", down_since=None, next_attempt_at=None)
    if attempt is not None:
        _finish(attempt, Outcome.RECOVERED, words, now=now)
    fleet.node_recovered(node=recovery.node, message=f"recovered by a power cycle: {words}")
    return True


@transaction.atomic
def cycle_failed(*, node_id: int, leaving: str, error: str, retry: bool) -> bool:
    """A power cycle of the node failed while ``leaving`` (cycling or waiting). It counts: the
    next automatic one waits (backoff), and after the policy's ``max_attempts`` failures in a
    row, or at once when ``retry`` is False (a BMC that refuses: wrong credentials, an action
    refused), recovery is ``stopped`` until an operator clears it. False when the node was
    not in that state (another worker ended the cycle first): nothing changes."""
    recovery = _locked(node_id, leaving)
    if recovery is None:
        return False
    now = timezone.now()
    attempts = recovery.attempts + 1
    policy = policy_of(recovery.node.cluster)
    stopped = not retry or attempts >= policy.max_attempts
    backoff = min(settings.RECOVERY_BACKOFF_SECONDS * 2 ** (attempts - 1), BACKOFF_MAX_SECONDS)
    _move(
        recovery,
        State.STOPPED if stopped else State.IDLE,
        attempts=attempts,
        last_error=error,
        next_attempt_at=None if stopped else now + timedelta(seconds=backoff),
    )
    attempt = _open_attempt(node_id)
    if attempt is not None:
        _finish(attempt, Outcome.FAILED if retry else Outcome.REFUSED, error, now=now)
    if stopped:
        why = "the BMC refused" if not retry else f"{attempts} power cycles failed in a row"
        words = f"recovery stopped ({why}) until an operator clears it: {error}"
    else:
        words = f"power cycle {attempts} of {policy.max_attempts} failed: {error}"
    audit_record(
        actor=None,
        verb="bmc.recovery_stop" if stopped else "bmc.power_cycle_failed",
        target=recovery.node,
        after={"state": recovery.state, "attempts": attempts},
        message=words,
    )
    return True


@transaction.atomic
def recovery_clear(*, node: Node, actor: Actor) -> NodeRecovery:
    """An operator clears a stopped recovery: its failures are forgotten and automation may
    touch the node again. Refused (409) when recovery is not stopped."""
    recovery = _locked(node.pk, State.STOPPED)
    if recovery is None:
        raise Conflict(
            f"recovery of node {node.hostname} is not stopped: nothing to clear",
            code="recovery_not_stopped",
        )
    before = {"state": recovery.state, "attempts": recovery.attempts}
    error = recovery.last_error
    _move(recovery, State.IDLE, attempts=0, last_error="", next_attempt_at=None)
    audit_record(
        actor=actor,
        verb="bmc.recovery_clear",
        target=recovery.node,
        before=before,
        after={"state": State.IDLE, "attempts": 0},
        message=f"cleared after: {error}" if error else "",
    )
    return recovery


def recovery_row(*, node: Node) -> NodeRecovery:
    """The node's recovery, created idle on first need."""
    recovery, _ = NodeRecovery.objects.get_or_create(node=node)
    return recovery


def node_went_down(*, node_id: int, at: datetime | None = None) -> None:
    """The node went down (the fleet's ``node_went_down``): the grace counts from now."""
    NodeRecovery.objects.update_or_create(
        node_id=node_id, defaults={"down_since": at or timezone.now()}
    )


def cycle_seconds() -> float:
    """How long a power cycle can take at most: the wait for power Off, and a few Redfish calls
    (read, ForceOff, On) at their timeouts. A cycle still running after that lost its worker."""
    call = settings.BMC_CONNECT_TIMEOUT_SECONDS + settings.BMC_READ_TIMEOUT_SECONDS
    return settings.RECOVERY_POWER_OFF_TIMEOUT_SECONDS + 4 * call


@transaction.atomic
def recovery_policy_set(*, cluster: Cluster, actor: Actor, **values) -> RecoveryPolicy:
    """Set some of the cluster's policy (``auto_power_cycle``, ``grace_seconds``,
    ``max_attempts``, ``boot_timeout_seconds``); the rest keeps its value. Every problem is
    named by its field and nothing changes. Setting what is set already writes nothing."""
    errors = policy_problems(values)
    if errors:
        raise ValidationError(errors)
    Cluster.objects.select_for_update().filter(pk=cluster.pk).first()
    policy = policy_of(cluster)
    before = _described(policy)  # the defaults, for a cluster without a policy yet
    for name, value in values.items():
        setattr(policy, name, value)
    if before == _described(policy):
        return policy
    policy.save()
    audit_record(
        actor=actor,
        verb="bmc.recovery_policy",
        target=cluster,
        before=before,
        after=_described(policy),
    )
    return policy


_POLICY_RANGES = {
    "grace_seconds": (0, GRACE_SECONDS_MAX),
    "max_attempts": (1, MAX_ATTEMPTS_MAX),
    "boot_timeout_seconds": (1, BOOT_TIMEOUT_SECONDS_MAX),
}


def policy_problems(values: dict) -> dict[str, str]:
    """What is wrong with some values of a recovery policy, by field (none: they will do)."""
    errors = {}
    for name, value in values.items():
        if name == "auto_power_cycle":
            if not isinstance(value, bool):
                errors[name] = "must be true or false"
        elif name in _POLICY_RANGES:
            low, high = _POLICY_RANGES[name]
            if not isinstance(value, int) or isinstance(value, bool):
                errors[name] = "must be a whole number"
            elif not low <= value <= high:
                errors[name] = f"must be between {low} and {high}, got {value}"
        else:
            errors[name] = "is not part of a recovery policy"
    return errors


def _described(policy: RecoveryPolicy) -> dict:
    return {
        "auto_power_cycle": policy.auto_power_cycle,
        "grace_seconds": policy.grace_seconds,
        "max_attempts": policy.max_attempts,
        "boot_timeout_seconds": policy.boot_timeout_seconds,
    }


def _locked(node_id: int, state: str) -> NodeRecovery | None:
    return (
        NodeRecovery.objects.select_for_update(of=("self",))
        .select_related("node__cluster")
        .filter(node_id=node_id, state=state)
        .first()
    )


def _move(recovery: NodeRecovery, state: str, **fields) -> None:
    """Move a locked recovery on; a state that rests (idle, stopped) has no deadline."""
    recovery.state = state
    recovery.deadline = None
    for name, value in fields.items():
        setattr(recovery, name, value)
    recovery.save()


def _open_attempt(node_id: int) -> RecoveryAttempt | None:
    return (
        RecoveryAttempt.objects.select_for_update()
        .filter(node_id=node_id, finished_at=None)
        .first()
    )


def _finish(attempt: RecoveryAttempt, outcome: str, message: str, *, now: datetime) -> None:
    attempt.finished_at, attempt.outcome, attempt.message = now, outcome, message
    attempt.save(update_fields=["finished_at", "outcome", "message"])
