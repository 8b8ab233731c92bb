"""A rented machine's power, switched by its tenant through gpucap (docs/bmc.md, "Whole machines
for tenants"): ``bare_metal_power`` records the request and sends the task; the task
(``bmc.bare_metal_power``) asks the BMC once (``power_send``); reads of the machine's power
(``bmc.bare_metal_power_read``, ``power_read``) follow until it is what was asked for.

The tenant never sees the BMC: what it reads (``message``) names no address, user or password;
the BMC's own error, which does, is kept for operators (``bmc_error``).

Nothing is sent twice: the task claims the action with a conditional update (``queued`` ->
``sending``) before it calls the BMC, so a message delivered twice, or a second worker, finds it
claimed and does nothing; a call that failed is reported, never retried behind the tenant's back
(it asks again). An action left under way by a worker that died is given up once it is older
than ``POWER_STALE_SECONDS``, when the tenant next asks.
"""

import logging
from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from gpucap.audit.services import Actor, audit_record
from gpucap.bmc import redfish
from gpucap.bmc.models import BareMetalPowerAction, BareMetalRental, Provisioning
from gpucap.bmc.power import power_state_read, system_reset
from gpucap.bmc.services import bmc_target
from gpucap.errors import Conflict
from gpucap.tasks import enqueue_on_commit

logger = logging.getLogger(__name__)

Action = BareMetalPowerAction.Action
State = BareMetalPowerAction.State

# The Redfish reset each action asks for, and the power the machine should end in.
RESETS = {Action.ON: "on", Action.OFF: "force_off", Action.RESET: "force_restart"}
EXPECTED = {Action.ON: "on", Action.OFF: "off", Action.RESET: "on"}
# Reads of the power after the BMC accepted an action: this often, for up to this long.
POWER_READ_INTERVAL_SECONDS = 3
POWER_SETTLE_SECONDS = 120
# An action under way this long has lost its worker (a BMC call takes at most the connect and
# read timeouts, a few times over): the next request gives it up.
POWER_STALE_SECONDS = 600

# What a tenant reads when the BMC could not do it: its kind of failure, never its words.
TENANT_WORDS = {
    redfish.CREDENTIALS: "gpucap could not log in to the machine's management controller; "
    "your operator has to fix its credentials",
    redfish.UNREACHABLE: "the machine's management controller did not answer; try again in a "
    "minute",
    redfish.TLS: "the machine's management controller's certificate did not verify; your "
    "operator has to fix it",
    redfish.NOT_REDFISH: "the machine's management controller did not answer as Redfish; your "
    "operator has to check it",
    redfish.REFUSED: "the machine's management controller refused it",
    redfish.INVENTORY: "the machine's management controller does not offer what gpucap needs",
}
# A re-image's steps that switch the power themselves: the tenant's power waits for them.
BOOTING = (Provisioning.State.INSERTING, Provisioning.State.BOOTING)
NO_BMC = "gpucap has no way to reach this machine's management controller; ask your operator"


@transaction.atomic
def bare_metal_power(
    *, rental: BareMetalRental, action: str, actor: Actor = None, now: datetime | None = None
) -> BareMetalPowerAction:
    """Ask for ``action`` (on, off or reset) on a rented machine: recorded, audited, and sent to
    the BMC by a task once this commits. An unknown action is a 400 naming ``action``; an ended
    rental, another action still under way, or a re-image putting its image in and resetting
    the machine, a 409."""
    now = now or timezone.now()
    if action not in Action.values:
        raise ValidationError({"action": f"{str(action)[:40]!r} is not one of: on, off, reset"})
    rental = (
        BareMetalRental.objects.select_for_update(of=("self",))
        .select_related("node")
        .get(pk=rental.pk)
    )
    if rental.ended_at is not None:
        raise Conflict(f"bare-metal rental {rental.pk} has ended", code="rental_ended")
    if Provisioning.objects.filter(node_id=rental.node_id, state__in=BOOTING).exists():
        raise Conflict(
            f"{rental.node.hostname} is being re-imaged: its image is going in and the machine "
            "is reset to boot from it; wait until it has (a minute or so)",
            code="reimage_under_way",
        )
    under_way = rental.power_actions.filter(state__in=BareMetalPowerAction.UNDER_WAY).first()
    if under_way is not None:
        if now - under_way.requested_at < timedelta(seconds=POWER_STALE_SECONDS):
            raise Conflict(
                f"{under_way.get_action_display().lower()} asked at "
                f"{under_way.requested_at:%H:%M:%S} UTC is still under way "
                f"({under_way.state}); wait for it to finish",
                code="power_under_way",
            )
        _finish(
            under_way,
            State.FAILED,
            now=now,
            message="gpucap lost track of it (no word from its worker): the machine may or may "
            "not have acted; look at its power",
        )
    power = BareMetalPowerAction.objects.create(
        rental=rental,
        action=action,
        requested_by=actor if actor is not None and actor.is_authenticated else None,
        requested_at=now,
    )
    audit_record(
        actor=actor,
        verb="bare_metal.power",
        target=rental,
        after={"action": action},
        message=f"{power.get_action_display().lower()} of {rental.node.hostname} asked",
    )
    enqueue_on_commit("bmc.bare_metal_power", power.pk)
    return power


def power_send(*, action_id: int, now: datetime | None = None) -> None:
    """The task's work: claim the action, ask the BMC once, record what it said. The BMC is
    called outside any transaction; each step after it is one conditional update."""
    if not BareMetalPowerAction.objects.filter(pk=action_id, state=State.QUEUED).update(
        state=State.SENDING
    ):
        return  # sent already, or given up: never twice
    power = BareMetalPowerAction.objects.select_related("rental__node").get(pk=action_id)
    rental = power.rental
    if rental.ended_at is not None:
        _finish(power, State.FAILED, message="the rental ended before it was sent")
        return
    try:
        target = bmc_target(rental.node)
        system_reset(target, RESETS[power.action])
    except ValidationError as error:
        _finish(power, State.FAILED, message=NO_BMC, bmc_error="; ".join(error.messages))
        return
    except redfish.BmcError as error:
        logger.warning("bare-metal rental %s: %s failed: %s", rental.pk, power.action, error)
        words = TENANT_WORDS.get(error.kind, TENANT_WORDS[redfish.REFUSED])
        _finish(power, State.FAILED, message=words, bmc_error=error.message)
        return
    now = now or timezone.now()
    BareMetalPowerAction.objects.filter(pk=power.pk, state=State.SENDING).update(
        state=State.SENT,
        sent_at=now,
        message=f"the management controller accepted it at {now:%H:%M:%S} UTC; waiting for "
        f"the machine to be {EXPECTED[power.action]}",
    )
    enqueue_on_commit(
        "bmc.bare_metal_power_read", rental.pk, power.pk, countdown=POWER_READ_INTERVAL_SECONDS
    )


def power_read(
    *, rental_id: int, action_id: int | None = None, now: datetime | None = None
) -> bool:
    """Read a rented machine's power and keep it on the rental; with ``action_id``, finish that
    action once the power is what it asked for, or fail it after ``POWER_SETTLE_SECONDS``.
    Returns whether to read again (the action still waits for the power to follow)."""
    rental = BareMetalRental.objects.select_related("node").filter(pk=rental_id).first()
    if rental is None:
        return False
    state, problem = None, ""
    try:
        state = power_state_read(bmc_target(rental.node))
    except ValidationError as error:
        problem = "; ".join(error.messages)
    except redfish.BmcError as error:
        problem = error.message
        logger.warning("bare-metal rental %s: power read failed: %s", rental.pk, error)
    now = now or timezone.now()
    if state is not None:
        BareMetalRental.objects.filter(pk=rental.pk).update(power_state=state, power_read_at=now)
    if action_id is None:
        return False
    power = BareMetalPowerAction.objects.filter(pk=action_id, state=State.SENT).first()
    if power is None:
        return False
    wanted = EXPECTED[power.action]
    if state == wanted:
        _finish(power, State.DONE, now=now, message=f"the machine is {wanted} ({now:%H:%M:%S} UTC)")
        return False
    if now - power.sent_at >= timedelta(seconds=POWER_SETTLE_SECONDS):
        seen = f"still {state}" if state else "not readable"
        _finish(
            power,
            State.FAILED,
            now=now,
            message=f"the management controller accepted it at {power.sent_at:%H:%M:%S} UTC, but "
            f"the machine's power was {seen} at {now:%H:%M:%S} UTC",
            bmc_error=problem,
        )
        return False
    return True


@transaction.atomic
def _finish(
    power: BareMetalPowerAction,
    state: str,
    *,
    message: str,
    bmc_error: str = "",
    now: datetime | None = None,
) -> None:
    """End an action under way (a conditional update: once) and audit how it ended."""
    now = now or timezone.now()
    ended = BareMetalPowerAction.objects.filter(
        pk=power.pk, state__in=BareMetalPowerAction.UNDER_WAY
    ).update(state=state, message=message, bmc_error=bmc_error, finished_at=now)
    if not ended:
        return
    audit_record(
        actor=None,
        verb=f"bare_metal.power_{state}",
        target=power.rental,
        after={"action": power.action, "state": state},
        message=f"{power.get_action_display().lower()}: {message}",
    )
