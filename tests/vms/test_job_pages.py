"""Multi-VM jobs on the pages: the request form asks for a job of N VMs, the tenant's list, the
VM page, the portal and the operators' list show "job train-7, VM 2 of 4", and terminating a
VM of a job asks whether it is that VM or the whole job."""

import pytest
from django.urls import reverse

from gpucap.rentals import jobs
from gpucap.rentals.models import VirtualMachine
from tests.rentals import conftest as rentals_fixtures
from tests.rentals.vm_helpers import IMAGE, SSH_KEY, world
from tests.vms.test_pages import (
    HTMX,
    action_url,
    detail_url,
    field_error,
    request_form,
    tenant_vms_url,
)

pools = rentals_fixtures.pools
nodes = rentals_fixtures.nodes
State = VirtualMachine.State


def job_form(pool, **overrides) -> dict:
    return {**request_form(pool, name="", job="train-7", count=4), **overrides}


@pytest.fixture
def train_7(tenant, pools) -> list[VirtualMachine]:
    return jobs.job_request(
        tenant=tenant,
        pool=pools["a100-standalone"],
        job="train-7",
        count=4,
        gpu_count=2,
        image=IMAGE,
        ssh_public_key=SSH_KEY,
    )


def test_a_member_requests_a_job_of_four_with_the_form(member_client, tenant, pools):
    response = member_client.post(
        tenant_vms_url(), job_form(pools["a100-standalone"]), headers=HTMX
    )

    assert response.status_code == 200, response.content
    vms = VirtualMachine.objects.filter(tenant=tenant, job="train-7").order_by("name")
    assert [vm.name for vm in vms] == ["train-7-0", "train-7-1", "train-7-2", "train-7-3"]
    assert {(vm.state, vm.demand_group) for vm in vms} == {(State.PENDING, "acme/train-7")}
    fragment = response.content.decode()
    assert "Requested job" in fragment and "4 VMs of 1 GPU each" in fragment
    assert response["HX-Trigger"] == "vms-changed"


@pytest.mark.parametrize(
    ("overrides", "field", "reason"),
    [
        ({"job": "Train 7"}, "job", "lowercase letters"),
        ({"count": 0}, "count", "greater than or equal to 1"),
        ({"count": 65}, "count", "less than or equal to 64"),
        ({"name": "solo"}, "name", "leave the name out"),
        ({"job": "", "name": "", "count": ""}, "name", "is required"),
        ({"job": "", "name": "solo"}, "count", "give the job a name"),
    ],
)
def test_a_bad_job_is_refused_next_to_the_field_and_creates_nothing(
    member_client, pools, overrides, field, reason
):
    before = world()
    response = member_client.post(
        tenant_vms_url(), job_form(pools["a100-standalone"], **overrides), headers=HTMX
    )
    assert response.status_code == 400
    assert reason in field_error(response.content.decode(), field)
    assert world() == before


def test_a_job_name_in_use_is_refused_next_to_the_job(member_client, pools, train_7):
    before = world()
    response = member_client.post(
        tenant_vms_url(), job_form(pools["a100-standalone"]), headers=HTMX
    )
    assert response.status_code == 400
    assert "already has a job named &#x27;train-7&#x27;" in field_error(
        response.content.decode(), "job"
    )
    assert world() == before


def test_the_lists_and_the_vm_page_show_the_job_and_the_vms_place_in_it(
    member_client, operator_client, tenant, train_7
):
    second = train_7[1]
    for page in (
        member_client.get(tenant_vms_url()),
        member_client.get(reverse("tenant-detail", kwargs={"slug": tenant.slug})),
        operator_client.get(reverse("rentals:vm-list")),
        member_client.get(detail_url(second)),
    ):
        assert page.status_code == 200
        assert "VM 2 of 4" in page.content.decode()
        assert 'data-job="train-7"' in page.content.decode()


def test_the_tenants_list_filters_one_job(member_client, tenant, pools, train_7):
    jobs.job_request(
        tenant=tenant,
        pool=pools["a100-standalone"],
        job="eval",
        count=2,
        gpu_count=1,
        image=IMAGE,
        ssh_public_key=SSH_KEY,
    )
    page = member_client.get(tenant_vms_url() + "?job=eval").content.decode()
    assert "VMs of job eval" in page
    assert "eval-0" in page and "eval-1" in page and "train-7-0" not in page
    assert 'hx-get="/tenants/acme/vms/?job=eval"' in page


def test_the_operators_list_filters_one_job(operator_client, train_7):
    page = operator_client.get(reverse("rentals:vm-list") + "?job=train-7").content.decode()
    assert all(f"train-7-{n}" in page for n in range(4))
    other = operator_client.get(reverse("rentals:vm-list") + "?job=nope").content.decode()
    assert "train-7-0" not in other


def test_terminating_a_vm_of_a_job_asks_whether_this_vm_or_the_whole_job(member_client, train_7):
    page = member_client.get(detail_url(train_7[1])).content.decode()
    assert "only, one of the 4 VMs of job train-7? The others keep running" in page
    assert "Terminate job train-7: all 4 of its VMs?" in page
    assert 'name="whole_job" value="1"' in page


def test_terminating_one_vm_of_a_job_leaves_the_others(member_client, train_7):
    response = member_client.post(action_url("terminate", train_7[1]), headers=HTMX)
    assert response.status_code == 200
    states = dict(VirtualMachine.objects.filter(job="train-7").values_list("name", "state"))
    assert states == {
        "train-7-0": State.PENDING,
        "train-7-1": State.TERMINATED,
        "train-7-2": State.PENDING,
        "train-7-3": State.PENDING,
    }
    # The rest of the job: three VMs now.
    assert "VM 2 of 3" in member_client.get(detail_url(train_7[2])).content.decode()


def test_terminating_the_whole_job_terminates_every_vm_of_it(member_client, train_7):
    response = member_client.post(
        action_url("terminate", train_7[2]), {"whole_job": "1"}, headers=HTMX
    )
    assert response.status_code == 200
    assert set(VirtualMachine.objects.filter(job="train-7").values_list("state", flat=True)) == {
        State.TERMINATED
    }


def test_another_tenant_cannot_terminate_the_job(other_member_client, train_7):
    before = world()
    response = other_member_client.post(action_url("terminate", train_7[0]), {"whole_job": "1"})
    assert response.status_code == 404
    assert world() == before
