"""Evaluate before enabling (issue 21): replay a load profile against a capacity set's
priorities and schedules, in simulated time, with the pure arbiter planning each step.

Plain Python like the arbiter: frozen dataclasses in, a result out, no clock, no I/O, no Django.
`profile` reads the load, `engine.simulate` runs it, `result` holds what it found and
`compare` puts two runs side by side, `codec.result_to_dict` stores one as JSON.
"""

from gpucap.simulation.codec import result_to_dict
from gpucap.simulation.engine import SimulationError, simulate
from gpucap.simulation.profile import (
    Curve,
    DeploymentLoad,
    Profile,
    ProfileError,
    VmArrivals,
    curve_from_csv,
    profile_from_dict,
    profile_from_json,
)
from gpucap.simulation.reservations import ReservationSpec
from gpucap.simulation.result import Difference, Figure, SimulationResult, compare
from gpucap.simulation.spec import DeploymentSpec, input_problems

__all__ = [
    "Curve",
    "DeploymentLoad",
    "DeploymentSpec",
    "Difference",
    "Figure",
    "Profile",
    "ProfileError",
    "ReservationSpec",
    "SimulationError",
    "SimulationResult",
    "VmArrivals",
    "compare",
    "curve_from_csv",
    "input_problems",
    "profile_from_dict",
    "profile_from_json",
    "result_to_dict",
    "simulate",
]
