"""The metadata endpoint serves a guest what its image may read instead of its NoCloud seed:
the tenant's user-data (EC2 ``/latest/user-data``, GCP ``attributes/user-data``) and SSH key in
GCP's ``ssh-keys`` form, each only to the guest's own address, and from the moment gpucap gives
the guest its address (while it boots)."""

import json

from gpucap.fleet import services as fleet
from gpucap.notices import cache
from gpucap.rentals import services
from gpucap.rentals.models import VirtualMachine
from tests.notices import test_metadata as served
from tests.rentals.vm_helpers import IMAGE, SSH_KEY

State = VirtualMachine.State
A, B, GOOGLE = served.A, served.B, served.GOOGLE
USER_DATA = "#cloud-config\npackages: [htop]\n"

# The endpoint as deployed and its guests at A and B (tests/notices/test_metadata.py).
server, guest_a, guest_b, vm_at = served.server, served.guest_a, served.guest_b, served.vm_at


def with_user_data(vm: VirtualMachine, user_data: str) -> VirtualMachine:
    VirtualMachine.objects.filter(pk=vm.pk).update(user_data=user_data)
    cache.metadata_publish(vm.pk)
    return vm


def gcp(guest, attribute: str, headers=GOOGLE):
    return guest.request("GET", f"/computeMetadata/v1/instance/attributes/{attribute}", headers)


def test_a_guest_reads_its_tenants_user_data_as_ec2_serves_it(guest_a, vm_at):
    with_user_data(vm_at(A), USER_DATA)
    token = guest_a.token()

    answer = guest_a.request("GET", "/latest/user-data", {"X-aws-ec2-metadata-token": token})

    assert (answer.status, answer.data.decode()) == (200, USER_DATA)
    assert guest_a.request("GET", "/latest/user-data").status == 401  # IMDSv2 only


def test_a_vm_without_user_data_answers_404_as_ec2_does(guest_a, vm_at):
    vm_at(A)

    answer = guest_a.request(
        "GET", "/latest/user-data", {"X-aws-ec2-metadata-token": guest_a.token()}
    )

    assert answer.status == 404
    assert gcp(guest_a, "user-data").status == 404


def test_a_guest_reads_its_user_data_and_ssh_keys_as_gcp_serves_them(guest_a, vm_at):
    vm = with_user_data(vm_at(A), USER_DATA)

    user_data = gcp(guest_a, "user-data")
    keys = gcp(guest_a, "ssh-keys")

    assert (user_data.status, user_data.data.decode()) == (200, USER_DATA)
    assert user_data.headers["Metadata-Flavor"] == "Google"
    # GCP's format: <user>:<key>, the user being the image's login user.
    assert (keys.status, keys.data.decode()) == (200, f"ubuntu:{vm.ssh_public_key.strip()}\n")


def test_gcp_attributes_need_the_metadata_flavor_header(guest_a, vm_at):
    with_user_data(vm_at(A), USER_DATA)

    for attribute in ("user-data", "ssh-keys"):
        refused = gcp(guest_a, attribute, headers={})
        assert refused.status == 403, attribute
        assert b"packages" not in refused.data and b"ssh-ed25519" not in refused.data


def test_another_address_never_reads_a_guests_user_data_or_keys(guest_a, guest_b, vm_at):
    with_user_data(vm_at(A), USER_DATA)

    # No VM at B: nothing to read.
    assert gcp(guest_b, "user-data").status == 404
    assert gcp(guest_b, "ssh-keys").status == 404
    # A VM of its own at B reads its own (none), not A's.
    vm_b = vm_at(B)
    VirtualMachine.objects.filter(pk=vm_b.pk).update(ssh_public_key="ssh-ed25519 BBBB other@b")
    cache.metadata_publish(vm_b.pk)
    token_b = guest_b.token()
    assert (
        guest_b.request("GET", "/latest/user-data", {"X-aws-ec2-metadata-token": token_b}).status
        == 404
    )
    assert gcp(guest_b, "user-data").status == 404
    assert gcp(guest_b, "ssh-keys").data.decode() == "ubuntu:ssh-ed25519 BBBB other@b\n"


def test_a_document_published_before_user_data_and_login_users_answers_404_for_them(guest_a, vm_at):
    vm = vm_at(A)
    old = {"vm": vm.instance_id, "ip": A, "key": vm.ssh_public_key, "notice": None}
    cache.metadata_redis().set(cache.metadata_key(A), json.dumps(old))

    assert gcp(guest_a, "ssh-keys").status == 404
    assert gcp(guest_a, "user-data").status == 404


def test_a_guest_on_a_subnet_node_is_known_by_its_address_while_it_boots(
    guest_b, fleet_east, tenant
):
    # 127.0.0.0/29: the gateway is 127.0.0.1 and the first guest 127.0.0.2, where B asks from.
    node = fleet.node_update(
        node=fleet_east["nodes"]["h100-001"], guest_bridge="lo", guest_subnet="127.0.0.0/29"
    )
    vm = services.vm_request(
        tenant=tenant,
        pool=fleet_east["pools"]["h100-spot"],
        name="booting",
        gpu_count=1,
        image=IMAGE,
        ssh_public_key=SSH_KEY,
        user_data=USER_DATA,
    )
    vm = services.vm_place(vm=vm, node=node, gpu_indices=[0])
    token = guest_b.token()

    assert (vm.state, vm.ip_address) == (State.PROVISIONING, B)
    assert guest_b.ec2("instance-id", token).data.decode() == vm.instance_id
    assert guest_b.ec2("local-ipv4", token).data.decode() == B
    user_data = guest_b.request("GET", "/latest/user-data", {"X-aws-ec2-metadata-token": token})
    assert user_data.data.decode() == USER_DATA
