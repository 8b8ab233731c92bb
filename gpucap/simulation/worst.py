"""The worst moments of a run, kept as it goes: the steps with the most notices and those with
the longest queue waits, each with the arbiter's plan then. Only ``count`` of each are held,
so a day on a large set does not keep every snapshot."""

from __future__ import annotations

import heapq
import math
from datetime import datetime

from gpucap.simulation.result import PlanMade, WorstMoment


class WorstMoments:
    def __init__(self, count: int) -> None:
        self.count = count
        # Per kind, a min-heap of (value, -step, moment): the least bad on top, dropped first;
        # among equals the later step goes first, so the earliest is kept.
        self.kept: dict[str, list[tuple[float, int, WorstMoment]]] = {"notices": [], "wait": []}

    def offer(
        self,
        kind: str,
        *,
        step: int,
        at: datetime,
        value: float | None,
        words: str,
        made: PlanMade | None,
    ) -> None:
        key = math.inf if value is None else value
        heap = self.kept[kind]
        if self.count <= 0 or key <= 0:
            return
        if len(heap) >= self.count and (key, -step) <= heap[0][:2]:
            return
        moment = WorstMoment(kind=kind, step=step, at=at, value=value, words=words, made=made)
        heapq.heappush(heap, (key, -step, moment))
        if len(heap) > self.count:
            heapq.heappop(heap)

    def moments(self) -> tuple[WorstMoment, ...]:
        """The most notices first, then the longest waits, worst first, earliest among equals."""
        found = []
        for kind in ("notices", "wait"):
            found += [moment for _, _, moment in sorted(self.kept[kind], reverse=True)]
        return tuple(found)
