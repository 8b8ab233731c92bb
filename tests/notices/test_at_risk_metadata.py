"""At risk, as guests read it (issue #17): while its set's proposed plan would reclaim it, a VM's
guest reads EC2's rebalance recommendation (``{"noticeTime": ...}``, 404 before and after), the
GCP attribute ``gpucap-at-risk`` and the native ``/metadata/v1/at-risk``; its interruption
notice is unchanged (none yet). The endpoint as deployed (tests/notices/test_metadata.py)."""

import json

import pytest
from botocore.utils import IMDSFetcher, _RetriesExceededError

from gpucap.notices import cache
from gpucap.notices.cache import utc_z
from gpucap.plans import services as plans
from gpucap.rentals import services
from gpucap.rentals.models import VirtualMachine
from tests.notices import test_metadata as served
from tests.rentals.vm_helpers import request_vm

State = VirtualMachine.State
A, B, GOOGLE = served.A, served.B, served.GOOGLE
REBALANCE = "events/recommendations/rebalance"

# The endpoint as deployed and its guests at A and B (tests/notices/test_metadata.py).
server, guest_a, guest_b = served.server, served.guest_a, served.guest_b


@pytest.fixture
def reclaim(fleet_east, vm_in, other_tenant):
    """acme's spot VM at A on h100-001 and its on-demand VM at B on h100-002 (never a victim);
    ``reclaim()`` has globex ask for 8 on-demand GPUs, which only A's node can give, and returns
    the set's dry-run plan, which names A's VM as its victim."""
    spot = services.vm_mark_running(vm=vm_in(State.PROVISIONING), ip_address=A)
    steady = vm_in(State.PROVISIONING, pool="h100-ondemand", node="h100-002", gpus=(0, 1, 2, 3))
    steady = services.vm_mark_running(vm=steady, ip_address=B)
    ondemand = fleet_east["pools"]["h100-ondemand"]
    ondemand.tenants.add(other_tenant)
    h100 = fleet_east["sets"]["h100-east"]

    def make():
        train = request_vm(other_tenant, ondemand, name="train-1", gpu_count=8)
        plan = plans.capacity_set_tick(capacity_set_id=h100.pk).plan
        victims = list(plan.actions.filter(kind="preemption").values_list("vm_id", flat=True))
        assert victims == [spot.pk], "the plan reclaims A's spot VM"
        return plan, train

    make.spot, make.steady, make.capacity_set = spot, steady, h100
    return make


def test_botocore_reads_the_rebalance_recommendation_of_an_at_risk_vm(server, reclaim):
    fetcher = IMDSFetcher(base_url=server, config={"ec2_metadata_v1_disabled": True})
    token = fetcher._fetch_metadata_token()
    path = f"latest/meta-data/{REBALANCE}"
    # Before any plan names it, there is no recommendation: 404, which botocore's default
    # retry gives up on, as for an absent instance-action.
    with pytest.raises(_RetriesExceededError):
        fetcher._get_request(path, None, token)

    plan, _ = reclaim()
    recommendation = fetcher._get_request(path, None, token)
    action = fetcher._get_request("latest/meta-data/spot/instance-action", lambda r: False, token)

    assert recommendation.status_code == 200
    assert json.loads(recommendation.text) == {"noticeTime": utc_z(plan.created_at)}
    assert recommendation.text.endswith('Z"}')
    assert action.status_code == 404, "no interruption notice yet"


def test_each_flavour_says_at_risk_to_the_victim_only(guest_a, guest_b, reclaim):
    plan, _ = reclaim()
    since = utc_z(plan.created_at)

    def seen_by(guest):
        token = guest.token()
        gcp = guest.request("GET", "/computeMetadata/v1/instance/attributes/gpucap-at-risk", GOOGLE)
        native = guest.request("GET", "/metadata/v1/at-risk")
        return {
            "ec2": (guest.ec2(REBALANCE, token).status, guest.ec2(REBALANCE, token).data),
            "gcp": (gcp.status, gcp.data.decode() if gcp.status == 200 else None),
            "native": json.loads(native.data),
            "preempted": guest.request(
                "GET", "/computeMetadata/v1/instance/preempted", GOOGLE
            ).data,
        }

    assert seen_by(guest_a) == {
        "ec2": (200, json.dumps({"noticeTime": since}, separators=(",", ":")).encode()),
        "gcp": (200, since),
        "native": {"at_risk": True, "since": since},
        "preempted": b"FALSE",
    }
    assert seen_by(guest_b) == {
        "ec2": (404, b"not found"),
        "gcp": (404, None),
        "native": {"at_risk": False, "since": None},
        "preempted": b"FALSE",
    }
    # Token and header rules as for every other path of the flavour.
    assert guest_a.ec2(REBALANCE, None).status == 401
    assert guest_a.ec2(REBALANCE, guest_b.token()).status == 401
    no_header = guest_a.request("GET", "/computeMetadata/v1/instance/attributes/gpucap-at-risk")
    assert no_header.status == 403


def test_the_recommendation_clears_when_no_plan_names_the_vm(guest_a, reclaim, operator):
    _, train = reclaim()
    token = guest_a.token()
    assert guest_a.ec2(REBALANCE, token).status == 200

    services.vm_terminate(vm=train, actor=operator)  # the demand is withdrawn
    plans.capacity_set_tick(capacity_set_id=reclaim.capacity_set.pk)

    assert guest_a.ec2(REBALANCE, token).status == 404
    assert json.loads(guest_a.request("GET", "/metadata/v1/at-risk").data)["at_risk"] is False


def test_an_approved_plan_replaces_the_recommendation_with_the_notice(guest_a, reclaim, operator):
    plan, _ = reclaim()
    token = guest_a.token()

    plans.plan_approve(plan=plan, actor=operator)

    assert guest_a.ec2(REBALANCE, token).status == 404
    action = guest_a.ec2("spot/instance-action", token)
    assert action.status == 200 and json.loads(action.data)["action"] == "stop"


def test_the_resync_rebuilds_a_lost_recommendation(guest_a, reclaim):
    plan, _ = reclaim()
    cache.metadata_redis().delete(cache.metadata_key(A))

    cache.metadata_resync()

    token = guest_a.token()
    assert json.loads(guest_a.ec2(REBALANCE, token).data) == {"noticeTime": utc_z(plan.created_at)}
