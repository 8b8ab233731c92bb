"""A set's reservations in simulated time (issue 19 in issue 21's simulator).

The live set hands the arbiter the reservations in force at ``now`` (a weekly window, read as
a schedule entry's) and flags the VMs that borrow their kept capacity after each plan
(`gpucap.plans.reservation_feed`). The simulation does the same at every step: `InForce` says
which reservations a step's snapshot carries and when that changes, the fleet keeps the
borrowers' flags the plans report (`gpucap.simulation.fleet`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from gpucap.arbiter.model import Reservation
from gpucap.schedules import calendar


@dataclass(frozen=True)
class ReservationSpec:
    """One of the set's reservations and its weekly window (None: always in force)."""

    reservation: Reservation
    window: calendar.Window | None = None


class InForce:
    """Which reservations are in force as the run steps through ``(since, until]``, oldest
    first (the order the live snapshot hands them over, and in which a set too small for all
    of them honours them)."""

    def __init__(self, specs: Iterable[ReservationSpec], since: datetime, until: datetime) -> None:
        self.specs = tuple(specs)
        entries = [
            calendar.Entry(name=spec.reservation.id, window=spec.window, changes=())
            for spec in self.specs
            if spec.window is not None
        ]
        self.boundaries = calendar.boundaries(entries, [], since, until)
        self.now = self._at(since)

    def _at(self, now: datetime) -> tuple[Reservation, ...]:
        return tuple(
            spec.reservation
            for spec in self.specs
            if spec.window is None or spec.window.active_at(now)
        )

    def step(self, now: datetime) -> tuple[list[str], list[str]]:
        """Move to ``now``: the ids of the reservations that came into force and of those that
        went out of it (both empty when no window opened or closed)."""
        crossed = False
        while self.boundaries and self.boundaries[0] <= now:
            self.boundaries.pop(0)
            crossed = True
        if not crossed:
            return [], []
        before = {reservation.id for reservation in self.now}
        self.now = self._at(now)
        after = {reservation.id for reservation in self.now}
        ordered = [spec.reservation.id for spec in self.specs]
        return (
            [rid for rid in ordered if rid in after - before],
            [rid for rid in ordered if rid in before - after],
        )

    def words(self, rid: str) -> str:
        spec = next(spec for spec in self.specs if spec.reservation.id == rid)
        reservation = spec.reservation
        return f"reservation {rid} ({reservation.tenant}, {reservation.gpus} GPUs)"
