"""The per-node metadata proxy as shipped (deploy/node/gpucap-metadata.conf), under Debian's
nginx on 169.254.169.254:80 of a guest bridge, in front of the real metadata endpoint: it passes
the guest's own address, whatever the guest claims, and nothing but the metadata paths."""

import json

import pytest

from gpucap.notices import services as notices
from gpucap.rentals import services as rentals
from tests.rentals.conftest import vm_in  # noqa: F401  (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def imds_get(guest, path: str, **headers: str) -> tuple[int, str]:
    status, token = guest.http(
        "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    )
    assert status == 200, token
    return guest.http("GET", path, {"X-aws-ec2-metadata-token": token, **headers})


@pytest.fixture
def two_guests(node, vm_in):  # noqa: F811
    """Two running spot VMs at .50 and .51 of the guest subnet, the second under notice, and a
    namespace standing in for each guest on the bridge."""
    first = rentals.vm_mark_running(vm=vm_in("provisioning", gpus=(0,)), ip_address="10.213.0.50")
    second = rentals.vm_mark_running(vm=vm_in("provisioning", gpus=(1,)), ip_address="10.213.0.51")
    notices.notice_issue(vm=second, reason="reclaim", message="maintenance")
    return {
        "first": (first, node.guest_namespace("10.213.0.50")),
        "second": (second, node.guest_namespace("10.213.0.51")),
    }


def test_the_shipped_configuration_passes_nginx_t(node):
    checked = node.netns("nginx", "-t", "-c", str(node.nginx_conf), check=False)

    assert checked.returncode == 0, checked.stderr
    assert "test is successful" in checked.stderr


def test_a_guest_reads_its_own_address_and_key_through_the_proxy(two_guests):
    vm, guest = two_guests["first"]

    assert imds_get(guest, "/latest/meta-data/local-ipv4") == (200, "10.213.0.50")
    assert imds_get(guest, "/latest/meta-data/public-keys/0/openssh-key") == (
        200,
        vm.ssh_public_key.strip() + "\n",
    )


def test_a_guest_claiming_another_guests_address_still_reads_its_own(two_guests):
    _, guest = two_guests["first"]

    status, _ = imds_get(
        guest, "/latest/meta-data/spot/instance-action", **{"X-Forwarded-For": "10.213.0.51"}
    )
    claimed = imds_get(guest, "/latest/meta-data/local-ipv4", **{"X-Forwarded-For": "10.213.0.51"})

    assert status == 404  # the notice is the second guest's, not this one's
    assert claimed == (200, "10.213.0.50")


def test_the_guest_under_notice_reads_it_through_the_proxy(two_guests):
    vm, guest = two_guests["second"]

    status, body = imds_get(guest, "/latest/meta-data/spot/instance-action")

    assert status == 200
    assert json.loads(body)["action"] == "stop"
    assert json.loads(body)["time"] == vm.notices.get().deadline.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize(
    "path", ["/", "/admin/", "/api/vms/", "/admin/../latest/meta-data/", "/v1/models"]
)
def test_nothing_but_the_metadata_paths_is_exposed(node, path):
    guest = node.guest_namespace("10.213.0.60")

    status, body = guest.http("GET", path)

    assert status == 404
    assert "nginx" in body  # refused by the proxy itself; gpucap never saw it
