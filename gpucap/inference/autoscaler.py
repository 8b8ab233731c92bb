"""Queue-driven replicas (DESIGN.md section 6): every few seconds (beat, ``inference.autoscale``)
each deployment is brought towards as many replicas as its load asks for.

The signal is the router's own count of requests in flight plus those queued (Redis,
`gpucap.inference.cache.load`); the deployment wants ``ceil(signal / target_in_flight)``
replicas, kept within ``min_replicas..max_replicas``. Up is prompt: the missing replicas are
asked for at once, as one demand group. Down is slow: only once fewer replicas would have done
for a whole ``scale_down_cooldown_seconds`` (``scale_down_since`` remembers since when), and not
within a cool-down of the last scaling, so a burst that comes and goes does not make replicas
come and go with it.

The same decision serves both kinds of pool. Outside a capacity set the new replicas are placed
by standalone placement as soon as they are asked for; inside one they are demand for the set's
arbiter, which places the whole group or none (in ``dry_run`` they show in the plan preview,
waiting for Approve) and never preempts a deployment below ``min_replicas``. Scaling down
terminates replicas in both: pending ones first, then the most recently started.

A request to a deployment with no replica ready (at zero replicas) waits in the router's queue,
so it counts as load like any other; the router also wakes the deployment (``deployment_wake``,
task ``inference.wake``, debounced) so its first replica is asked for at once rather than at the
next periodic run. With ``min_replicas`` 0, the last replica goes after a cool-down of no load.

Each deployment is decided under its row lock (the one `services.replicas_scale` takes), in a
transaction of its own, so two runs at once cannot both add replicas for the same queue.
"""

import logging
import math
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from gpucap.inference import cache, services
from gpucap.inference.models import InferenceDeployment

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scaling:
    """What one run did to one deployment."""

    UP = "up"  # replicas asked for
    DOWN = "down"  # replicas released after the cool-down
    COOLING = "cooling"  # fewer would do, but not for long enough yet
    STEADY = "steady"  # as many as the load asks for (or as the range allows)

    deployment: str  # slug
    signal: int  # requests in flight + queued
    desired: int  # replicas the signal asks for, within min..max
    before: int  # live replicas found
    after: int  # live replicas left
    action: str
    vms: tuple[str, ...] = field(default=())  # instance ids asked for or released

    def __str__(self) -> str:
        return (
            f"{self.deployment}: {self.action} {self.before}->{self.after} replicas "
            f"(load {self.signal}, wants {self.desired})"
        )


def deployments_autoscale(*, now: datetime | None = None) -> list[Scaling]:
    """One autoscaler run over every deployment, in id order. Harmless to run at any time,
    twice at once included. ``now`` is the autoscaler's clock (tests move it)."""
    now = now or timezone.now()
    done = []
    for deployment_id, slug in InferenceDeployment.objects.order_by("pk").values_list("pk", "slug"):
        queued, in_flight, _ = cache.load(slug)
        scaling = deployment_autoscale(
            deployment_id=deployment_id, signal=queued + in_flight, now=now
        )
        if scaling is None:
            continue  # deleted since the list was read
        if scaling.action in (Scaling.UP, Scaling.DOWN):
            logger.info("autoscale %s", scaling)
        done.append(scaling)
    return done


def deployment_wake(*, slug: str, now: datetime | None = None) -> Scaling | None:
    """One deployment decided now rather than at the next periodic run: the router asks when
    requests wait at zero replicas (``inference.wake``), so the first replica is asked for at
    once. Returns None if there is no such deployment."""
    deployment_id = InferenceDeployment.objects.filter(slug=slug).values_list("pk", flat=True)
    deployment_id = deployment_id.first()
    if deployment_id is None:
        return None
    queued, in_flight, _ = cache.load(slug)
    scaling = deployment_autoscale(
        deployment_id=deployment_id, signal=queued + in_flight, now=now or timezone.now()
    )
    if scaling is not None and scaling.action in (Scaling.UP, Scaling.DOWN):
        logger.info("autoscale (woken) %s", scaling)
    return scaling


@transaction.atomic
def deployment_autoscale(*, deployment_id: int, signal: int, now: datetime) -> Scaling | None:
    """Decide and act for one deployment under its row lock. Returns None if it is gone."""
    deployment = (
        InferenceDeployment.objects.select_for_update(no_key=True).filter(pk=deployment_id).first()
    )
    if deployment is None:
        return None
    live = services.replicas_live(deployment).count()
    desired = replicas_wanted(deployment, signal)

    def outcome(action: str, changed=()) -> Scaling:
        after = live + len(changed) if action == Scaling.UP else live - len(changed)
        return Scaling(
            deployment=deployment.slug,
            signal=signal,
            desired=desired,
            before=live,
            after=after,
            action=action,
            vms=tuple(vm.instance_id for vm in changed),
        )

    if desired > live:
        changed = _scale(deployment, desired, now, f"load {signal}: {live} -> {desired} replicas")
        return outcome(Scaling.UP, changed)
    if live > deployment.max_replicas_in_force:
        # Above the range (it was narrowed meanwhile): no load makes that right, no wait.
        changed = _scale(
            deployment, desired, now, f"above max_replicas {deployment.max_replicas_in_force}"
        )
        return outcome(Scaling.DOWN, changed)
    if desired == live:
        _remember(deployment, since=None)
        return outcome(Scaling.STEADY)
    # Fewer would do. Wait until that has held for the cool-down, and not right after a scaling.
    if deployment.scale_down_since is None or deployment.scale_down_since > now:
        _remember(deployment, since=now)
        return outcome(Scaling.COOLING)
    cooldown = deployment.scale_down_cooldown_seconds
    quiet_for = (now - deployment.scale_down_since).total_seconds()
    since_scaled = (
        (now - deployment.last_scaled_at).total_seconds()
        if deployment.last_scaled_at is not None
        else math.inf
    )
    if quiet_for < cooldown or since_scaled < cooldown:
        return outcome(Scaling.COOLING)
    changed = _scale(
        deployment,
        desired,
        now,
        f"load {signal} for {int(quiet_for)} s: {live} -> {desired} replicas",
    )
    return outcome(Scaling.DOWN, changed)


def replicas_wanted(deployment: InferenceDeployment, signal: int) -> int:
    """Replicas the load asks for, within the deployment's range in force (its own, or what
    its capacity set's schedule or an override puts in force: gpucap/schedules)."""
    wanted = math.ceil(max(signal, 0) / deployment.target_in_flight)
    return max(deployment.min_replicas_in_force, min(wanted, deployment.max_replicas_in_force))


def _scale(deployment: InferenceDeployment, to: int, now: datetime, reason: str) -> list:
    changed = services.replicas_scale(deployment=deployment, to=to, reason=f"autoscaler: {reason}")
    if changed:
        # The cool-down is measured on the autoscaler's clock (the one ``now`` came from).
        InferenceDeployment.objects.filter(pk=deployment.pk).update(last_scaled_at=now)
    return changed


def _remember(deployment: InferenceDeployment, *, since: datetime | None) -> None:
    if deployment.scale_down_since != since:
        InferenceDeployment.objects.filter(pk=deployment.pk).update(scale_down_since=since)
