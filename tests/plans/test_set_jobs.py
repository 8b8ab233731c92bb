"""Multi-VM jobs in a capacity set: the arbiter places a pending job all or none, and its plan
says why a job it cannot place whole waits."""

from gpucap.plans.models import PlanAction
from gpucap.plans.services import capacity_set_tick
from gpucap.rentals import jobs
from gpucap.rentals.models import VirtualMachine
from tests.rentals.vm_helpers import IMAGE, SSH_KEY, running_vm

Kind = PlanAction.Kind


def ask_job(tenant, pool, *, job: str, count: int, gpus: int) -> list[VirtualMachine]:
    return jobs.job_request(
        tenant=tenant,
        pool=pool,
        job=job,
        count=count,
        gpu_count=gpus,
        image=IMAGE,
        ssh_public_key=SSH_KEY,
    )


def test_a_job_with_room_for_three_of_four_is_not_placed_and_the_plan_says_why(fleet_east, tenant):
    h100, spot = fleet_east["sets"]["h100-east"], fleet_east["pools"]["h100-spot"]
    # 4 of the set's 16 GPUs are taken by a VM of the same rank: nobody may preempt it.
    running_vm(tenant, spot, fleet_east["nodes"]["h100-001"], [0, 1, 2, 3], name="x", ip="10.0.0.8")
    members = ask_job(tenant, spot, job="train-7", count=4, gpus=4)

    plan = capacity_set_tick(capacity_set_id=h100.pk).plan

    assert not plan.actions.filter(kind__in=[Kind.PLACEMENT, Kind.PREEMPTION]).exists()
    unsatisfied = list(plan.actions.filter(kind=Kind.UNSATISFIED))
    assert {a.vm_id for a in unsatisfied} == {vm.pk for vm in members}
    assert {a.group for a in unsatisfied} == {"acme/train-7"}
    # The members the set had room for wait too, and say it is for the job.
    assert sum("group acme/train-7 could not be placed whole" in a.reason for a in unsatisfied) >= 3
    assert {vm.state for vm in VirtualMachine.objects.filter(job="train-7")} == {"pending"}


def test_a_job_that_fits_is_planned_whole(fleet_east, tenant):
    h100, spot = fleet_east["sets"]["h100-east"], fleet_east["pools"]["h100-spot"]
    members = ask_job(tenant, spot, job="train-7", count=4, gpus=4)

    plan = capacity_set_tick(capacity_set_id=h100.pk).plan

    placed = plan.actions.filter(kind=Kind.PLACEMENT)
    assert {a.vm_id for a in placed} == {vm.pk for vm in members}
    assert {a.group for a in placed} == {"acme/train-7"}
