"""Celery tasks that keep notice deadlines: ids in, load, call a service. Each is idempotent.

``notices.deadline_stop`` is scheduled by ``notice_issue`` with ``eta`` = the deadline;
``notices.sweep`` (beat, every ``NOTICES_SWEEP_SECONDS``) stops whatever a lost task or a dead
worker missed, sends the driver's stop again for VMs stopping past their deadline that no task
drives (a worker killed while it held the stop), and follows up drains;
``notices.metadata_resync`` (beat) rebuilds the metadata cache.
"""

from celery import shared_task
from django.db import OperationalError
from django.utils import timezone

from gpucap.celery import app
from gpucap.notices import cache, dedications, drains, services
from gpucap.notices.models import InterruptionNotice


@shared_task(
    name="notices.deadline_stop",
    autoretry_for=(OperationalError,),
    retry_backoff=1,
    retry_backoff_max=30,
    max_retries=None,
)
def deadline_stop(notice_id: int) -> bool:
    """Stop the VM of a notice whose deadline came. Returns whether it stopped it."""
    notice = InterruptionNotice.objects.filter(pk=notice_id).first()
    if notice is None or notice.completed_at is not None:
        return False
    now = timezone.now()
    if notice.deadline > now:
        # Delivered early (clock skew between hosts, a broker that ignored the eta): the guest
        # was promised until the deadline, so wait for the rest of it rather than stop now.
        app.send_task("notices.deadline_stop", args=[notice_id], eta=notice.deadline)
        return False
    return services.notice_deadline_reached(notice=notice, now=now)


@shared_task(name="notices.sweep")
def sweep() -> int:
    """Stop every VM whose notice is overdue, send again the stops a dead worker held, then
    follow up drains, failed cards and dedications. Returns the stops made (not counting the
    ones sent again)."""
    stopped = services.notices_sweep()
    services.notice_stops_resend()
    drains.drains_sweep()
    drains.gpu_failed_sweep()
    dedications.dedications_sweep()
    return len(stopped)


@shared_task(name="notices.metadata_resync")
def metadata_resync() -> int:
    return cache.metadata_resync()
