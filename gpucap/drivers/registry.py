"""Which driver runs a cluster. Adding a driver (KubeVirt, a cloud API) is one new module with a
class taking the cluster's ``driver_settings``, plus one line in ``DRIVERS`` (and the choice on
``Cluster.Driver``)."""

from collections.abc import Mapping
from typing import Any, Protocol

from django.utils.module_loading import import_string

from gpucap.drivers.base import Driver, DriverError, settings_parse

# Imported on first use, so a process that never meets a libvirt cluster needs no libvirt.
DRIVERS: dict[str, str] = {
    "simulated": "gpucap.drivers.simulated.SimulatedDriver",
    "libvirt": "gpucap.drivers.libvirt.LibvirtDriver",
}

# Each driver's settings, as a dataclass ``settings_parse`` reads: checking a cluster's settings
# builds no driver (and so needs no libvirt).
SETTINGS: dict[str, str] = {
    "simulated": "gpucap.drivers.simulated.SimulatedSettings",
    "libvirt": "gpucap.drivers.libvirt_settings.LibvirtSettings",
}


class DrivenCluster(Protocol):
    """What the registry reads from a cluster (``gpucap.fleet.models.Cluster``)."""

    name: str
    driver: str
    driver_settings: Mapping[str, Any]


def driver_for(cluster: DrivenCluster) -> Driver:
    """The driver for ``cluster``, built from its settings. A cluster whose driver is unknown or
    whose settings are wrong is a ``DriverError`` naming the cluster and the problem."""
    path = DRIVERS.get(cluster.driver)
    if path is None:
        raise DriverError(
            f"cluster {cluster.name}: unknown driver {cluster.driver!r} "
            f"(known: {', '.join(DRIVERS)})"
        )
    try:
        return import_string(path)(cluster.driver_settings or {})
    except DriverError as error:
        raise DriverError(f"cluster {cluster.name}: {error}") from error


def driver_settings_problem(driver: str, driver_settings: Mapping[str, Any]) -> str:
    """What is wrong with these settings for ``driver``, or "" — for every write of a cluster
    (the model's ``clean``, so the services, fleet files and the admin), so a typo or a missing
    setting is refused then rather than when a VM first needs the driver."""
    path = SETTINGS.get(driver)
    if path is None:
        return f"unknown driver {driver!r} (known: {', '.join(DRIVERS)})"
    try:
        settings_parse(import_string(path), driver_settings, driver=driver)
    except DriverError as error:
        return str(error)
    return ""
