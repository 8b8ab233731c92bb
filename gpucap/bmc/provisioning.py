"""Provisioning by virtual media (docs/bmc.md): boot a node from an operator's installer or OS
image through its BMC, and say what happened.

``provisioning_start`` checks the node may be booted from another image (cordoned, or down,
with no VM holding a GPU of it, and no run in progress), records the run and sends the first
step. ``provisioning_advance`` is one step of a run, called by the ``bmc.provision_step`` task
(and, for runs waiting on their hypervisor, each ``bmc.provisionings_tick``):

    inserting  the image in the BMC's CD/DVD drive, write-protected
    booting    the next boot once from the CD, then a reset: ForceRestart, or On when off
    waiting    for the node's hypervisor to answer (``hypervisor_check``), until the deadline;
               a tenant's re-image of a machine rented whole (``bare_metal_rental``) waits
               for no hypervisor: its installer has the image until the deadline, then done
    done / failed

The media is ejected at the end either way. Every transition is a conditional update on the
state, and the reset is claimed (``reset_at``) before it is asked for, so a step retried or run
by two workers at once never resets a machine twice. A BMC that cannot be reached is tried again
at the next step until the deadline; one that refuses fails the run at once, in its own words.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import transaction
from django.utils import timezone

from gpucap.audit.services import Actor, audit_record
from gpucap.bmc import bare_metal_power
from gpucap.bmc.hypervisor_watch import hypervisors_answer
from gpucap.bmc.models import BareMetalRental, Provisioning
from gpucap.bmc.power import power_state_read, system_reset
from gpucap.bmc.redfish import BmcError, BmcTarget
from gpucap.bmc.services import bmc_target
from gpucap.bmc.vmedia import (
    boot_once_from_cd,
    virtual_media_eject,
    virtual_media_insert,
    virtual_media_read,
)
from gpucap.errors import Conflict
from gpucap.fleet.models import Node
from gpucap.inputs import text_problem
from gpucap.rentals.models import Allocation
from gpucap.tasks import enqueue_on_commit

State = Provisioning.State
IMAGE_URL_MAX_LENGTH = 2000


def hypervisor_answers(node: Node) -> bool:
    """Whether ``node``'s hypervisor answers now, as its cluster's driver tells
    (``Driver.hypervisor_answers``, asked as the hypervisor watch asks it). A driver that cannot
    be built answers no: the run then waits until its deadline and says the hypervisor did not
    answer."""
    return hypervisors_answer([node]).get(node.pk, False)


# The "is it up" check a waiting run asks at each step. The driver's by default; tests put in
# their own (the rig's guests have no hypervisor of their own to answer).
hypervisor_check: Callable[[Node], bool] = hypervisor_answers


@transaction.atomic
def provisioning_start(
    *, node: Node, image_url: str, actor: Actor, bare_metal_rental: BareMetalRental | None = None
) -> Provisioning:
    """Boot ``node`` from the image at ``image_url`` by virtual media. Refused (409) unless
    the node is cordoned or down with no VM holding a GPU of it and no run in progress, or
    without BMC credentials; an image URL that is no http(s) URL is a 400 naming the field.
    With ``bare_metal_rental``, the run is that rental's tenant's re-image of its machine
    (``gpucap.bmc.bare_metal.bare_metal_reimage``): no hypervisor is waited for."""
    if problem := image_url_problem(image_url):
        raise ValidationError({"image_url": problem})
    node = Node.objects.select_for_update().select_related("cluster").get(pk=node.pk)
    _refusal_check(node)
    now = timezone.now()
    provisioning = Provisioning.objects.create(
        node=node,
        image_url=image_url,
        requested_by=actor if actor is not None and actor.is_authenticated else None,
        started_at=now,
        deadline=now + timedelta(seconds=settings.PROVISION_TIMEOUT_SECONDS),
        bare_metal_rental=bare_metal_rental,
    )
    audit_record(
        actor=actor,
        verb="bmc.provision",
        target=node,
        after={"image_url": image_url, "deadline": provisioning.deadline.isoformat()},
    )
    enqueue_on_commit("bmc.provision_step", provisioning.pk)
    return provisioning


def image_url_problem(image_url: object) -> str | None:
    if not isinstance(image_url, str) or not image_url.strip():
        return "is required"
    if len(image_url) > IMAGE_URL_MAX_LENGTH:
        return f"must be at most {IMAGE_URL_MAX_LENGTH} characters"
    if problem := text_problem(image_url, name=True):
        return problem
    try:
        URLValidator(schemes=["http", "https"])(image_url)
    except ValidationError:
        return "must be an http:// or https:// URL the BMC can fetch the image from"
    return None


def _refusal_check(node: Node) -> None:
    name = f"node {node.hostname}"
    running = Provisioning.objects.filter(node=node, state__in=Provisioning.ACTIVE).first()
    if running is not None:
        raise Conflict(
            f"{name} is being provisioned already, from {running.image_url} "
            f"(started {_clock(running.started_at)}, {running.get_state_display().lower()})"
        )
    if node.state not in (Node.State.CORDONED, Node.State.DOWN):
        raise Conflict(
            f"{name} is {node.state}: provisioning boots it from another image, so only a "
            "cordoned or down node is provisioned; cordon or drain it first"
        )
    holders = (
        Allocation.objects.filter(gpu__node=node, released_at=None)
        .values_list("vm__name", flat=True)
        .distinct()
        .order_by("vm__name")
    )
    if names := list(holders):
        raise Conflict(
            f"{name}: {len(names)} VM{'s' if len(names) != 1 else ''} still hold its GPUs "
            f"({', '.join(names[:5])}{', ...' if len(names) > 5 else ''}); drain the node first"
        )
    try:
        bmc_target(node)
    except ValidationError as error:
        raise Conflict("; ".join(error.messages)) from None


# --- the steps ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """What one step left: the run's state, and whether it waits for another step."""

    state: str
    waiting: bool


def provisioning_advance(provisioning_id: int) -> Step | None:
    """Take the run as far as it goes now: insert, boot and reset in one go, then one look at
    the hypervisor (or the deadline). None for a run that does not exist. The caller holds the
    run's lock (``bmc.tasks``); a step that meets a transition made meanwhile stops there."""
    provisioning = _load(provisioning_id)
    if provisioning is None:
        return None
    while provisioning.in_progress:
        before = provisioning.state
        try:
            target = bmc_target(provisioning.node)
        except ValidationError as error:
            _finish(provisioning, State.FAILED, "; ".join(error.messages), target=None)
        else:
            _STEPS[before](provisioning, target)
        provisioning = _load(provisioning_id)
        if provisioning.state in (before, State.WAITING):
            # The hypervisor is first asked a step after the reset: a machine just reset may
            # not have gone down yet.
            return Step(state=provisioning.state, waiting=provisioning.in_progress)
    return Step(state=provisioning.state, waiting=False)


def _inserting(provisioning: Provisioning, target: BmcTarget) -> None:
    if _past_deadline(provisioning, target):
        return
    try:
        virtual_media_insert(target, provisioning.image_url)
    except BmcError as error:
        _trouble(provisioning, error, target=target, doing="inserting the image")
        return
    _move(provisioning, State.INSERTING, State.BOOTING, inserted_at=timezone.now(), message="")


def _booting(provisioning: Provisioning, target: BmcTarget) -> None:
    if provisioning.reset_at is not None:
        # Claimed by a step that did not live to record it: the reset may have been asked for,
        # so it is never asked again; the deadline tells whether the machine came up.
        _move(provisioning, State.BOOTING, State.WAITING, message="")
        return
    if _past_deadline(provisioning, target):
        return
    try:
        boot_once_from_cd(target)
        power = power_state_read(target)
    except BmcError as error:
        _trouble(provisioning, error, target=target, doing="setting the boot from the CD")
        return
    reset = "on" if power == "off" else "force_restart"
    claimed = Provisioning.objects.filter(
        pk=provisioning.pk, state=State.BOOTING, reset_at=None
    ).update(reset_at=timezone.now(), reset_type=_RESET_NAMES[reset])
    if not claimed:
        return  # another step claimed it
    try:
        system_reset(target, reset)
    except BmcError as error:
        # Never asked again, even when the BMC did not answer: it may have done it.
        provisioning.refresh_from_db()
        if error.transient:
            message = (
                f"the BMC did not confirm the reset, which is not asked again: {error.message}"
            )
        else:
            message = error.message
        _finish(provisioning, State.FAILED, message, target)
        return
    _move(provisioning, State.BOOTING, State.WAITING, message="")
    if provisioning.bare_metal_rental_id is not None:
        # The tenant's page shows its machine's power: read again once the reset took effect.
        for countdown in (5, 15):
            enqueue_on_commit(
                "bmc.bare_metal_power_read", provisioning.bare_metal_rental_id, countdown=countdown
            )


def _waiting(provisioning: Provisioning, target: BmcTarget) -> None:
    if provisioning.bare_metal_rental_id is not None:
        _installing(provisioning, target)
        return
    if hypervisor_check(provisioning.node):
        now = timezone.now()
        Provisioning.objects.filter(pk=provisioning.pk, state=State.WAITING).update(answered_at=now)
        provisioning.answered_at = now
        _finish(
            provisioning,
            State.DONE,
            f"booted from the image: its hypervisor answered at {_clock(now)}",
            target,
        )
        return
    _past_deadline(provisioning, target)


def _installing(provisioning: Provisioning, target: BmcTarget) -> None:
    """A tenant's re-image of a machine rented whole: it runs the tenant's system, no hypervisor
    will answer. The image stays in the drive for its installer until the deadline; then it is
    ejected and the run is done. Each look reads the machine's power for the tenant's page."""
    if timezone.now() < provisioning.deadline:
        bare_metal_power.power_read(rental_id=provisioning.bare_metal_rental_id)
        return
    _finish(
        provisioning,
        State.DONE,
        f"the machine was reset to boot from the image at {_clock(provisioning.reset_at)}; the "
        f"image stayed in its drive for the installer until {_clock(provisioning.deadline)}",
        target,
    )


_STEPS = {State.INSERTING: _inserting, State.BOOTING: _booting, State.WAITING: _waiting}
_RESET_NAMES = {"on": "On", "force_restart": "ForceRestart"}


def _trouble(provisioning: Provisioning, error: BmcError, *, target: BmcTarget, doing: str):
    """A BMC that cannot be reached is tried again at the next step (the message says so
    meanwhile); one that refuses ends the run."""
    if error.transient:
        Provisioning.objects.filter(pk=provisioning.pk, state=provisioning.state).update(
            message=f"retrying {doing}: {error.message}"
        )
        return
    _finish(provisioning, State.FAILED, error.message, target)


def _past_deadline(provisioning: Provisioning, target: BmcTarget) -> bool:
    now = timezone.now()
    if now < provisioning.deadline:
        return False
    _finish(provisioning, State.FAILED, _timeout_story(provisioning, target), target)
    return True


def _timeout_story(provisioning: Provisioning, target: BmcTarget) -> str:
    """What happened, in words, for a run whose deadline passed."""
    by = _clock(provisioning.deadline)
    if provisioning.state == State.INSERTING:
        story = f"the BMC did not take the image by {by}"
    elif provisioning.reset_at is None:
        story = (
            f"the BMC accepted the image at {_clock(provisioning.inserted_at)}, but the "
            f"machine was not reset by {by}"
        )
    else:
        story = (
            f"the BMC accepted the image and the machine was reset at "
            f"{_clock(provisioning.reset_at)}, but its hypervisor has not answered by {by}"
        )
    if provisioning.message.startswith("retrying"):
        story += f" (last: {provisioning.message.removeprefix('retrying ')})"
    try:
        story += f"; power is {power_state_read(target).capitalize() or 'unknown'}"
    except BmcError as error:
        story += f"; its power could not be read ({error.message})"
    return story


def _finish(provisioning: Provisioning, state: str, message: str, target: BmcTarget | None):
    """End the run: the drive emptied (whatever the outcome), then the state, once."""
    message += _eject(provisioning, target)
    now = timezone.now()
    with transaction.atomic():
        ended = Provisioning.objects.filter(pk=provisioning.pk, state=provisioning.state).update(
            state=state, finished_at=now, message=message
        )
        if ended:
            audit_record(
                actor=None,
                verb=f"bmc.provision_{state}",
                target=provisioning.node,
                after={"image_url": provisioning.image_url, "state": state},
                message=message,
            )


def _eject(provisioning: Provisioning, target: BmcTarget | None) -> str:
    """The drive emptied; what the run's message adds about the image."""
    if target is None:
        if provisioning.inserted_at is None:
            return ""
        return "; the image may still be inserted (the BMC could not be asked)"
    try:
        held = virtual_media_read(target)
        if not held.inserted:
            return "" if provisioning.inserted_at is None else "; the image is not inserted"
        virtual_media_eject(target)
    except BmcError as error:
        return f"; the image is still inserted (ejecting it failed: {error.message})"
    return "; the image was still inserted and is ejected now"


def _move(provisioning: Provisioning, old: str, new: str, **changes) -> bool:
    return (
        Provisioning.objects.filter(pk=provisioning.pk, state=old).update(state=new, **changes) == 1
    )


def _load(provisioning_id: int) -> Provisioning | None:
    return Provisioning.objects.select_related("node__cluster").filter(pk=provisioning_id).first()


def _clock(moment: datetime | None) -> str:
    if moment is None:
        return "an unknown time"
    return f"{timezone.localtime(moment):%H:%M} {timezone.get_current_timezone_name()}"


def provisionings_in_progress() -> list[int]:
    """The runs a tick steps on (``bmc.provisionings_tick``)."""
    return list(
        Provisioning.objects.filter(state__in=Provisioning.ACTIVE)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
