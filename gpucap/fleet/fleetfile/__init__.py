"""Fleet as code: one YAML file declares tenants, operators, clusters, nodes, capacity sets,
pools and the image catalogue.

- ``fleet_file_load`` reads and validates a file and reports every problem at once, each naming
  the file, the item and the reason (`schema`, `checks`, `problems`);
- ``fleet_file_apply`` brings the database to what the file says through the fleet services, in
  one transaction: all of it or nothing. It never deletes (but a set's schedule entries, when
  the set lists its ``schedules``), and a second run changes nothing (`diff` compares, `apply`
  applies);
- apps above the fleet add keys to a capacity set's entry (a set's ``schedules``, from
  gpucap.schedules) through `sections`, so the fleet file imports none of them;
- ``fleet_file_export`` writes the database back in the same format (`export`).

The format is described in docs/fleet-file.md; what a file declares is in `spec`.
"""

from gpucap.fleet.fleetfile.apply import fleet_file_apply
from gpucap.fleet.fleetfile.export import fleet_file_export
from gpucap.fleet.fleetfile.schema import fleet_file_load, fleet_file_parse
from gpucap.fleet.fleetfile.spec import (
    FORMAT_VERSION,
    ApplyResult,
    CapacitySetSpec,
    Change,
    ClusterSpec,
    FleetFile,
    FleetFileError,
    GpuSpec,
    ImageSpec,
    MemberSpec,
    NodeSpec,
    OperatorSpec,
    PoolSpec,
    TenantSpec,
)

__all__ = [
    "FORMAT_VERSION",
    "ApplyResult",
    "CapacitySetSpec",
    "Change",
    "ClusterSpec",
    "FleetFile",
    "FleetFileError",
    "GpuSpec",
    "ImageSpec",
    "MemberSpec",
    "NodeSpec",
    "OperatorSpec",
    "PoolSpec",
    "TenantSpec",
    "fleet_file_apply",
    "fleet_file_export",
    "fleet_file_load",
    "fleet_file_parse",
]
