"""The VM API, /api/vms/: tenant-scoped reads, requests, terminate, the stop / start / place
commands and their errors in the one error shape. Another tenant's VM id is a 404 for every
method; a refused request changes nothing."""

import pytest
import yaml
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet_services
from gpucap.rentals import services
from gpucap.rentals.models import VirtualMachine
from gpucap.tenancy.models import Membership
from tests.rentals.vm_helpers import (
    IMAGE,
    SSH_KEY,
    request_vm,
    running_vm,
    stopped_vm,
    world,
)

State = VirtualMachine.State


@pytest.fixture
def acme_vm(tenant, pools, nodes) -> VirtualMachine:
    return running_vm(
        tenant, pools["a100-standalone"], nodes["a100-001"], [4, 5], name="mine", ip="10.0.0.5"
    )


@pytest.fixture
def globex_vm(other_tenant, pools, nodes) -> VirtualMachine:
    return running_vm(
        other_tenant, pools["l40s-ondemand"], nodes["l40s-002"], [3], name="secret", ip="10.1.1.1"
    )


def vm_url(vm: VirtualMachine, command: str = "") -> str:
    return f"/api/vms/{vm.pk}/" + (f"{command}/" if command else "")


def body(pool, **overrides) -> dict:
    return {
        "pool": pool.pk,
        "name": "train-01",
        "gpu_count": 1,
        "image": IMAGE,
        "ssh_public_key": SSH_KEY,
        **overrides,
    }


def assert_invalid(response, field: str, reason: str) -> None:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert any(reason in message for message in error["fields"][field]), error
    assert field in error["message"]


# --- reads ------------------------------------------------------------------------------------


def test_anonymous_requests_are_refused_with_401(anonymous_api, acme_vm):
    for response in (
        anonymous_api.get("/api/vms/"),
        anonymous_api.get(vm_url(acme_vm)),
        anonymous_api.post(vm_url(acme_vm, "stop")),
        anonymous_api.delete(vm_url(acme_vm)),
    ):
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "not_authenticated"


def test_a_member_lists_only_their_tenants_vms(member_api, other_member_api, acme_vm, globex_vm):
    listed = member_api.get("/api/vms/").json()
    assert [vm["name"] for vm in listed["results"]] == ["mine"]
    assert other_member_api.get("/api/vms/").json()["results"][0]["name"] == "secret"
    assert other_member_api.get("/api/vms/").json()["count"] == 1


def test_operators_list_every_vm(operator_api, acme_vm, globex_vm):
    listed = operator_api.get("/api/vms/").json()
    assert {vm["name"] for vm in listed["results"]} == {"mine", "secret"}


def test_a_vm_shows_its_tenant_pool_node_gpus_ip_and_times(member_api, acme_vm, pools, nodes):
    vm = member_api.get(vm_url(acme_vm)).json()
    assert vm["instance_id"] == acme_vm.instance_id
    assert (vm["tenant"], vm["pool"], vm["pool_name"], vm["pool_kind"]) == (
        "acme",
        pools["a100-standalone"].pk,
        "a100-standalone",
        "on_demand",
    )
    assert (vm["gpu_model"], vm["gpu_count"], vm["state"], vm["role"]) == (
        "A100-SXM4-80GB",
        2,
        "running",
        "rental",
    )
    assert (vm["node"], vm["node_hostname"], vm["gpus"], vm["ip_address"]) == (
        nodes["a100-001"].pk,
        "a100-001",
        [4, 5],
        "10.0.0.5",
    )
    assert vm["started_at"] and vm["requested_at"] and vm["stopped_at"] is None


def test_a_pending_vm_has_no_node_and_no_gpus(member_api, tenant, pools):
    vm = request_vm(tenant, pools["h100-spot"], name="waiting", gpu_count=8)
    shown = member_api.get(vm_url(vm)).json()
    assert (shown["state"], shown["node"], shown["node_hostname"], shown["gpus"]) == (
        "pending",
        None,
        None,
        [],
    )


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("state=running", {"a-run", "g-run"}),
        ("state=pending", {"a-wait"}),
        ("tenant=globex", {"g-run"}),
        ("tenant=acme&state=running", {"a-run"}),
    ],
)
def test_operator_filters_vms(operator_api, tenant, other_tenant, pools, nodes, query, expected):
    running_vm(
        tenant, pools["a100-standalone"], nodes["a100-001"], [0], name="a-run", ip="10.0.0.1"
    )
    request_vm(tenant, pools["h100-spot"], name="a-wait")
    running_vm(
        other_tenant, pools["l40s-ondemand"], nodes["l40s-001"], [1], name="g-run", ip="10.0.0.2"
    )
    listed = operator_api.get(f"/api/vms/?{query}").json()["results"]
    assert {vm["name"] for vm in listed} == expected


def test_filters_by_pool_and_node_ids(operator_api, acme_vm, globex_vm, pools, nodes):
    by_pool = operator_api.get(f"/api/vms/?pool={pools['l40s-ondemand'].pk}").json()
    assert [vm["name"] for vm in by_pool["results"]] == ["secret"]
    by_node = operator_api.get(f"/api/vms/?node={nodes['a100-001'].pk}").json()
    assert [vm["name"] for vm in by_node["results"]] == ["mine"]


def test_a_member_filtering_by_another_tenant_learns_nothing(member_api, acme_vm, globex_vm):
    response = member_api.get("/api/vms/?tenant=globex")
    assert response.status_code == 200
    assert response.json()["count"] == 0


def test_a_bad_filter_value_is_a_400_naming_the_filter(member_api, acme_vm):
    assert_invalid(member_api.get("/api/vms/?state=sleeping"), "state", "sleeping")
    assert_invalid(member_api.get("/api/vms/?pool=abc"), "pool", "whole number")


def test_list_runs_a_fixed_number_of_queries(
    operator_api, member_api, acme_vm, globex_vm, tenant, pools, nodes, django_assert_num_queries
):
    operator_api.get("/api/vms/")  # the first request caches the user's role
    member_api.get("/api/vms/")  # ... and the member's tenants
    # count, VMs, their GPUs.
    with django_assert_num_queries(3):
        assert operator_api.get("/api/vms/").json()["count"] == 2
    with django_assert_num_queries(3):
        assert member_api.get("/api/vms/").json()["count"] == 1
    for index in (0, 1, 2, 3, 6, 7):  # acme_vm holds 4 and 5
        running_vm(
            tenant,
            pools["a100-standalone"],
            nodes["a100-001"],
            [index],
            name=f"n{index}",
            ip=f"10.0.2.{index}",
        )
    request_vm(tenant, pools["h100-spot"], name="waiting", gpu_count=8)
    # ... and why the pending one waits: its pool's line, the plans that place it.
    with django_assert_num_queries(5):
        assert operator_api.get("/api/vms/").json()["count"] == 9
    with django_assert_num_queries(5):
        assert member_api.get("/api/vms/").json()["count"] == 8


def test_a_token_reads_the_vms_of_its_users_tenants(member, acme_vm, globex_vm):
    token = Token.objects.create(user=member)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    assert [vm["name"] for vm in client.get("/api/vms/").json()["results"]] == ["mine"]


# --- tenant isolation -------------------------------------------------------------------------


def test_another_tenants_vm_is_a_404_for_every_method(member_api, globex_vm):
    before = world()
    for method, url in (
        ("get", vm_url(globex_vm)),
        ("delete", vm_url(globex_vm)),
        ("post", vm_url(globex_vm, "stop")),
        ("post", vm_url(globex_vm, "start")),
    ):
        response = getattr(member_api, method)(url)
        assert response.status_code == 404, (method, url)
        assert response.json()["error"]["code"] == "not_found"
        assert "secret" not in response.content.decode()
    assert world() == before


def test_vms_are_not_edited_in_place(member_api, operator_api, acme_vm, globex_vm):
    before = world()
    for client, vm in ((member_api, globex_vm), (member_api, acme_vm), (operator_api, acme_vm)):
        assert client.patch(vm_url(vm), {"name": "renamed"}, format="json").status_code == 405
        assert client.put(vm_url(vm), {"name": "renamed"}, format="json").status_code == 405
    assert world() == before


def test_members_may_not_place_vms(member_api, tenant, pools, nodes, globex_vm):
    own = request_vm(tenant, pools["a100-standalone"], name="waiting")
    before = world()
    for vm in (own, globex_vm):
        response = member_api.post(
            vm_url(vm, "place"), {"node": nodes["a100-001"].pk, "gpus": [0]}, format="json"
        )
        assert response.status_code == 403
    assert world() == before


# --- requesting a VM --------------------------------------------------------------------------


def test_a_member_requests_a_vm(member_api, member, tenant, pools):
    response = member_api.post(
        "/api/vms/", body(pools["a100-standalone"], gpu_count=8), format="json"
    )
    assert response.status_code == 201, response.content
    shown = response.json()
    assert (shown["tenant"], shown["state"], shown["gpu_count"], shown["gpus"]) == (
        "acme",
        "pending",
        8,
        [],
    )
    vm = VirtualMachine.objects.get(pk=shown["id"])
    assert (vm.tenant, vm.created_by, vm.ssh_public_key) == (tenant, member, SSH_KEY)
    assert AuditEvent.objects.filter(
        verb="vm.request", object_id=str(vm.pk), actor_label="mallory"
    ).exists()


@pytest.mark.parametrize(
    ("pool", "gpu_count", "reason"),
    [
        ("l40s-ondemand", 2, "PCIe sets allocate single cards, so every VM has exactly 1 GPU"),
        ("a100-standalone", 3, "NVSwitch sets allocate whole partitions of 1, 2, 4 or 8 GPUs"),
        ("h100-spot", 5, "5 GPUs is not an NVLink partition size"),
        ("h100-spot", 16, "16 GPUs is not an NVLink partition size"),
    ],
)
def test_a_gpu_count_the_fabric_cannot_give_is_a_400_naming_gpu_count(
    member_api, pools, pool, gpu_count, reason
):
    before = world()
    response = member_api.post("/api/vms/", body(pools[pool], gpu_count=gpu_count), format="json")
    assert_invalid(response, "gpu_count", reason)
    assert world() == before


def test_a_pool_the_tenant_may_not_use_is_a_400_naming_pool(member_api, other_member_api, pools):
    before = world()
    # Another pool of the fleet, and the pool only the other tenant may use.
    assert_invalid(
        member_api.post("/api/vms/", body(pools["h100-ondemand"]), format="json"),
        "pool",
        "that your tenant may use",
    )
    assert_invalid(
        other_member_api.post("/api/vms/", body(pools["a100-standalone"]), format="json"),
        "pool",
        "that your tenant may use",
    )
    assert_invalid(
        member_api.post("/api/vms/", {**body(pools["h100-ondemand"]), "pool": 999999}),
        "pool",
        "no pool 999999 that your tenant may use",
    )
    assert world() == before


def test_an_inference_pool_takes_no_rentals(member_api, tenant, pools):
    pools["h100-inference"].tenants.add(tenant)
    before = world()
    response = member_api.post("/api/vms/", body(pools["h100-inference"]), format="json")
    assert_invalid(response, "pool", "serves inference deployments, not rentals")
    assert world() == before


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("ssh_public_key", "not-a-key", "must be one OpenSSH public key line"),
        ("ssh_public_key", "ssh-ed25519 AAAA\nssh-rsa BBBB", "must be one OpenSSH public key line"),
        ("name", "Has Spaces", "lowercase letters, digits or hyphens"),
        ("name", "x" * 64, "no more than 63 characters"),
        ("gpu_count", "two", "valid integer"),
        ("image", "", "may not be blank"),
    ],
)
def test_malformed_input_is_a_400_naming_the_field(member_api, pools, field, value, reason):
    before = world()
    response = member_api.post(
        "/api/vms/", body(pools["a100-standalone"], **{field: value}), format="json"
    )
    assert_invalid(response, field, reason)
    assert world() == before


def test_a_field_a_request_may_not_set_is_refused_by_name(member_api, pools):
    before = world()
    response = member_api.post(
        "/api/vms/", body(pools["a100-standalone"], state="running"), format="json"
    )
    assert_invalid(response, "state", "a new VM starts pending")
    assert world() == before


def test_a_member_of_several_tenants_names_the_tenant(member_api, member, other_tenant, pools):
    Membership.objects.create(user=member, tenant=other_tenant)
    member_api.force_authenticate(member)  # forget the cached tenants
    before = world()
    response = member_api.post("/api/vms/", body(pools["l40s-ondemand"]), format="json")
    assert_invalid(response, "tenant", "you are a member of several tenants (acme, globex)")
    assert world() == before
    response = member_api.post(
        "/api/vms/", body(pools["l40s-ondemand"], tenant="globex"), format="json"
    )
    assert response.status_code == 201
    assert response.json()["tenant"] == "globex"
    # A pool one of their tenants may use, asked for on behalf of the other: the service says no.
    response = member_api.post(
        "/api/vms/", body(pools["a100-standalone"], tenant="globex", name="x1"), format="json"
    )
    assert_invalid(response, "pool", "tenant globex may not use pool a100-standalone")


def test_a_member_cannot_request_for_a_tenant_they_are_not_in(member_api, pools):
    before = world()
    response = member_api.post(
        "/api/vms/", body(pools["l40s-ondemand"], tenant="globex"), format="json"
    )
    assert_invalid(response, "tenant", "no tenant globex that you may request VMs for")
    assert world() == before


def test_operators_who_are_not_members_request_no_vm_for_a_tenant(operator_api, operator, pools):
    before = world()
    assert_invalid(
        operator_api.post("/api/vms/", body(pools["a100-standalone"]), format="json"),
        "tenant",
        "operators must name the tenant",
    )
    assert world() == before
    # #16: an operator who is not a member looks at a tenant read-only.
    response = operator_api.post(
        "/api/vms/", body(pools["a100-standalone"], tenant="acme"), format="json"
    )
    assert response.status_code == 403
    assert "read-only" in response.json()["error"]["message"]
    assert world() == before


# --- terminate, stop, start -------------------------------------------------------------------


def test_delete_terminates_a_pending_vm_at_once(member_api, tenant, pools):
    vm = request_vm(tenant, pools["a100-standalone"], name="gone")
    response = member_api.delete(vm_url(vm))
    assert response.status_code == 202
    assert response.json()["state"] == "terminated"
    vm.refresh_from_db()
    assert vm.state == State.TERMINATED
    # Again: nothing more happens.
    events = AuditEvent.objects.count()
    assert member_api.delete(vm_url(vm)).status_code == 202
    assert AuditEvent.objects.count() == events


def test_delete_stops_a_running_vm_first(member_api, acme_vm):
    response = member_api.delete(vm_url(acme_vm))
    assert response.status_code == 202
    assert (response.json()["state"], response.json()["stop_reason"]) == ("stopping", "terminate")
    acme_vm.refresh_from_db()
    assert acme_vm.state == State.STOPPING


def test_stop_and_start_a_vm(member_api, acme_vm):
    response = member_api.post(vm_url(acme_vm, "stop"))
    assert response.status_code == 202
    assert (response.json()["state"], response.json()["gpus"]) == ("stopping", [4, 5])
    services.vm_mark_stopped(vm=acme_vm)
    shown = member_api.get(vm_url(acme_vm)).json()
    assert (shown["state"], shown["gpus"]) == ("stopped", [])
    response = member_api.post(vm_url(acme_vm, "start"))
    assert response.status_code == 202
    assert response.json()["state"] == "pending"
    assert AuditEvent.objects.filter(
        object_id=str(acme_vm.pk), verb="vm.pending", actor_label="mallory"
    ).exists()


@pytest.mark.parametrize(
    ("command", "reason"),
    [("stop", "is stopped; it cannot become stopping"), ("start", None)],
)
def test_an_illegal_transition_is_a_409_with_the_reason(
    member_api, tenant, pools, nodes, command, reason
):
    vm = stopped_vm(tenant, pools["a100-standalone"], nodes["a100-001"], [0], name="off")
    if command == "start":
        vm = services.vm_start(vm=vm)
        reason = "is pending; it cannot become pending"
    before = world()
    response = member_api.post(vm_url(vm, command))
    assert response.status_code == 409
    error = response.json()["error"]
    assert (error["code"], error["message"]) == ("illegal_transition", f"{vm.instance_id} {reason}")
    assert world() == before


# --- place (operators) ------------------------------------------------------------------------


def test_operator_places_a_pending_vm(operator_api, tenant, pools, nodes):
    vm = request_vm(tenant, pools["a100-standalone"], name="big", gpu_count=4)
    response = operator_api.post(
        vm_url(vm, "place"), {"node": nodes["a100-001"].pk, "gpus": [4, 5, 6, 7]}, format="json"
    )
    assert response.status_code == 202, response.content
    shown = response.json()
    assert (shown["state"], shown["node_hostname"], shown["gpus"]) == (
        "provisioning",
        "a100-001",
        [4, 5, 6, 7],
    )
    assert AuditEvent.objects.filter(
        object_id=str(vm.pk), verb="vm.provisioning", actor_label="olivia"
    ).exists()


def test_placing_on_gpus_another_vm_holds_is_a_409(operator_api, acme_vm, tenant, pools, nodes):
    vm = request_vm(tenant, pools["a100-standalone"], name="late")
    before = world()
    response = operator_api.post(
        vm_url(vm, "place"), {"node": nodes["a100-001"].pk, "gpus": [5]}, format="json"
    )
    assert response.status_code == 409
    error = response.json()["error"]
    assert (error["code"], error["message"]) == (
        "gpus_taken",
        "GPUs [5] of a100-001 are no longer free",
    )
    assert world() == before


@pytest.mark.parametrize(
    ("payload", "field", "reason"),
    [
        ({"gpus": [0, 1]}, "gpus", "needs 1 GPUs, got 2"),
        ({"node": "l40s-001", "gpus": [0]}, "node", "places only on the standalone nodes"),
        ({"gpus": []}, "gpus", "may not be empty"),
        ({"gpus": [0, 9]}, "gpus[1]", "less than or equal to 7"),
    ],
)
def test_a_malformed_placement_is_a_400_naming_the_field(
    operator_api, tenant, pools, nodes, payload, field, reason
):
    vm = request_vm(tenant, pools["a100-standalone"], name="one")
    before = world()
    payload = {**payload, "node": nodes[payload.get("node", "a100-001")].pk}
    response = operator_api.post(vm_url(vm, "place"), payload, format="json")
    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert any(reason in message for message in fields[field]), fields
    assert world() == before


def test_placing_a_running_vm_again_is_a_409(operator_api, acme_vm, nodes):
    before = world()
    response = operator_api.post(
        vm_url(acme_vm, "place"), {"node": nodes["a100-001"].pk, "gpus": [0, 1]}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["error"]["message"] == (
        f"{acme_vm.instance_id} is running; it cannot become provisioning"
    )
    assert world() == before


# --- the schema -------------------------------------------------------------------------------


def test_the_schema_documents_requests_and_commands(anonymous_api, db):
    schema = yaml.safe_load(anonymous_api.get("/api/schema/").content)

    def json_schema(part: dict) -> dict:
        return part["content"]["application/json"]["schema"]

    def ref(name: str) -> dict:
        return {"$ref": f"#/components/schemas/{name}"}

    create = schema["paths"]["/api/vms/"]["post"]
    assert json_schema(create["requestBody"]) == ref("VmRequestRequest")
    assert json_schema(create["responses"]["201"]) == ref("VirtualMachine")
    assert json_schema(schema["paths"]["/api/vms/{id}/"]["delete"]["responses"]["202"]) == ref(
        "VirtualMachine"
    )
    for command in ("stop", "start"):
        operation = schema["paths"][f"/api/vms/{{id}}/{command}/"]["post"]
        assert "requestBody" not in operation
        assert json_schema(operation["responses"]["202"]) == ref("VirtualMachine")
        assert {"404", "409"} <= set(operation["responses"])
    place = schema["paths"]["/api/vms/{id}/place/"]["post"]
    assert json_schema(place["requestBody"]) == ref("VmPlaceRequest")
    filters = {p["name"] for p in schema["paths"]["/api/vms/"]["get"]["parameters"]}
    assert {"state", "pool", "tenant", "node"} <= filters


def test_placing_on_an_unknown_node_is_a_400_naming_node(operator_api, tenant, pools):
    vm = request_vm(tenant, pools["a100-standalone"], name="one")
    before = world()
    response = operator_api.post(vm_url(vm, "place"), {"node": 999999, "gpus": [0]}, format="json")
    assert response.status_code == 400
    assert "Invalid pk" in " ".join(response.json()["error"]["fields"]["node"])
    assert world() == before


@pytest.mark.parametrize(
    ("gpus", "reason"),
    [
        ([0, 1], "GPUs [0, 1] are not a partition of h100-002's NVLink partition table"),
        ([1, 2], "GPUs [1, 2] are not a partition of h100-002's NVLink partition table"),
    ],
)
def test_manual_placement_follows_the_nodes_own_partition_table(
    operator_api, tenant, fleet_east, gpus, reason
):
    spot = fleet_east["pools"]["h100-spot"]
    fleet_services.pool_set_tenants(pool=spot, tenants=[tenant])
    vm = request_vm(tenant, spot, name="pair", gpu_count=2)
    before = world()
    node = fleet_east["nodes"]["h100-002"]  # its 2-GPU partitions are {0,2} {1,3} {4,6} {5,7}
    response = operator_api.post(
        vm_url(vm, "place"), {"node": node.pk, "gpus": gpus}, format="json"
    )
    assert response.status_code == 400
    assert reason in " ".join(response.json()["error"]["fields"]["gpus"])
    assert world() == before
    ok = operator_api.post(vm_url(vm, "place"), {"node": node.pk, "gpus": [0, 2]}, format="json")
    assert ok.status_code == 202
    assert VirtualMachine.objects.get(pk=vm.pk).state == "provisioning"


def test_manual_placement_refuses_a_node_that_is_not_ready(operator_api, tenant, pools, nodes):
    fleet_services.node_cordon(node=nodes["a100-001"])
    vm = request_vm(tenant, pools["a100-standalone"], name="one")
    response = operator_api.post(
        vm_url(vm, "place"), {"node": nodes["a100-001"].pk, "gpus": [0]}, format="json"
    )
    assert response.status_code == 400
    assert "is cordoned; only ready nodes take new VMs" in response.json()["error"]["message"]


# --- images from the catalogue ------------------------------------------------------------------


def test_a_request_names_an_image_of_the_pools_cluster_or_gets_the_choices(
    member_api, pools, fleet_east
):
    fleet_services.image_create(
        cluster=fleet_east["cluster"], name="retired", base_image="/img/r.qcow2", enabled=False
    )
    for image in ("windows-11", "retired"):
        response = member_api.post(
            "/api/vms/", body(pools["a100-standalone"], image=image), format="json"
        )
        assert response.status_code == 400, response.content
        [message] = response.json()["error"]["fields"]["image"]
        assert "gpucap-model-server, ubuntu-24.04-cuda-12.6" in message
    assert not VirtualMachine.objects.exists()
    response = member_api.post(
        "/api/vms/", body(pools["a100-standalone"], image="ubuntu-24.04-cuda-12.6"), format="json"
    )
    assert response.status_code == 201
    assert response.json()["image"] == "ubuntu-24.04-cuda-12.6"


def test_a_cluster_without_images_says_an_operator_adds_them(member_api, pools, fleet_east):
    for image in fleet_east["images"].values():
        fleet_services.image_delete(image=image)
    response = member_api.post("/api/vms/", body(pools["a100-standalone"]), format="json")
    assert_invalid(response, "image", "an operator adds images to the catalogue of its cluster")


def test_a_vm_logs_in_as_its_images_user(tenant, pools, fleet_east):
    from gpucap.rentals.selectors import image_for, vm_login_user

    vm = request_vm(tenant, pools["a100-standalone"], name="login")
    assert image_for(vm) == fleet_east["images"][IMAGE]
    assert vm_login_user(vm) == "ubuntu"
    fleet_services.image_delete(image=fleet_east["images"][IMAGE])
    assert image_for(vm) is None
    assert vm_login_user(vm) == "root"
