"""Multi-VM jobs through the VM API: POST /api/vms/ with ``job`` and ``count`` asks for that
many VMs of one shape, named after the job and sharing its demand group; a refused job creates
nothing and names the field; another tenant neither sees nor filters it."""

import pytest
import yaml

from gpucap.rentals import jobs, services
from gpucap.rentals.models import VirtualMachine
from tests.rentals.test_api import assert_invalid, body
from tests.rentals.vm_helpers import request_vm, world

State = VirtualMachine.State


def job_body(pool, **overrides) -> dict:
    shape = body(pool, job="train-7", count=4)
    shape.pop("name")
    return {**shape, **overrides}


def test_a_member_requests_a_job_of_four_vms(member_api, tenant, pools):
    response = member_api.post("/api/vms/", job_body(pools["l40s-ondemand"]), format="json")
    assert response.status_code == 201, response.content
    first = response.json()
    assert (first["name"], first["job"], first["state"]) == ("train-7-0", "train-7", "pending")
    vms = VirtualMachine.objects.filter(tenant=tenant, job="train-7").order_by("name")
    assert [vm.name for vm in vms] == ["train-7-0", "train-7-1", "train-7-2", "train-7-3"]
    assert {vm.demand_group for vm in vms} == {"acme/train-7"}
    assert {(vm.gpu_count, vm.pool_id) for vm in vms} == {(1, pools["l40s-ondemand"].pk)}
    listed = member_api.get("/api/vms/?job=train-7").json()
    assert listed["count"] == 4
    assert {vm["job"] for vm in listed["results"]} == {"train-7"}


def test_a_vm_asked_for_on_its_own_has_no_job(member_api, pools):
    response = member_api.post("/api/vms/", body(pools["l40s-ondemand"]), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["job"] == ""
    assert VirtualMachine.objects.get(name="train-01").demand_group == ""


def test_a_job_without_count_is_a_job_of_one(member_api, pools):
    shape = job_body(pools["l40s-ondemand"])
    shape.pop("count")
    assert member_api.post("/api/vms/", shape, format="json").status_code == 201
    assert list(VirtualMachine.objects.values_list("name", "job")) == [("train-7-0", "train-7")]


@pytest.mark.parametrize(
    ("overrides", "field", "reason"),
    [
        ({"job": "Train_7"}, "job", "lowercase letters"),
        ({"job": "-train"}, "job", "lowercase letters"),
        ({"job": "x" * 61}, "job", "no more than 60"),
        ({"job": ""}, "job", "blank"),
        ({"job": 7}, "job", "must be text"),
        ({"job": "train\u202e7"}, "job", "bidirectional"),
        ({"count": 0}, "count", "greater than or equal to 1"),
        ({"count": 65}, "count", "less than or equal to 64"),
        ({"count": "four"}, "count", "valid integer"),
        ({"count": 2.5}, "count", "valid integer"),
        ({"name": "train-01"}, "name", "leave the name out"),
        ({"gpu_count": 3}, "gpu_count", "pool"),
        ({"image": "nope"}, "image", "not an image offered"),
    ],
)
def test_a_bad_job_is_a_400_naming_the_field_and_creates_nothing(
    member_api, pools, overrides, field, reason
):
    before = world()
    response = member_api.post(
        "/api/vms/", job_body(pools["l40s-ondemand"], **overrides), format="json"
    )
    assert_invalid(response, field, reason)
    assert world() == before


def test_a_count_without_a_job_is_a_400_naming_count(member_api, pools):
    response = member_api.post("/api/vms/", body(pools["l40s-ondemand"], count=4), format="json")
    assert_invalid(response, "count", "give the job a name")
    assert not VirtualMachine.objects.exists()


def test_a_request_without_name_or_job_is_a_400_naming_name(member_api, pools):
    shape = body(pools["l40s-ondemand"])
    shape.pop("name")
    assert_invalid(member_api.post("/api/vms/", shape, format="json"), "name", "is required")


def test_a_job_name_in_use_by_live_vms_is_a_400_naming_job(member_api, tenant, pools):
    jobs.job_request(
        tenant=tenant,
        pool=pools["l40s-ondemand"],
        job="train-7",
        count=2,
        gpu_count=1,
        image=body(pools["l40s-ondemand"])["image"],
        ssh_public_key=body(pools["l40s-ondemand"])["ssh_public_key"],
    )
    before = world()
    response = member_api.post("/api/vms/", job_body(pools["l40s-ondemand"]), format="json")
    assert_invalid(response, "job", "already has a job named 'train-7'")
    assert world() == before


def test_a_job_whose_vm_name_is_taken_is_a_400_naming_job(member_api, tenant, pools):
    request_vm(tenant, pools["l40s-ondemand"], name="train-7-2")
    before = world()
    response = member_api.post("/api/vms/", job_body(pools["l40s-ondemand"]), format="json")
    assert_invalid(response, "job", "already has a VM named 'train-7-2'")
    assert world() == before


def test_a_job_name_is_free_again_once_its_vms_are_terminated(member_api, tenant, pools):
    assert member_api.post("/api/vms/", job_body(pools["l40s-ondemand"])).status_code == 201
    for vm in VirtualMachine.objects.filter(job="train-7"):
        services.vm_terminate(vm=vm)
    response = member_api.post("/api/vms/", job_body(pools["l40s-ondemand"]), format="json")
    assert response.status_code == 201, response.content
    assert VirtualMachine.objects.filter(job="train-7").exclude(state=State.TERMINATED).count() == 4


def test_another_tenant_neither_sees_nor_filters_the_job(
    member_api, other_member_api, operator_api, pools
):
    assert member_api.post("/api/vms/", job_body(pools["l40s-ondemand"])).status_code == 201
    first = VirtualMachine.objects.get(name="train-7-0")
    assert other_member_api.get("/api/vms/?job=train-7").json()["count"] == 0
    assert other_member_api.get("/api/vms/").json()["count"] == 0
    assert other_member_api.get(f"/api/vms/{first.pk}/").status_code == 404
    assert operator_api.get("/api/vms/?job=train-7").json()["count"] == 4


def test_two_tenants_may_use_the_same_job_name(member_api, other_member_api, pools):
    assert member_api.post("/api/vms/", job_body(pools["l40s-ondemand"])).status_code == 201
    response = other_member_api.post("/api/vms/", job_body(pools["l40s-ondemand"], count=2))
    assert response.status_code == 201, response.content
    assert other_member_api.get("/api/vms/?job=train-7").json()["count"] == 2
    assert set(VirtualMachine.objects.values_list("demand_group", flat=True)) == {
        "acme/train-7",
        "globex/train-7",
    }


def test_the_schema_documents_the_job(anonymous_api, db):
    schema = yaml.safe_load(anonymous_api.get("/api/schema/").content)
    request = schema["components"]["schemas"]["VmRequestRequest"]["properties"]
    assert {"job", "count"} <= set(request)
    assert (request["count"]["minimum"], request["count"]["maximum"]) == (1, 64)
    assert "job" in schema["components"]["schemas"]["VirtualMachine"]["properties"]
    parameters = schema["paths"]["/api/vms/"]["get"]["parameters"]
    assert "job" in {parameter["name"] for parameter in parameters}


# --- terminating a whole job ------------------------------------------------------------------


def test_terminate_job_terminates_every_vm_of_the_job_and_no_other(member_api, tenant, pools):
    assert member_api.post("/api/vms/", job_body(pools["l40s-ondemand"])).status_code == 201
    other = request_vm(tenant, pools["l40s-ondemand"], name="solo")
    second = VirtualMachine.objects.get(name="train-7-1")

    response = member_api.post(f"/api/vms/{second.pk}/terminate-job/")

    assert response.status_code == 202, response.content
    assert [vm["name"] for vm in response.json()] == [f"train-7-{n}" for n in range(4)]
    assert {vm["state"] for vm in response.json()} == {"terminated"}
    assert VirtualMachine.objects.get(pk=other.pk).state == State.PENDING


def test_terminate_job_on_a_vm_in_no_job_is_a_409(member_api, tenant, pools):
    solo = request_vm(tenant, pools["l40s-ondemand"], name="solo")
    before = world()
    response = member_api.post(f"/api/vms/{solo.pk}/terminate-job/")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "not_in_a_job"
    assert world() == before


def test_another_tenant_cannot_terminate_the_job(member_api, other_member_api, pools):
    assert member_api.post("/api/vms/", job_body(pools["l40s-ondemand"])).status_code == 201
    first = VirtualMachine.objects.get(name="train-7-0")
    before = world()
    assert other_member_api.post(f"/api/vms/{first.pk}/terminate-job/").status_code == 404
    assert world() == before
