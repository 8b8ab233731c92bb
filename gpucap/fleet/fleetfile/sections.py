"""Sections that apps above the fleet add to a fleet file: to a capacity set's entry
(`SetSection`, a set's schedule) or to the top of the file (`FileSection`, the tenants' quotas).

The fleet file lives in gpucap.fleet, below the apps that hang policy on a capacity set (a set's
schedule is gpucap.schedules'). Such an app hands in a `SetSection` from its
``AppConfig.ready()`` (`set_section_add`), and the fleet file reads, checks, compares, applies
and exports that key of each set through it, without importing the app: the same way plans
hands rentals its reader of why a VM waits.

A section's key is optional in a set's entry. Left out (or given no value), what the set holds
of that section is left as it is and listed as ``not in file (left as is)``; given, even as
``[]``, it declares the set's rows of that section whole, and rows the file does not list are
removed. A top-level section works the same way for the whole file: left out, its rows are
left as they are; given, it declares them all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gpucap.fleet.fleetfile.words import locate, shown

if TYPE_CHECKING:
    from gpucap.fleet.models import CapacitySet


@dataclass(frozen=True, eq=False)
class SectionSpec:
    """What a fleet file says in one section (``key``) of one capacity set, as written."""

    key: str
    capacity_set: str  # the set's name ("" for a top-level section)
    path: str  # the set's place in the file: "capacity_sets[0]" ("" for a top-level section)
    value: object = field(repr=False)

    @property
    def set_where(self) -> str:
        """The set's place: "capacity_sets[0] (h100-east)"."""
        return f"{self.path} ({self.capacity_set})" if self.capacity_set else self.path

    def where(self, index: int, label: object = None) -> str:
        """The place of the section's item ``index``: "capacity_sets[0].schedules[1] (night)"."""
        place = f"{self.path}.{self.key}[{index}]" if self.path else f"{self.key}[{index}]"
        return f"{place} ({label})" if isinstance(label, str) and label.strip() else place


def list_problems(
    section: SectionSpec,
    *,
    noun_plural: str,
    label: Callable[[dict], str],
    item_problems: Callable[[dict], dict[str, str]],
    identity: Callable[[dict], tuple],
    twice: tuple[str, str],
) -> list[str]:
    """The problems of a section written as a list of mappings (a top-level ``quotas:`` or
    ``reservations:``): not a list, an item not a mapping, each item's own problems by field
    (``item_problems``), and a second item with the same ``identity``, named on the field
    ``twice[0]`` in the words ``twice[1]`` (``{seen}``: where the first one is)."""
    if not isinstance(section.value, list):
        return [
            f"{section.key}: must be a list of {noun_plural} (lines starting with -), got "
            f"{shown(section.value)}"
        ]
    lines = []
    first: dict[tuple, str] = {}
    for i, item in enumerate(section.value):
        where = section.where(i, label(item) if isinstance(item, dict) else None)
        if not isinstance(item, dict):
            lines.append(f"{where}: must be a mapping of keys to values, got {shown(item)}")
            continue
        problems = item_problems(item)
        if not problems:
            seen = first.setdefault(identity(item), where)
            if seen != where:
                problems[twice[0]] = twice[1].format(seen=seen)
        lines.extend(f"{where}: {name}: {reason}" for name, reason in problems.items())
    return lines


class SectionPlan(Protocol):
    """What a section's `SetSection.plan` sees of a fleet file's comparison with the database,
    and how it reports problems, changes and the service calls that make them."""

    specs: tuple[SectionSpec, ...]  # the sets of the file that give this section
    set_names: frozenset[str]  # every set the file declares

    def capacity_set(self, name: str) -> CapacitySet | None:
        """The set's row, None when the file creates it."""

    def pool_floors(self, name: str) -> dict[str, int]:
        """The set's pools once the file is applied: name -> floor_gpus."""

    def set_gpus(self, name: str) -> int:
        """The set's GPUs once the file is applied."""

    def problem(self, where: str, text: str) -> None: ...

    def change(self, verb: str, label: str, details: list[str] | str) -> None:
        """A line of the result: ``verb`` is create, update or delete."""

    def step(self, where: str, action: str, **kwargs: object) -> None:
        """Call the section's ``actions[action](**kwargs, actor=...)`` when the file applies,
        after everything else in the file (the set, its nodes and pools exist then)."""

    def unchanged(self, count: int = 1) -> None: ...

    def left_as_is(self, labels: list[str]) -> None: ...

    def pool_names(self) -> set[str]:
        """Every pool once the file is applied."""

    def tenant_slugs(self) -> set[str]:
        """Every tenant once the file is applied."""

    def gpu_models(self) -> set[str]:
        """Every GPU model of a pool, node or set once the file is applied."""


class SetSection(Protocol):
    key: str  # the key in a capacity set's entry: "schedules"
    noun: str  # an item of the section, in changes and the summary: "schedule entry"
    plural: str  # "schedule entries"
    # The service calls a section's steps name; each takes ``actor=`` besides its own keywords.
    actions: Mapping[str, Callable[..., object]]

    def check(self, spec: SectionSpec) -> list[str]:
        """The problems of the section as written, without the database, one line each
        ("capacity_sets[0].schedules[1] (night): end: ..."), in the order of the file."""

    def plan(self, plan: SectionPlan) -> None:
        """Compare the file's sections (``plan.specs``) with the database."""

    def export(self, capacity_sets: list[CapacitySet]) -> dict[str, object]:
        """Each set's section in the file's form, by set name; a set with nothing is left out."""


class FileSection(Protocol):
    """A top-level section: ``check``, ``plan`` and ``actions`` as a `SetSection`'s (its
    ``plan.specs`` hold one spec, the file's, whose ``path`` is "")."""

    key: str  # the top-level key: "quotas"
    noun: str
    plural: str
    actions: Mapping[str, Callable[..., object]]

    def check(self, spec: SectionSpec) -> list[str]: ...

    def plan(self, plan: SectionPlan) -> None: ...

    def export_file(self) -> list:
        """The section in the file's form; empty: left out of the export."""


_sections: dict[str, SetSection] = {}
_file_sections: dict[str, FileSection] = {}


def set_section_add(section: SetSection) -> None:
    """Register ``section`` (again: replace the one of its key)."""
    _sections[section.key] = section


def set_sections() -> tuple[SetSection, ...]:
    return tuple(_sections.values())


def file_section_add(section: FileSection) -> None:
    """Register a top-level ``section`` (again: replace the one of its key)."""
    _file_sections[section.key] = section


def file_sections() -> tuple[FileSection, ...]:
    return tuple(_file_sections.values())


def set_section_action(action: str) -> Callable[..., object] | None:
    for section in (*_sections.values(), *_file_sections.values()):
        if action in section.actions:
            return section.actions[action]
    return None


# --- reading a file (gpucap/fleet/fleetfile/schema.py) ------------------------------------------


def sections_apart(raw: object) -> tuple[object, dict[int, list[SectionSpec]]]:
    """``raw`` without the sets' sections, and the sections by the set's index. A section given
    no value is left out, as any key is."""
    keys = [section.key for section in set_sections()]
    items = raw.get("capacity_sets") if isinstance(raw, dict) else None
    if not keys or not isinstance(items, list):
        return raw, {}
    found: dict[int, list[SectionSpec]] = {}
    kept = []
    for i, item in enumerate(items):
        if isinstance(item, dict):
            name = item.get("name")
            for key in keys:
                if key in item and item[key] is not None:
                    found.setdefault(i, []).append(
                        SectionSpec(
                            key=key,
                            capacity_set=name if isinstance(name, str) else "",
                            path=f"capacity_sets[{i}]",
                            value=item[key],
                        )
                    )
            item = {k: v for k, v in item.items() if k not in keys}
        kept.append(item)
    return {**raw, "capacity_sets": kept}, found


def section_problems(raw: object, given: dict[int, list[SectionSpec]], *, document: type) -> list:
    """(sort key, line) of the problems of each section ``given``, as its `SetSection.check`
    words them: after the set's own problems (``document`` is the file's model)."""
    keys = [section.key for section in set_sections()]
    found = []
    for i, specs in given.items():
        position = locate(raw, ("capacity_sets", i), document).position
        for spec in specs:
            section = next(s for s in set_sections() if s.key == spec.key)
            for k, text in enumerate(section.check(spec)):
                found.append(([*position, 1000 + keys.index(spec.key), k], text))
    return found


def file_sections_apart(raw: object) -> tuple[object, list[SectionSpec]]:
    """``raw`` without the top-level sections, and those given a value."""
    if not isinstance(raw, dict):
        return raw, []
    keys = [section.key for section in file_sections()]
    found = [
        SectionSpec(key=key, capacity_set="", path="", value=raw[key])
        for key in keys
        if raw.get(key) is not None
    ]
    return {k: v for k, v in raw.items() if k not in keys}, found


def file_section_problems(given: list[SectionSpec]) -> list:
    """(sort key, line) of the problems of the top-level sections ``given``: after the rest."""
    keys = [section.key for section in file_sections()]
    found = []
    for spec in given:
        section = _file_sections[spec.key]
        for k, text in enumerate(section.check(spec)):
            found.append(([10**9, keys.index(spec.key), k], text))
    return found


def plural_of(noun: str) -> str:
    for section in (*_sections.values(), *_file_sections.values()):
        if noun == section.noun:
            return section.plural
    return f"{noun}s"
