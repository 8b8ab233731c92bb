"""A running multi-VM job on the live fleet (#17, whole jobs): the arbiter reclaims it whole,
every member gets its notice in the same application (and none twice), the preview says so,
and the reclaimed spot job waits and resumes together."""

import pytest
from django.urls import reverse

from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.notices.models import InterruptionNotice
from gpucap.plans import services
from gpucap.plans.models import Plan, PlanAction
from gpucap.plans.snapshot import LiveCapacity, capacity_set_snapshot
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from tests.rentals.vm_helpers import IMAGE, SSH_KEY, request_vm

State = VirtualMachine.State
Kind = PlanAction.Kind
JOB = "acme/train-7"
EXPLAINED = f"reclaims job {JOB}: 4 VMs, 16 GPUs, together"


def tick(capacity_set) -> Plan:
    return services.capacity_set_tick(capacity_set_id=capacity_set.pk).plan


@pytest.fixture
def job(fleet_east, tenant, other_tenant) -> list[VirtualMachine]:
    """acme's spot job train-7: four 4-GPU VMs asked for together, running two per node on
    both nodes of h100-east; globex may rent on-demand VMs in the set."""
    pools, nodes = fleet_east["pools"], fleet_east["nodes"]
    fleet.pool_set_tenants(pool=pools["h100-ondemand"], tenants=[other_tenant])
    members = []
    for n, (node, gpus) in enumerate(
        [
            ("h100-001", [0, 1, 2, 3]),
            ("h100-001", [4, 5, 6, 7]),
            ("h100-002", [0, 1, 2, 3]),
            ("h100-002", [4, 5, 6, 7]),
        ],
        start=1,
    ):
        vm = rentals.vm_request(
            tenant=tenant,
            pool=pools["h100-spot"],
            name=f"train-7-{n}",
            gpu_count=4,
            image=IMAGE,
            ssh_public_key=SSH_KEY,
            demand_group=JOB,
        )
        rentals.vm_place(vm=vm, node=nodes[node], gpu_indices=gpus)
        members.append(rentals.vm_mark_running(vm=vm, ip_address=f"10.50.0.{n}"))
    return members


def test_a_sets_snapshot_names_each_running_vms_job_and_the_standalone_one_does_not(h100, job):
    snapshot = capacity_set_snapshot(h100).snapshot
    assert {vm.id: vm.group for vm in snapshot.vms} == {vm.instance_id: JOB for vm in job}
    # Outside a set, the standalone path stops a victim's job-mates itself.
    live = LiveCapacity.load(nodes=h100.nodes.all(), pools=h100.pools.all())
    standalone = live.snapshot((h100.gpu_model, h100.fabric), name="standalone")
    assert {vm.group for vm in standalone.vms} == {None}


def names(vms) -> list[str]:
    return sorted(vm.name for vm in vms)


def test_a_running_job_is_reclaimed_whole_notified_together_and_resumes_together(
    h100, job, other_tenant, fleet_east, operator, operator_client, operator_api
):
    train = request_vm(other_tenant, fleet_east["pools"]["h100-ondemand"], name="od-1", gpu_count=8)

    # The dry-run preview: one node's worth is needed, the whole job is reclaimed, and says so.
    proposal = tick(h100)
    assert proposal.status == Plan.Status.PROPOSED
    assert (proposal.preemptions, proposal.preempted_gpus) == (4, 16)
    reclaimed = proposal.actions.filter(kind=Kind.PREEMPTION).select_related("vm", "node")
    assert names(a.vm for a in reclaimed) == names(job)
    assert {a.node.hostname for a in reclaimed} == {"h100-001", "h100-002"}
    assert all(EXPLAINED in a.reason and a.for_vm == train for a in reclaimed)
    page = operator_client.get(reverse("fleet:capacity-set-detail", kwargs={"name": "h100-east"}))
    assert page.status_code == 200
    assert page.content.decode().count(EXPLAINED) == 4
    detail = operator_api.get(f"/api/plans/{proposal.pk}/")
    assert detail.status_code == 200
    assert detail.content.decode().count(EXPLAINED) == 4
    assert not InterruptionNotice.objects.exists()

    # Enforcement: every member gets its notice in one application, members on the node the
    # placement does not take included.
    services.capacity_set_set_mode(capacity_set=h100, mode="enforce", actor=operator)
    applied = tick(h100)
    assert applied.status == Plan.Status.APPLIED and applied.preemptions == 4
    notices = InterruptionNotice.objects.select_related("vm")
    assert names(n.vm for n in notices) == names(job)
    assert {n.plan_id for n in notices} == {applied.pk}
    assert all(n.vm.state == State.NOTIFIED and n.vm.preempted_for == train for n in notices)

    # Retried: no second notice, whether the plan is applied again or the set replanned.
    with pytest.raises(Conflict):
        services.plan_approve(plan=applied, actor=operator)
    again = tick(h100)
    assert (again.preemptions, again.placements) == (0, 0)
    assert InterruptionNotice.objects.count() == 4

    # The members stop: the on-demand VM takes one node; the job goes back to pending whole,
    # with its group, and does not start half of itself on the 8 GPUs left.
    for vm in job:
        rentals.vm_mark_stopped(vm=rentals.vm_stop_for_notice(vm=vm, message="deadline"))
    tick(h100)
    train.refresh_from_db()
    assert train.state == State.PROVISIONING
    waiting = VirtualMachine.objects.filter(demand_group=JOB)
    assert {vm.state for vm in waiting} == {State.PENDING}
    assert tick(h100).placements == 0
    assert {vm.state for vm in waiting.all()} == {State.PENDING}, "all or none"

    # The on-demand VM goes: the job resumes, all four together.
    rentals.vm_terminate(vm=rentals.vm_mark_running(vm=train, ip_address="10.50.0.9"))
    train.refresh_from_db()
    rentals.vm_mark_stopped(vm=train)
    resumed = tick(h100)
    assert resumed.placements == 4 and resumed.preemptions == 0
    assert {vm.state for vm in waiting.all()} == {State.PROVISIONING}
