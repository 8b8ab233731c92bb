"""Discoveries that would otherwise wait for ever (docs/bmc.md, "Lost and expired discoveries"),
kept by the beat's ``bmc.discoveries_recover`` every ``BMC_DISCOVERY_RECOVER_SECONDS``:

- A run ``reading`` or ``applying`` whose worker died, or whose message the broker lost, shows
  no progress (a worker marks it when it takes the run and after each BMC it reads). After
  ``BMC_DISCOVERY_STALE_SECONDS`` without any, its task is sent again; a run sent
  ``BMC_DISCOVERY_MAX_ATTEMPTS`` times is failed instead, saying so, its passwords dropped.
  Neither can apply it twice: the apply holds the run's row and commits the changes with the
  state ``applied``, so a late worker finds the run applied (or failed) and does nothing, and
  failing it is a conditional update on ``applying`` that waits for that row and then finds it
  applied.
- A preview not applied within ``BMC_DISCOVERY_PREVIEW_TTL_SECONDS`` expires: state
  ``expired``, its sealed passwords dropped; applying it is a 409 saying so.
"""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from gpucap.bmc.discovery_runs import TASK, previews_expire
from gpucap.bmc.models import DiscoveryRun
from gpucap.tasks import enqueue_on_commit

State = DiscoveryRun.State


@dataclass
class Upkeep:
    """What one round did: the runs sent again, failed as lost, and how many previews expired."""

    sent: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    expired: int = 0


def discoveries_recover(*, now: datetime | None = None) -> Upkeep:
    """Send again the runs that show no progress, fail those sent too often, expire old
    previews. Each change is a conditional update on what was read, so two rounds (or a round
    and a worker) never both act on one run."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=settings.BMC_DISCOVERY_STALE_SECONDS)
    most = settings.BMC_DISCOVERY_MAX_ATTEMPTS
    upkeep = Upkeep()
    lost = DiscoveryRun.objects.filter(state__in=DiscoveryRun.ACTIVE, progress_at__lt=stale)
    for run_id, state, sends, progress_at in lost.values_list(
        "pk", "state", "sends", "progress_at"
    ).order_by("pk"):
        same = DiscoveryRun.objects.filter(pk=run_id, state=state, progress_at=progress_at)
        if sends >= most:
            if same.update(
                state=State.FAILED,
                problems=[_lost(state, sends)],
                passwords_sealed=[],
                finished_at=now,
            ):
                upkeep.failed.append(run_id)
        elif same.update(sends=F("sends") + 1, progress_at=now):
            enqueue_on_commit(TASK, run_id)
            upkeep.sent.append(run_id)
    upkeep.expired = previews_expire(now=now)
    return upkeep


def _lost(state: str, sends: int) -> str:
    doing = "reading the BMCs" if state == State.READING else "applying the preview"
    return (
        f"the discovery showed no progress while {doing}: its worker or its message was lost "
        f"{sends} time{'' if sends == 1 else 's'}; nothing was applied. Discover again"
    )
