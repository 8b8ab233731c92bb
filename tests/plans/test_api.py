"""The plans API: operators list and read plans, approve one (409 with the fresh plan when the set
moved on), switch a set's mode and preview a what-if; tenant members get 403, anonymous users
401, and refused input names its field and changes nothing."""

import pytest

from gpucap.audit.models import AuditEvent
from gpucap.fleet.models import CapacitySet
from gpucap.notices.models import InterruptionNotice
from gpucap.plans import services
from gpucap.plans.models import Plan, PlanAction
from gpucap.rentals.models import VirtualMachine
from tests.rentals.vm_helpers import request_vm, world

Kind = PlanAction.Kind


def tick(capacity_set) -> Plan:
    return services.capacity_set_tick(capacity_set_id=capacity_set.pk).plan


def error(response, status: int) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body["error"]) == {"code", "message", "fields"}
    return body["error"]


@pytest.fixture
def proposal(h100, full_set, on_demand_request) -> Plan:
    """A dry-run plan of the full set: globex's 8-GPU on-demand VM takes h100-002, whose two
    spot VMs (spot-3, spot-4) would get notices."""
    on_demand_request()
    return tick(h100)


# --- reading plans ------------------------------------------------------------------------------


def test_operator_lists_plans_newest_first_with_their_summary(
    operator_api, h100, full_set, on_demand_request, operator
):
    first = tick(h100)
    on_demand_request()
    second = tick(h100)

    response = operator_api.get("/api/plans/")

    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 2
    assert [row["id"] for row in body["results"]] == [second.pk, first.pk]
    row = body["results"][0]
    assert "actions" not in row
    assert row["capacity_set"] == h100.pk and row["capacity_set_name"] == "h100-east"
    assert (row["status"], row["mode"], row["trigger"]) == ("proposed", "dry_run", "periodic")
    assert row["generation"] == second.generation and row["complete"] is True
    assert (row["demands"], row["placements"], row["preemptions"]) == (1, 1, 2)
    assert (row["preempted_gpus"], row["unsatisfied"]) == (8, 0)
    assert row["approved_by"] is None and row["applied_at"] is None
    spot = next(p for p in row["pools"] if p["name"] == "h100-spot")
    assert (spot["kind"], spot["rank"], spot["before_gpus"], spot["after_gpus"]) == (
        "spot",
        3,
        16,
        8,
    )
    # The first plan had nothing to do: it was never proposed, so nothing superseded it.
    assert body["results"][1]["status"] == "nothing"
    assert body["results"][1]["replans"] == 0 and body["results"][1]["replanned_at"] is None


def test_plan_list_filters_by_set_and_status(operator_api, fleet_east, h100, proposal):
    l40s = fleet_east["sets"]["l40s-east"]
    other = tick(l40s)

    def ids(query: str) -> list[int]:
        response = operator_api.get(f"/api/plans/?{query}")
        assert response.status_code == 200, response.json()
        return [row["id"] for row in response.json()["results"]]

    assert ids(f"capacity_set={h100.pk}") == [proposal.pk]
    assert ids("capacity_set_name=l40s-east") == [other.pk]
    assert ids("status=proposed") == [proposal.pk]
    assert ids("status=nothing") == [other.pk], "l40s-east has no demand: nothing to do"
    assert ids("status=applied") == []


@pytest.mark.parametrize(
    ("query", "field"), [("status=approved", "status"), ("capacity_set=h100", "capacity_set")]
)
def test_a_bad_plan_filter_names_the_parameter(operator_api, proposal, query, field):
    fields = error(operator_api.get(f"/api/plans/?{query}"), 400)["fields"]
    assert set(fields) == {field}


def test_plan_list_runs_the_same_queries_for_one_plan_and_for_five(
    operator_api, fleet_east, h100, full_set, on_demand_request, django_assert_num_queries
):
    tick(h100)
    operator_api.get("/api/plans/")  # the first request caches the user's role
    with django_assert_num_queries(2):  # COUNT and the page
        assert operator_api.get("/api/plans/").json()["count"] == 1
    for n in range(3):
        on_demand_request(name=f"train-{n}")
        tick(h100)
    tick(fleet_east["sets"]["l40s-east"])
    with django_assert_num_queries(2):
        assert operator_api.get("/api/plans/").json()["count"] == 5


def test_plan_detail_shows_each_action_as_the_preview_does(
    operator_api, proposal, full_set, django_assert_num_queries
):
    train = VirtualMachine.objects.get(name="train-1")
    operator_api.get(f"/api/plans/{proposal.pk}/")

    with django_assert_num_queries(2):  # the plan, then its actions
        response = operator_api.get(f"/api/plans/{proposal.pk}/")

    assert response.status_code == 200
    plan = response.json()
    assert plan["id"] == proposal.pk and plan["status"] == "proposed"
    assert [a["kind"] for a in plan["actions"]] == ["placement", "preemption", "preemption"]
    placement = plan["actions"][0]
    assert placement["vm"] == train.pk and placement["instance_id"] == train.instance_id
    assert (placement["tenant"], placement["pool_name"]) == ("globex", "h100-ondemand")
    assert placement["node_hostname"] == "h100-002"
    assert placement["gpus"] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert placement["group"] and placement["reason"] and placement["for_vm"] is None
    assert placement["progress"] == "" and placement["progress_message"] == ""
    victims = {a["instance_id"]: a for a in plan["actions"][1:]}
    assert set(victims) == {full_set[2].instance_id, full_set[3].instance_id}
    victim = victims[full_set[3].instance_id]
    assert victim["vm"] == full_set[3].pk and victim["position"] in (0, 1)
    assert (victim["tenant"], victim["pool_name"], victim["node_hostname"]) == (
        "acme",
        "h100-spot",
        "h100-002",
    )
    assert victim["gpus"] == [4, 5, 6, 7]
    assert (victim["for_vm"], victim["for_instance_id"]) == (train.pk, train.instance_id)
    assert victim["running_since"] is not None
    assert "h100-ondemand" in victim["reason"]


def test_plan_detail_shows_an_unsatisfied_demand_and_why(operator_api, h100, full_set, fleet_east):
    # The set is full of spot VMs, and a spot request may not preempt its own pool's VMs.
    spot = fleet_east["pools"]["h100-spot"]
    waiting = request_vm(spot.tenants.first(), spot, name="more-spot", gpu_count=8)
    plan = tick(h100)

    actions = operator_api.get(f"/api/plans/{plan.pk}/").json()["actions"]

    assert [a["kind"] for a in actions] == ["unsatisfied"]
    assert actions[0]["instance_id"] == waiting.instance_id and actions[0]["reason"]
    assert actions[0]["node"] is None and actions[0]["node_hostname"] is None


def test_the_latest_plan_of_a_set(
    operator_api, h100, full_set, on_demand_request, django_assert_num_queries
):
    tick(h100)
    on_demand_request()
    latest = tick(h100)
    operator_api.get(f"/api/capacity-sets/{h100.pk}/plan/")

    with django_assert_num_queries(4):  # the set, its latest plan, then the plan with its actions
        response = operator_api.get(f"/api/capacity-sets/{h100.pk}/plan/")

    assert response.status_code == 200
    assert response.json()["id"] == latest.pk
    assert len(response.json()["actions"]) == 3


def test_a_set_without_a_plan_answers_404_in_the_error_shape(operator_api, h100):
    body = error(operator_api.get(f"/api/capacity-sets/{h100.pk}/plan/"), 404)
    assert body["code"] == "no_plan"
    assert "h100-east has no plan yet" in body["message"]


# --- approve ------------------------------------------------------------------------------------


def test_approve_applies_the_plan_and_notifies_its_victims(
    operator_api, proposal, full_set, operator
):
    response = operator_api.post(f"/api/plans/{proposal.pk}/approve/")

    assert response.status_code == 200, response.json()
    plan = response.json()
    assert plan["id"] == proposal.pk and plan["status"] == "applied"
    assert plan["approved_by"] == operator.username
    assert plan["approved_at"] and plan["applied_at"]
    progress = {a["kind"]: a["progress"] for a in plan["actions"]}
    assert progress == {"placement": "waiting", "preemption": "done"}
    notices = InterruptionNotice.objects.select_related("vm")
    assert sorted(n.vm.name for n in notices) == ["spot-3", "spot-4"]
    assert {(n.reason, n.plan_id) for n in notices} == {("arbiter", proposal.pk)}
    assert set(
        VirtualMachine.objects.filter(name__in=["spot-3", "spot-4"]).values_list("state", flat=True)
    ) == {VirtualMachine.State.NOTIFIED}
    assert AuditEvent.objects.filter(verb="plan.approve", actor=operator).count() == 1


def test_a_stale_approve_answers_409_with_the_fresh_plan_and_what_changed(
    operator_api, h100, proposal, on_demand_request
):
    on_demand_request(name="train-2")  # the set changes after the operator looked
    before = world()

    response = operator_api.post(f"/api/plans/{proposal.pk}/approve/")

    body = response.json()
    assert error(response, 409)["code"] == "stale_plan"
    assert f"plan {proposal.pk}" in body["error"]["message"]
    fresh = body["fresh_plan"]
    assert fresh["id"] != proposal.pk and fresh["status"] == "proposed"
    assert fresh["generation"] > proposal.generation
    assert (fresh["placements"], fresh["preemptions"]) == (2, 4)
    assert len([a for a in fresh["actions"] if a["kind"] == "preemption"]) == 4
    assert fresh["id"] == Plan.objects.get(capacity_set=h100, status="proposed").pk
    assert any(line.startswith("now places") for line in body["changes"]), body["changes"]
    assert not InterruptionNotice.objects.exists()
    after = world()
    assert (after["vms"], after["allocations"]) == (before["vms"], before["allocations"])
    proposal.refresh_from_db()
    assert proposal.status == Plan.Status.SUPERSEDED

    # Approving the fresh plan, knowingly, applies it.
    approved = operator_api.post(f"/api/plans/{fresh['id']}/approve/")
    assert approved.status_code == 200 and approved.json()["status"] == "applied"
    assert InterruptionNotice.objects.count() == 4


def test_approving_twice_answers_409_and_notifies_nobody_twice(operator_api, proposal):
    assert operator_api.post(f"/api/plans/{proposal.pk}/approve/").status_code == 200
    before = world()

    response = operator_api.post(f"/api/plans/{proposal.pk}/approve/")

    body = error(response, 409)
    assert body["code"] == "plan_already_applied"
    assert "fresh_plan" not in response.json()
    assert InterruptionNotice.objects.count() == 2
    assert world() == before


# --- mode ---------------------------------------------------------------------------------------


def test_enabling_enforcement_names_how_many_vms_the_proposal_notifies_and_is_audited(
    operator_api, h100, proposal, operator
):
    response = operator_api.post(
        f"/api/capacity-sets/{h100.pk}/mode/", {"mode": "enforce"}, format="json"
    )

    assert response.status_code == 200, response.json()
    assert response.json() == {
        "id": h100.pk,
        "name": "h100-east",
        "mode": "enforce",
        "plan": proposal.pk,
        "notifies": 2,
    }
    assert CapacitySet.objects.get(pk=h100.pk).mode == "enforce"
    event = AuditEvent.objects.get(verb="capacity_set.mode")
    assert event.actor == operator
    assert (event.before, event.after) == ({"mode": "dry_run"}, {"mode": "enforce"})
    assert not InterruptionNotice.objects.exists(), "the next tick applies, not the switch"

    back = operator_api.post(
        f"/api/capacity-sets/{h100.pk}/mode/", {"mode": "dry_run"}, format="json"
    )
    assert back.status_code == 200
    assert (back.json()["mode"], back.json()["notifies"], back.json()["plan"]) == (
        "dry_run",
        None,
        None,
    )
    assert AuditEvent.objects.filter(verb="capacity_set.mode").count() == 2


def test_enforcement_on_a_set_without_a_proposal_notifies_nobody(operator_api, h100):
    response = operator_api.post(
        f"/api/capacity-sets/{h100.pk}/mode/", {"mode": "enforce"}, format="json"
    )
    assert response.status_code == 200
    assert (response.json()["plan"], response.json()["notifies"]) == (None, 0)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"mode": "yolo"}, "mode"),
        ({}, "mode"),
        ({"mode": None}, "mode"),
        ({"mode": "enforce", "notice_seconds": 5}, "notice_seconds"),
    ],
)
def test_a_bad_mode_names_the_field_and_changes_nothing(operator_api, h100, data, field):
    before = world()

    response = operator_api.post(f"/api/capacity-sets/{h100.pk}/mode/", data, format="json")

    assert field in error(response, 400)["fields"]
    assert CapacitySet.objects.get(pk=h100.pk).mode == "dry_run"
    assert world() == before


def test_the_mode_changes_only_through_the_mode_command(operator_api, h100):
    response = operator_api.patch(
        f"/api/capacity-sets/{h100.pk}/", {"mode": "enforce"}, format="json"
    )
    assert "mode" in error(response, 400)["fields"]
    assert CapacitySet.objects.get(pk=h100.pk).mode == "dry_run"


# --- what-if ------------------------------------------------------------------------------------


def test_what_if_previews_what_would_be_reclaimed_and_stores_nothing(
    operator_api, h100, full_set, fleet_east
):
    ondemand = fleet_east["pools"]["h100-ondemand"]
    before = world()

    response = operator_api.post(
        f"/api/capacity-sets/{h100.pk}/what-if/",
        {"pool": ondemand.pk, "gpus": 8, "block_gpus": 4},
        format="json",
    )

    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["capacity_set"], body["pool"], body["pool_name"]) == (
        h100.pk,
        ondemand.pk,
        "h100-ondemand",
    )
    assert (body["gpus"], body["block_gpus"], body["served"]) == (8, 4, True)
    assert body["reclaimed_gpus"] == 8
    reclaimed = {r["vm"]: r for r in body["reclaimed"]}
    assert set(reclaimed) == {full_set[2].instance_id, full_set[3].instance_id}
    row = reclaimed[full_set[2].instance_id]
    assert set(row) == {"vm", "tenant", "pool", "node", "gpus", "running_since", "reason", "for"}
    assert (row["tenant"], row["pool"], row["node"]) == ("acme", "h100-spot", "h100-002")
    assert row["gpus"] == [0, 1, 2, 3] and row["running_since"] and row["reason"]
    assert row["for"].startswith("what-if-")
    placements = [a for a in body["actions"] if a["kind"] == "placement"]
    assert sorted(a["subject"] for a in placements) == ["what-if-1", "what-if-2"]
    assert all(a["vm"] is None and a["tenant"] is None for a in placements)
    assert {a["pool_name"] for a in placements} == {"h100-ondemand"}
    ondemand_pool = next(p for p in body["pools"] if p["name"] == "h100-ondemand")
    assert (ondemand_pool["before_gpus"], ondemand_pool["after_gpus"]) == (0, 8)
    assert not Plan.objects.exists()
    assert world() == before


def test_what_if_that_cannot_be_served_says_so(operator_api, h100, full_set, fleet_east):
    # Spot is the lowest rank: it can take only free GPUs, and the set has none.
    response = operator_api.post(
        f"/api/capacity-sets/{h100.pk}/what-if/",
        {"pool": fleet_east["pools"]["h100-spot"].pk, "gpus": 4, "block_gpus": 4},
        format="json",
    )
    assert response.status_code == 200
    body = response.json()
    assert (body["served"], body["reclaimed"], body["reclaimed_gpus"]) == (False, [], 0)
    assert [a["kind"] for a in body["actions"]] == ["unsatisfied"]


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"pool": 999999, "gpus": 8, "block_gpus": 4}, "pool"),
        ({"pool": "l40s-ondemand", "gpus": 1, "block_gpus": 1}, "pool"),
        ({"pool": "abc", "gpus": 8, "block_gpus": 4}, "pool"),
        ({"gpus": 8, "block_gpus": 4}, "pool"),
        ({"pool": "h100-ondemand", "gpus": 6, "block_gpus": 4}, "gpus"),
        ({"pool": "h100-ondemand", "gpus": 0, "block_gpus": 1}, "gpus"),
        ({"pool": "h100-ondemand", "gpus": 64, "block_gpus": 8}, "gpus"),
        ({"pool": "h100-ondemand", "gpus": 2.5, "block_gpus": 1}, "gpus"),
        ({"pool": "h100-ondemand", "block_gpus": 4}, "gpus"),
        ({"pool": "h100-ondemand", "gpus": 8, "block_gpus": 3}, "block_gpus"),
        ({"pool": "h100-ondemand", "gpus": 8, "block_gpus": "four"}, "block_gpus"),
        ({"pool": "h100-ondemand", "gpus": 8}, "block_gpus"),
        ({"pool": "h100-ondemand", "gpus": 8, "block_gpus": 4, "store": True}, "store"),
    ],
)
def test_a_bad_what_if_names_the_field_and_changes_nothing(
    operator_api, h100, full_set, fleet_east, data, field
):
    if data.get("pool") in fleet_east["pools"]:
        data = {**data, "pool": fleet_east["pools"][data["pool"]].pk}
    tick(h100)
    plans, before = Plan.objects.count(), world()

    response = operator_api.post(f"/api/capacity-sets/{h100.pk}/what-if/", data, format="json")

    body = error(response, 400)
    assert set(body["fields"]) == {field}
    assert field in body["message"]
    assert Plan.objects.count() == plans
    assert world() == before


# --- who may --------------------------------------------------------------------------------------


def endpoints(plan: Plan, pools: dict) -> list[tuple[str, str, dict | None]]:
    set_id = plan.capacity_set_id
    return [
        ("get", "/api/plans/", None),
        ("get", f"/api/plans/{plan.pk}/", None),
        ("post", f"/api/plans/{plan.pk}/approve/", None),
        ("get", f"/api/capacity-sets/{set_id}/plan/", None),
        ("post", f"/api/capacity-sets/{set_id}/mode/", {"mode": "enforce"}),
        (
            "post",
            f"/api/capacity-sets/{set_id}/what-if/",
            {"pool": pools["h100-ondemand"].pk, "gpus": 8, "block_gpus": 4},
        ),
    ]


def call(client, method: str, url: str, data: dict | None):
    return (
        getattr(client, method)(url, data, format="json") if data else getattr(client, method)(url)
    )


@pytest.mark.parametrize(
    ("client", "status", "code"),
    [
        ("member_api", 403, "permission_denied"),
        ("other_member_api", 403, "permission_denied"),
        ("anonymous_api", 401, "not_authenticated"),
    ],
)
def test_only_operators_may_use_the_plans_api(request, proposal, fleet_east, client, status, code):
    api = request.getfixturevalue(client)
    before = world()

    for method, url, data in endpoints(proposal, fleet_east["pools"]):
        response = call(api, method, url, data)
        assert error(response, status)["code"] == code, (method, url)

    proposal.refresh_from_db()
    assert proposal.status == Plan.Status.PROPOSED
    assert CapacitySet.objects.get(pk=proposal.capacity_set_id).mode == "dry_run"
    assert not InterruptionNotice.objects.exists()
    assert world() == before


@pytest.mark.parametrize(
    ("method", "url", "data", "message"),
    [
        ("get", "/api/plans/999999/", None, "no plan 999999"),
        ("post", "/api/plans/999999/approve/", None, "no plan 999999"),
        ("get", "/api/capacity-sets/999999/plan/", None, "no capacity set 999999"),
        ("post", "/api/capacity-sets/999999/mode/", {"mode": "enforce"}, "no capacity set"),
        (
            "post",
            "/api/capacity-sets/999999/what-if/",
            {"pool": 1, "gpus": 1, "block_gpus": 1},
            "no capacity set",
        ),
        ("get", "/api/plans/abc/", None, "no API endpoint"),
        ("get", "/api/plans/99999999999999999999/", None, "no plan"),
    ],
)
def test_unknown_ids_answer_404_in_the_error_shape(
    operator_api, proposal, method, url, data, message
):
    body = error(call(operator_api, method, url, data), 404)
    assert body["code"] == "not_found"
    assert message in body["message"]
