"""The worst moments of a run, kept as it goes: the steps with the most notices and those with
the longest queue waits, each with the arbiter's plan then. Only ``count`` of each are held,
so a day on a large set does not keep every snapshot.

A moment stands for its episode: consecutive bad steps of one kind (a queue that stays long for
twenty minutes) count once, by their worst step, so the list shows different times of the day
rather than one bad stretch minute by minute."""

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
        # Per kind, the episode going on: its last step and its worst moment so far.
        self.episode: dict[str, tuple[int, float, WorstMoment]] = {}

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
        if self.count <= 0 or key <= 0:
            return
        going = self.episode.get(kind)
        if going is not None and going[0] == step - 1:
            if key > going[1]:
                moment = WorstMoment(
                    kind=kind, step=step, at=at, value=value, words=words, made=made
                )
                self.episode[kind] = (step, key, moment)
            else:
                self.episode[kind] = (step, going[1], going[2])
            return
        if going is not None:
            self._keep(kind, going[1], going[2])
        moment = WorstMoment(kind=kind, step=step, at=at, value=value, words=words, made=made)
        self.episode[kind] = (step, key, moment)

    def _keep(self, kind: str, key: float, moment: WorstMoment) -> None:
        heap = self.kept[kind]
        if len(heap) >= self.count and (key, -moment.step) <= heap[0][:2]:
            return
        heapq.heappush(heap, (key, -moment.step, moment))
        if len(heap) > self.count:
            heapq.heappop(heap)

    def moments(self) -> tuple[WorstMoment, ...]:
        """The most notices first, then the longest waits, worst first, earliest among equals."""
        for kind, (_, key, moment) in self.episode.items():
            self._keep(kind, key, moment)
        self.episode = {}
        found = []
        for kind in ("notices", "wait"):
            found += [moment for _, _, moment in sorted(self.kept[kind], reverse=True)]
        return tuple(found)
