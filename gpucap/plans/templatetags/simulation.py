"""A load simulation's stored results on a page (templates/plans/simulation_result.html and
simulation_comparison.html): ``{% load simulation %}{% simulation_result result as shown %}``."""

from collections.abc import Mapping, Sequence

from django import template

from gpucap.plans.simulation_pages import (
    SimulationCompared,
    SimulationShown,
    simulation_compared,
    simulation_shown,
)

register = template.Library()


@register.simple_tag
def simulation_result(
    result: Mapping, kinds: Mapping[str, str] | None = None, prefix: str = "sim"
) -> SimulationShown:
    """A result dict's figures, charts and worst moments. ``kinds``: pool name -> kind."""
    return simulation_shown(result, kinds=kinds, prefix=prefix or "sim")


@register.simple_tag
def simulation_comparison(
    result: Mapping,
    variant: Mapping,
    differences: Sequence[Mapping] | None = None,
    kinds: Mapping[str, str] | None = None,
) -> SimulationCompared:
    """Two result dicts side by side, with the stored ``differences`` (or the figures that
    differ) and the direction of each."""
    return simulation_compared(
        result, variant, differences=differences or None, kinds=kinds or None
    )
