"""Interruption notices: issue one (the VM moves to ``notified``), keep its deadline, and let a
guest release its GPUs early. Deadlines hold even if a worker dies: each notice schedules a
stop at its deadline, and a periodic sweep stops any VM whose deadline passed, and sends the
driver's stop again for any VM the database says is stopping past its deadline while no task
drives it (the worker that held the stop died). Stopping twice is harmless."""

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.audit.services import Actor, audit_record
from gpucap.errors import Conflict
from gpucap.fleet.models import Pool
from gpucap.killpoints import kill_point_on_commit
from gpucap.notices.cache import metadata_publish_on_commit
from gpucap.notices.models import InterruptionNotice
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from gpucap.rentals.reconcile import vm_driver_lock
from gpucap.tasks import enqueue_on_commit

Reason = InterruptionNotice.Reason
Outcome = InterruptionNotice.Outcome
State = VirtualMachine.State


def notice_seconds_for(vm: VirtualMachine) -> int:
    """The warning a VM gets: its capacity set's notice_seconds, else its pool's."""
    pool = vm.pool
    return pool.capacity_set.notice_seconds if pool.capacity_set_id else pool.notice_seconds


@transaction.atomic
def notice_issue(
    *,
    vm: VirtualMachine,
    reason: str,
    actor: Actor = None,
    message: str = "",
    preempted_for: VirtualMachine | None = None,
    seconds: int | None = None,
    plan=None,
) -> InterruptionNotice:
    """Warn a running VM that it will be stopped at the deadline. Issuing twice is harmless: a
    VM with an open notice keeps it (and its deadline)."""
    locked = (
        VirtualMachine.objects.select_for_update(of=("self",), no_key=True)
        .select_related("pool__capacity_set")
        .get(pk=vm.pk)
    )
    existing = InterruptionNotice.objects.filter(vm=locked, completed_at=None).first()
    if existing is not None:
        return existing
    if reason not in Reason.values:
        raise Conflict(f"unknown notice reason {reason!r}", code="invalid_reason")
    if reason == Reason.ARBITER and locked.pool.kind == Pool.Kind.ON_DEMAND:
        raise Conflict(
            f"{locked.instance_id} is an on-demand VM: the arbiter never interrupts it",
            code="on_demand_protected",
        )
    if locked.state != State.RUNNING:
        raise Conflict(
            f"{locked.instance_id} is {locked.state}; only a running VM can get a notice",
            code="not_running",
        )
    now = timezone.now()
    seconds = notice_seconds_for(locked) if seconds is None else seconds
    notice = InterruptionNotice.objects.create(
        vm=locked,
        reason=reason,
        message=message,
        issued_at=now,
        deadline=now + timedelta(seconds=seconds),
        issued_by=actor if actor is not None and actor.is_authenticated else None,
        plan=plan,
    )
    rentals.vm_transition(
        vm=locked,
        to=State.NOTIFIED,
        actor=actor,
        message=message or f"{reason} notice, stop at {notice.deadline:%H:%M:%S} UTC",
        preempted_for=preempted_for,
    )
    audit_record(
        actor=actor,
        verb=f"notice.{reason}",
        target=locked,
        after={"deadline": notice.deadline.isoformat(), "seconds": seconds},
        message=message,
    )
    _schedule_deadline(notice)
    metadata_publish_on_commit(locked.pk)
    return notice


def _schedule_deadline(notice: InterruptionNotice) -> None:
    enqueue_on_commit("notices.deadline_stop", notice.pk, eta=notice.deadline)


@transaction.atomic
def notice_deadline_reached(*, notice: InterruptionNotice, now=None) -> bool:
    """Stop the VM of an open notice whose deadline has come. Returns whether it acted; a
    second call, an early call or a call for a VM already stopping does nothing."""
    now = now or timezone.now()
    vm_id = InterruptionNotice.objects.filter(pk=notice.pk).values_list("vm_id", flat=True).first()
    if vm_id is None:
        return False
    # The VM's row before its notice's, the order vm_transition locks them in (it completes
    # notices), so a deadline and a stop arriving together cannot deadlock.
    vm = VirtualMachine.objects.select_for_update(no_key=True).get(pk=vm_id)
    locked = InterruptionNotice.objects.select_for_update(no_key=True).get(pk=notice.pk)
    if locked.completed_at is not None or locked.deadline > now:
        return False
    if vm.state != State.NOTIFIED:
        return False
    locked.outcome = Outcome.DEADLINE
    locked.save(update_fields=["outcome"])
    kill_point_on_commit("notices.deadline:stopping")  # before vm_stop is sent
    rentals.vm_stop_for_notice(vm=vm, message=f"{locked.reason} notice deadline reached")
    return True


@transaction.atomic
def notice_acknowledge(*, vm: VirtualMachine) -> InterruptionNotice:
    """The guest says it is done (Azure StartRequests, the native ack): stop it now, so its
    GPUs are freed without waiting for the deadline. Acknowledging twice is harmless."""
    locked = VirtualMachine.objects.select_for_update(no_key=True).get(
        pk=vm.pk
    )  # VM first, then notice
    notice = (
        InterruptionNotice.objects.select_for_update(no_key=True)
        .filter(vm_id=vm.pk, completed_at=None)
        .first()
    )
    if notice is None:
        raise Conflict(f"{vm.instance_id} has no open notice to acknowledge", code="no_notice")
    if notice.acknowledged_at is not None:
        return notice
    notice.acknowledged_at = timezone.now()
    notice.outcome = Outcome.ACKNOWLEDGED
    notice.save(update_fields=["acknowledged_at", "outcome"])
    if locked.state == State.NOTIFIED:
        rentals.vm_stop_for_notice(vm=locked, message="the guest acknowledged its notice")
    return notice


def notices_sweep(*, now=None) -> list[int]:
    """Stop every VM whose notice deadline has passed (the safety net for a lost scheduled
    task or a dead worker). Returns the notices acted on."""
    now = now or timezone.now()
    overdue = InterruptionNotice.objects.filter(
        completed_at=None, deadline__lte=now, vm__state=State.NOTIFIED
    ).values_list("pk", flat=True)
    acted = []
    for notice_id in overdue[: settings.NOTICES_SWEEP_BATCH]:
        if notice_deadline_reached(notice=InterruptionNotice(pk=notice_id), now=now):
            acted.append(notice_id)
    return acted


STOP_RESENT = "notice.stop_resent"


def notice_stops_resend(*, now=None) -> list[int]:
    """Send the driver's stop again for every VM that is stopping past its notice's deadline
    while no task drives it: the worker that held its stop died (before sending ``vm_stop``, or
    in the middle of it), and the reconciler would only notice after its grace period. Returns
    the VMs whose stop was sent again.

    Idempotent: a VM's stop is sent again at most once per half sweep interval, decided under
    its row lock against the audit log (``notice.stop_resent``), so two sweeps running at once
    never both send it; a VM a task is driving right now (``vm_driver_lock`` taken) is left to
    that task. A stop sent twice anyway is harmless: ``vm_stop`` is idempotent."""
    now = now or timezone.now()
    overdue = (
        VirtualMachine.objects.filter(
            state=State.STOPPING, notices__completed_at=None, notices__deadline__lte=now
        )
        .order_by("pk")
        .values_list("pk", flat=True)
        .distinct()
    )
    resent = []
    for vm_id in overdue[: settings.NOTICES_SWEEP_BATCH]:
        with vm_driver_lock(vm_id) as undriven:
            pass  # only asked: the resent task takes the lock itself
        if undriven and _stop_resend(vm_id=vm_id, now=now):
            resent.append(vm_id)
    return resent


@transaction.atomic
def _stop_resend(*, vm_id: int, now) -> bool:
    vm = (
        VirtualMachine.objects.select_for_update(no_key=True)
        .filter(pk=vm_id, state=State.STOPPING)
        .first()
    )
    if vm is None:
        return False  # stopped meanwhile
    recently = now - timedelta(seconds=settings.NOTICES_SWEEP_SECONDS / 2)
    already = AuditEvent.objects.filter(
        verb=STOP_RESENT,
        object_type=vm._meta.model_name,
        object_id=str(vm.pk),
        created_at__gt=recently,
    )
    if already.exists():
        return False
    audit_record(
        actor=None,
        verb=STOP_RESENT,
        target=vm,
        message="notice sweep: stopping past its deadline and no task drives it; "
        "sent the driver's stop again",
    )
    enqueue_on_commit("rentals.vm_stop", vm.pk)
    return True


@transaction.atomic
def notice_guest_shutdown(*, vm: VirtualMachine) -> bool:
    """The hypervisor says a notified VM's guest powered itself off before its deadline (the
    reconciler saw it): the notice completes as ``guest_shutdown`` and the GPUs are freed now,
    not at the deadline. Returns whether it acted; harmless twice."""
    locked = VirtualMachine.objects.select_for_update(no_key=True).get(pk=vm.pk)
    if locked.state != State.NOTIFIED:
        return False
    InterruptionNotice.objects.filter(vm=locked, completed_at=None, outcome="").update(
        outcome=Outcome.GUEST_SHUTDOWN
    )
    stopping = rentals.vm_stop_for_notice(
        vm=locked, message="the guest shut down before its notice deadline"
    )
    # The guest is off already: nothing is left for the driver to stop, so release at once.
    rentals.vm_mark_stopped(vm=stopping)
    return True
