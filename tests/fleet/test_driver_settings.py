"""A cluster's driver settings are the driver's on every write (the API, fleet files, the
admin): a missing or unknown setting is refused then, not when a VM first needs the driver. A
driver change is refused (409, naming the VMs) while VMs run on the cluster: `PATCH
{"driver": "libvirt", "driver_settings": {}}` was accepted, and every provision then failed
with "uri is required"."""

import pytest

from gpucap.fleet.admin import ClusterAdminForm
from gpucap.fleet.models import Cluster
from tests.fleet.test_fleetfile import fleet_file, refused  # noqa: F401 (a fixture)
from tests.rentals import conftest as rentals_fixtures
from tests.test_api_errors import assert_error

vm_in = rentals_fixtures.vm_in
URI = "qemu+ssh://root@{node}/system"


def cluster_patch(api, cluster, body):
    return api.patch(f"/api/clusters/{cluster.pk}/", body, format="json")


def unchanged(cluster) -> bool:
    now = Cluster.objects.get(pk=cluster.pk)
    return (now.driver, now.driver_settings) == (cluster.driver, cluster.driver_settings)


def test_a_driver_change_while_vms_run_is_a_409_naming_them(operator_api, fleet_east, vm_in):
    cluster = fleet_east["cluster"]
    running = vm_in("running")
    stopping = vm_in("stopping", gpus=(1,))

    body = {"driver": "libvirt", "driver_settings": {"uri": URI}}
    error = assert_error(cluster_patch(operator_api, cluster, body), 409, "in_use")

    assert f"{running.instance_id} ({running.name}, running)" in error["message"]
    assert f"{stopping.instance_id} ({stopping.name}, stopping)" in error["message"]
    assert "only when none run there" in error["message"]
    assert unchanged(cluster)


def test_the_issues_patch_is_refused_for_its_settings_when_no_vm_runs(operator_api, fleet_east):
    cluster = fleet_east["cluster"]
    body = {"driver": "libvirt", "driver_settings": {}}
    error = assert_error(cluster_patch(operator_api, cluster, body), 400, "invalid")
    assert list(error["fields"]) == ["driver_settings"]
    assert "uri is required" in error["fields"]["driver_settings"][0]
    assert unchanged(cluster)


def test_unknown_settings_are_refused_by_name(operator_api, fleet_east, vm_in):
    cluster = fleet_east["cluster"]
    vm_in("running")  # the settings of the driver it has may change while VMs run
    body = {"driver_settings": {"boot_secs": 1}}
    error = assert_error(cluster_patch(operator_api, cluster, body), 400, "invalid")
    assert "unknown setting 'boot_secs'" in error["fields"]["driver_settings"][0]
    assert unchanged(cluster)
    ok = cluster_patch(operator_api, cluster, {"driver_settings": {"boot_seconds": 1}})
    assert ok.status_code == 200, ok.content
    assert Cluster.objects.get(pk=cluster.pk).driver_settings == {"boot_seconds": 1}


def test_a_cluster_is_created_only_with_its_drivers_settings(operator_api, db):
    bad = {"name": "west", "driver": "libvirt", "driver_settings": {"uri": URI, "firmware": "x"}}
    error = assert_error(operator_api.post("/api/clusters/", bad, format="json"), 400, "invalid")
    assert "firmware: must be one of efi, bios" in error["fields"]["driver_settings"][0]
    assert not Cluster.objects.exists()
    good = {"name": "west", "driver": "libvirt", "driver_settings": {"uri": URI}}
    assert operator_api.post("/api/clusters/", good, format="json").status_code == 201


@pytest.mark.django_db
def test_a_fleet_file_with_wrong_settings_is_refused(fleet_file):  # noqa: F811
    path = fleet_file("clusters:\n  - name: east\n    driver: libvirt\n    driver_settings: {}\n")
    assert "uri is required" in refused(path)
    assert not Cluster.objects.exists()


def test_the_admin_checks_the_settings_and_refuses_a_driver_change_while_vms_run(fleet_east, vm_in):
    cluster = fleet_east["cluster"]
    running = vm_in("running")
    data = {"name": "east", "driver": "libvirt", "driver_settings": f'{{"uri": "{URI}"}}'}
    form = ClusterAdminForm(data=data, instance=cluster)
    assert not form.is_valid()
    assert running.instance_id in str(form.errors["driver"])

    data = {"name": "east", "driver": "simulated", "driver_settings": '{"boot_secs": 1}'}
    form = ClusterAdminForm(data=data, instance=Cluster.objects.get(pk=cluster.pk))
    assert not form.is_valid()
    assert "unknown setting 'boot_secs'" in form.errors["driver_settings"][0]
