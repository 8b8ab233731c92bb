"""A cluster names its driver; the registry builds it from the cluster's settings, and a wrong
driver or setting is an error that names the cluster and the setting."""

import pytest

from gpucap.drivers.base import DriverError
from gpucap.drivers.libvirt import LibvirtDriver
from gpucap.drivers.registry import DRIVERS, driver_for, driver_settings_problem
from gpucap.drivers.simulated import SimulatedDriver
from gpucap.fleet.models import Cluster


def test_a_cluster_gets_the_driver_it_names_with_its_settings():
    simulated = driver_for(Cluster(name="east", driver="simulated", driver_settings={}))
    libvirt = driver_for(
        Cluster(
            name="west",
            driver="libvirt",
            driver_settings={"uri": "qemu+ssh://root@{node}/system", "vcpus_per_gpu": 12},
        )
    )

    assert isinstance(simulated, SimulatedDriver)
    assert simulated.settings.boot_seconds == 3
    assert isinstance(libvirt, LibvirtDriver)
    assert libvirt.settings.vcpus_per_gpu == 12
    assert libvirt.uri_for("gpu-17") == "qemu+ssh://root@gpu-17/system"


def test_every_driver_a_cluster_may_name_is_registered():
    assert set(DRIVERS) == set(Cluster.Driver.values)


def test_an_unknown_driver_names_the_cluster():
    with pytest.raises(DriverError, match="cluster east: unknown driver 'vmware'"):
        driver_for(Cluster(name="east", driver="vmware", driver_settings={}))


def test_wrong_settings_name_the_cluster_and_the_setting():
    cluster = Cluster(name="west", driver="libvirt", driver_settings={"uri": "x", "vcpus": 8})

    with pytest.raises(
        DriverError, match="cluster west: libvirt driver settings: unknown setting 'vcpus'"
    ):
        driver_for(cluster)


def test_settings_can_be_checked_before_they_are_saved():
    assert driver_settings_problem("libvirt", {"uri": "qemu+ssh://root@{node}/system"}) == ""
    assert driver_settings_problem("simulated", {"boot_seconds": 0.5}) == ""
    assert driver_settings_problem("simulated", {"boot_seconds": "fast"}) == (
        "simulated driver settings: boot_seconds: must be a number, got 'fast'"
    )
    assert driver_settings_problem("libvirt", []) == (
        "libvirt driver settings must be a mapping, got list"
    )
