"""Comparing the sections apps above the fleet add to a capacity set (its schedule:
`sections`) with the database: part of `FleetDiff`."""

from __future__ import annotations

from gpucap.fleet.fleetfile.sections import (
    FileSection,
    SectionSpec,
    SetSection,
    file_sections,
    set_sections,
)
from gpucap.fleet.models import CapacitySet


class SectionsDiff:
    """Hands each registered `SetSection` a `SectionPlan` of the file's comparison. A part of
    `FleetDiff`, which holds the file, the database's rows and the bookkeeping used here."""

    def _plan_sections(self) -> None:
        for section in set_sections():
            specs = tuple(
                spec
                for set_spec in self.file.capacity_sets
                for spec in set_spec.sections
                if spec.key == section.key
            )
            section.plan(_SectionPlan(self, section, specs))
        for section in file_sections():
            specs = tuple(spec for spec in self.file.sections if spec.key == section.key)
            section.plan(_SectionPlan(self, section, specs))


class _SectionPlan:
    """A `SectionPlan`: what a set's section sees of the comparison."""

    def __init__(
        self,
        diff: SectionsDiff,
        section: SetSection | FileSection,
        specs: tuple[SectionSpec, ...],
    ) -> None:
        self._diff, self._section = diff, section
        self.specs = specs
        self.set_names = frozenset(s.name for s in diff.file.capacity_sets)
        self._gpus = diff.set_gpus_after()
        self._floors = diff.pool_floors_after()

    def capacity_set(self, name: str) -> CapacitySet | None:
        return self._diff.sets.get(name)

    def pool_floors(self, name: str) -> dict[str, int]:
        return {pool: floor for pool, (s, floor) in self._floors.items() if s == name}

    def set_gpus(self, name: str) -> int:
        return self._gpus.get(name, 0)

    def problem(self, where: str, text: str) -> None:
        self._diff._problem(where, text)

    def change(self, verb: str, label: str, details: list[str] | str) -> None:
        self._diff._change(verb, self._section.noun, label, details)

    def step(self, where: str, action: str, **kwargs: object) -> None:
        self._diff._step("sections", where, action, **kwargs)

    def unchanged(self, count: int = 1) -> None:
        self._diff.unchanged += count

    def left_as_is(self, labels: list[str]) -> None:
        self._diff.sections_left_as_is.append((self._section.noun, sorted(labels)))

    def pool_names(self) -> set[str]:
        return set(self._diff.pools) | {pool.name for pool in self._diff.file.pools}

    def tenant_slugs(self) -> set[str]:
        return set(self._diff.tenants) | {tenant.slug for tenant in self._diff.file.tenants}

    def gpu_models(self) -> set[str]:
        f = self._diff.file
        models = {pool.gpu_model for pool in self._diff.pools.values()}
        models |= {node.gpu_model for node in self._diff.nodes.values()}
        models |= {s.gpu_model for s in f.capacity_sets} | {n.gpu_model for n in f.nodes}
        return models | {p.gpu_model for p in f.pools if getattr(p, "gpu_model", None)}
