"""Each capacity set's latest snapshot, kept in this process for as long as its generation holds.

The what-if form is asked again and again while an operator types into it; reading a 2,000-node
set from the database for each question cost most of a second. A snapshot read at generation G
is what a fresh read would give for as long as the set stays at G: every change that could alter
a plan bumps the generation (DESIGN.md section 8), and what else a fresh read would differ in
(the snapshot's ``now``, and the running times it lends VMs that have not started yet, all later
than every real start either way) changes no plan. So a question costs one query for the
generation, and the set is read again only after it changed.

Snapshots are shared between the threads of a process and never changed (the arbiter's are
frozen; their database rows are only read). At most ``SETS`` sets are kept, the least recently
asked about going first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from gpucap.fleet.models import CapacitySet
from gpucap.plans.snapshot import SetSnapshot

SETS = 4

_lock = threading.Lock()
_latest: OrderedDict[int, SetSnapshot] = OrderedDict()


def set_snapshot(
    capacity_set: CapacitySet, *, load: Callable[[CapacitySet], SetSnapshot]
) -> SetSnapshot:
    """The set's snapshot at its current generation: the kept one if the set has not changed
    since it was read, else ``load``'s (kept for the next question)."""
    generation = (
        CapacitySet.objects.filter(pk=capacity_set.pk).values_list("generation", flat=True).first()
    )
    with _lock:
        kept = _latest.get(capacity_set.pk)
        if kept is not None and kept.generation == generation:
            _latest.move_to_end(capacity_set.pk)
            return kept
    snap = load(capacity_set)
    with _lock:
        kept = _latest.get(capacity_set.pk)
        if kept is None or kept.generation <= snap.generation:
            _latest[capacity_set.pk] = snap
            _latest.move_to_end(capacity_set.pk)
        while len(_latest) > SETS:
            _latest.popitem(last=False)
    return snap


def forget() -> None:
    """Drop every kept snapshot (tests that rewrite a set's rows behind its generation)."""
    with _lock:
        _latest.clear()
