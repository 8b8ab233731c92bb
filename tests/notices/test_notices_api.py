"""The notices API: operators drain, reclaim and read every notice; a tenant reads only the
notices of its own VMs (another tenant's is a 404) and can neither drain nor reclaim."""

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from gpucap.fleet import services as fleet
from gpucap.fleet.models import Node
from gpucap.notices import services
from gpucap.notices.models import InterruptionNotice
from gpucap.rentals.models import VirtualMachine
from tests.rentals.vm_helpers import running_vm, world

State = VirtualMachine.State
Reason = InterruptionNotice.Reason


@pytest.fixture
def h100_node(fleet_east, vm_in, sent_tasks):
    """h100-001 with acme's spot VM and acme's on-demand VM on it."""
    return {
        "node": fleet_east["nodes"]["h100-001"],
        "spot": vm_in("running", pool="h100-spot", gpus=(0,)),
        "on_demand": vm_in("running", pool="h100-ondemand", gpus=(1,)),
    }


@pytest.fixture
def globex_notice(fleet_east, other_tenant, sent_tasks):
    vm = running_vm(
        other_tenant,
        fleet_east["pools"]["l40s-ondemand"],
        fleet_east["nodes"]["l40s-001"],
        [0],
        name="globex-job",
        ip="10.200.2.1",
    )
    return services.notice_issue(vm=vm, reason=Reason.RECLAIM)


def test_an_operator_drains_a_node_and_sees_who_holds_it_up(operator_api, h100_node):
    node = h100_node["node"]

    response = operator_api.post(f"/api/nodes/{node.pk}/drain/")

    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["state"] == "draining"
    blockers = {b["instance_id"]: b for b in body["blockers"]}
    on_demand = blockers[h100_node["on_demand"].instance_id]
    assert on_demand["waiting_for"] == "on_demand"
    assert on_demand["tenant"] == "acme"
    assert on_demand["pool_name"] == "h100-ondemand"
    assert on_demand["deadline"] is None
    spot = blockers[h100_node["spot"].instance_id]
    assert spot["waiting_for"] == "notice"
    assert spot["deadline"] is not None
    assert VirtualMachine.objects.get(pk=h100_node["spot"].pk).state == State.NOTIFIED
    again = operator_api.get(f"/api/nodes/{node.pk}/drain-blockers/")
    assert again.status_code == 200
    assert {b["instance_id"] for b in again.json()["blockers"]} == set(blockers)


def test_an_operator_drains_a_capacity_set(operator_api, fleet_east, h100_node):
    capacity_set = fleet_east["sets"]["h100-east"]

    response = operator_api.post(f"/api/capacity-sets/{capacity_set.pk}/drain/")

    assert response.status_code == 200, response.json()
    states = {n["hostname"]: n["state"] for n in response.json()["nodes"]}
    assert states == {"h100-001": "draining", "h100-002": "cordoned"}  # h100-002 was empty


def test_draining_a_down_node_answers_409_and_changes_nothing(operator_api, h100_node, operator):
    node = h100_node["node"]
    fleet.node_set_state(node=node, state=Node.State.DOWN, actor=operator)
    before = world()

    response = operator_api.post(f"/api/nodes/{node.pk}/drain/")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "node_down"
    assert "is down" in response.json()["error"]["message"]
    assert world() == before


def test_draining_a_node_that_does_not_exist_is_404(operator_api, db):
    assert operator_api.post("/api/nodes/999999/drain/").status_code == 404
    assert operator_api.post("/api/capacity-sets/999999/drain/").status_code == 404
    assert operator_api.post("/api/vms/999999/reclaim/").status_code == 404


def test_an_operator_reclaims_a_vm(operator_api, h100_node, operator):
    vm = h100_node["on_demand"]

    response = operator_api.post(
        f"/api/vms/{vm.pk}/reclaim/", {"message": "rack maintenance"}, format="json"
    )

    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["reason"] == "reclaim"
    assert body["message"] == "rack maintenance"
    assert body["issued_by"] == operator.username
    assert body["is_open"] is True
    assert 0 < body["seconds_left"] <= 120
    assert VirtualMachine.objects.get(pk=vm.pk).state == State.NOTIFIED


def test_a_reclaim_with_a_bad_message_names_the_field_and_changes_nothing(operator_api, h100_node):
    before = world()

    response = operator_api.post(
        f"/api/vms/{h100_node['spot'].pk}/reclaim/", {"message": "x" * 501}, format="json"
    )

    assert response.status_code == 400
    assert "message" in response.json()["error"]["fields"]
    assert world() == before


def test_reclaiming_a_stopped_vm_answers_409(operator_api, vm_in):
    vm = vm_in("stopped")

    response = operator_api.post(f"/api/vms/{vm.pk}/reclaim/")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "not_running"


def test_a_tenant_can_neither_drain_nor_reclaim(member_api, fleet_east, h100_node):
    before = world()
    node = h100_node["node"]

    for path in (
        f"/api/nodes/{node.pk}/drain/",
        f"/api/capacity-sets/{fleet_east['sets']['h100-east'].pk}/drain/",
        f"/api/vms/{h100_node['spot'].pk}/reclaim/",
    ):
        assert member_api.post(path).status_code == 403, path
    assert member_api.get(f"/api/nodes/{node.pk}/drain-blockers/").status_code == 403
    assert world() == before
    assert Node.objects.get(pk=node.pk).state == Node.State.READY


def test_anonymous_users_are_refused(anonymous_api, h100_node):
    assert anonymous_api.post(f"/api/nodes/{h100_node['node'].pk}/drain/").status_code == 401
    assert anonymous_api.get("/api/notices/").status_code == 401


def test_operators_list_every_notice_and_tenants_only_their_own(
    operator_api, member_api, other_member_api, h100_node, globex_notice
):
    acme = services.notice_issue(vm=h100_node["spot"], reason=Reason.ARBITER)

    def ids(client) -> set[int]:
        response = client.get("/api/notices/")
        assert response.status_code == 200
        return {row["id"] for row in response.json()["results"]}

    assert ids(operator_api) == {acme.pk, globex_notice.pk}
    assert ids(member_api) == {acme.pk}
    assert ids(other_member_api) == {globex_notice.pk}


def test_another_tenants_notice_is_404(member_api, other_member_api, globex_notice):
    assert member_api.get(f"/api/notices/{globex_notice.pk}/").status_code == 404
    response = other_member_api.get(f"/api/notices/{globex_notice.pk}/")
    assert response.status_code == 200
    assert response.json()["instance_id"] == globex_notice.vm.instance_id


def test_notices_filter_by_open_reason_and_vm(operator_api, h100_node, globex_notice):
    arbiter = services.notice_issue(vm=h100_node["spot"], reason=Reason.ARBITER, seconds=0)
    services.notice_deadline_reached(notice=arbiter)  # the VM stops: still open until it is off
    from gpucap.rentals import services as rentals

    rentals.vm_mark_stopped(vm=h100_node["spot"])

    def ids(query: str) -> set[int]:
        response = operator_api.get(f"/api/notices/?{query}")
        assert response.status_code == 200, response.json()
        return {row["id"] for row in response.json()["results"]}

    assert ids("open=true") == {globex_notice.pk}
    assert ids("open=false") == {arbiter.pk}
    assert ids("reason=arbiter") == {arbiter.pk}
    assert ids(f"vm={globex_notice.vm_id}") == {globex_notice.pk}
    bad = operator_api.get("/api/notices/?reason=whim")
    assert bad.status_code == 400
    assert "reason" in bad.json()["error"]["fields"]


def test_the_notice_list_takes_a_fixed_number_of_queries(
    operator,
    member,
    vm_in,
    django_assert_num_queries,
    sent_tasks,
):
    services.notice_issue(vm=vm_in("running", gpus=(0,)), reason=Reason.ARBITER)
    counts = []

    def list_as_each_user() -> None:
        for user in (operator, member):
            client = APIClient()
            client.force_authenticate(User.objects.get(pk=user.pk))  # as each request loads it
            # who the user is (operator group or tenants), the page count, the rows
            with django_assert_num_queries(3):
                response = client.get("/api/notices/")
            counts.append(response.json()["count"])

    list_as_each_user()
    for gpus in ((1,), (2,), (3,)):
        services.notice_issue(vm=vm_in("running", gpus=gpus), reason=Reason.ARBITER)
    list_as_each_user()
    assert counts == [1, 1, 4, 4]
