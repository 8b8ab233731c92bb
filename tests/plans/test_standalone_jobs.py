"""Multi-VM jobs outside capacity sets: a pending job is placed all or none on the standalone
nodes, and a higher-ranked standalone placement that stops one running member of a job stops
the whole job at once (no notice), never leaving it running in part."""

from datetime import timedelta

from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.errors import Conflict
from gpucap.rentals import jobs, services
from gpucap.rentals.models import VirtualMachine
from tests.plans.test_standalone import SSH_KEY, east, fresh, held, no_gpu_held_twice
from tests.rentals import conftest as rentals_fixtures

__all__ = ["east"]  # the fixture
State = VirtualMachine.State
sent_tasks = rentals_fixtures.sent_tasks


def ask_job(east, pool: str, *, job: str, count: int, gpus: int) -> list[VirtualMachine]:
    return jobs.job_request(
        tenant=east.tenant,
        pool=east.pools[pool],
        job=job,
        count=count,
        gpu_count=gpus,
        image="ubuntu-24.04-cuda-12.6",
        ssh_public_key=SSH_KEY,
    )


def running_job(east, *, job: str, on: list[tuple[str, list[int]]]) -> list[VirtualMachine]:
    members = ask_job(east, "a100-spot", job=job, count=len(on), gpus=len(on[0][1]))
    for vm, (node, gpus) in zip(members, on, strict=True):
        services.vm_place(vm=vm, node=east.nodes[node], gpu_indices=gpus)
        services.vm_mark_running(vm=vm, ip_address="10.1.2.4")
    return [fresh(vm) for vm in members]


def test_a_job_with_room_for_three_of_its_four_vms_places_none(east):
    east.running("a100-standalone", "a100-001", [0, 1, 2, 3])
    members = ask_job(east, "a100-batch", job="train-7", count=4, gpus=4)

    result = east.place()

    assert result.placed == [] and result.preempted == []
    assert {fresh(vm).state for vm in members} == {State.PENDING}
    assert all(held(vm) is None for vm in members)
    reasons = {u.vm_id: u.reason for u in result.unsatisfied}
    assert set(reasons) == {vm.pk for vm in members}
    assert sum("could not be placed whole" in reason for reason in reasons.values()) >= 3


def test_a_job_that_fits_is_placed_whole(east):
    members = ask_job(east, "a100-batch", job="train-7", count=4, gpus=4)

    result = east.place()

    assert sorted(p.vm_id for p in result.placed) == sorted(vm.pk for vm in members)
    assert {fresh(vm).state for vm in members} == {State.PROVISIONING}
    no_gpu_held_twice()


def test_a_member_that_cannot_be_placed_after_all_leaves_the_whole_job_pending(east, monkeypatch):
    members = ask_job(east, "a100-batch", job="train-7", count=4, gpus=4)
    place = services.vm_place

    def gpus_taken_meanwhile(*, vm, **kwargs):
        if vm.name == "train-7-2":  # another worker took its GPUs since this run read them
            raise Conflict("GPUs [0, 1, 2, 3] of a100-002 are no longer free", code="gpus_taken")
        return place(vm=vm, **kwargs)

    monkeypatch.setattr(services, "vm_place", gpus_taken_meanwhile)

    result = east.place()

    assert result.placed == []
    assert {fresh(vm).state for vm in members} == {State.PENDING}
    assert all(held(vm) is None for vm in members)
    reasons = {u.vm_id: u.reason for u in result.unsatisfied}
    assert "no longer free" in reasons[members[2].pk]
    assert "placed whole or not at all" in reasons[members[0].pk]
    no_gpu_held_twice()


def test_preempting_one_member_of_a_running_job_stops_the_whole_job(
    east, sent_tasks, django_capture_on_commit_callbacks
):
    first, second = running_job(
        east, job="sweep", on=[("a100-001", list(range(8))), ("a100-002", list(range(8)))]
    )
    VirtualMachine.objects.filter(pk=first.pk).update(
        started_at=timezone.now() - timedelta(hours=5)
    )
    urgent = east.request("a100-standalone", 8)

    with django_capture_on_commit_callbacks(execute=True):
        result = east.place()

    # The plan chose the most recently started member; its job-mate stops with it.
    chosen, mate = fresh(second), fresh(first)
    assert {(p.vm_id, p.for_vm_id) for p in result.preempted} == {
        (second.pk, urgent.pk),
        (first.pk, urgent.pk),
    }
    assert (chosen.state, chosen.stop_reason, chosen.preempted_for_id) == (
        State.STOPPING,
        VirtualMachine.StopReason.PREEMPTED,
        urgent.pk,
    )
    # The job-mate's GPUs are reserved for nobody: the placement waits for its own victim only.
    assert (mate.state, mate.stop_reason, mate.preempted_for_id) == (
        State.STOPPING,
        VirtualMachine.StopReason.PREEMPTED,
        None,
    )
    event = AuditEvent.objects.get(verb="vm.stopping", object_id=str(first.pk))
    assert "with " + second.instance_id in event.message and "job sweep" in event.message
    assert ("rentals.vm_stop", [first.pk]) in sent_tasks  # at once, no notice
    assert ("rentals.vm_stop", [second.pk]) in sent_tasks
    assert result.waiting == [urgent.pk]

    # The chosen victim is off: the urgent VM takes its GPUs; the job-mate is still stopping.
    services.vm_mark_stopped(vm=chosen)
    placed = east.place()
    assert [p.vm_id for p in placed.placed] == [urgent.pk]
    assert held(urgent) == ("a100-002", tuple(range(8)))

    # Both members are back in pending as a persistent spot job: 8 GPUs are free, the job
    # needs 16, so neither is placed (all or none).
    services.vm_mark_stopped(vm=fresh(first))
    again = east.place()
    assert again.placed == []
    assert {fresh(vm).state for vm in (first, second)} == {State.PENDING}
    assert {u.vm_id for u in again.unsatisfied} == {first.pk, second.pk}
    no_gpu_held_twice()


def test_a_spot_vm_on_its_own_is_preempted_alone(east):
    lone = east.running("a100-spot", "a100-001", list(range(8)))
    job = running_job(east, job="sweep", on=[("a100-002", list(range(8)))])
    VirtualMachine.objects.filter(pk=job[0].pk).update(
        started_at=timezone.now() - timedelta(hours=5)
    )
    urgent = east.request("a100-standalone", 8)

    result = east.place()

    assert [(p.vm_id, p.for_vm_id) for p in result.preempted] == [(lone.pk, urgent.pk)]
    assert fresh(job[0]).state == State.RUNNING


def test_a_preempted_job_resumes_whole_not_member_by_member(east):
    first, second = running_job(
        east, job="sweep", on=[("a100-001", list(range(8))), ("a100-002", list(range(8)))]
    )
    gone = east.request("a100-standalone", 8)
    services.vm_preempt(vm=first, for_vm=gone)
    jobs.job_member_preempt(vm=second, victim=first, for_vm=gone)
    services.vm_terminate(vm=gone)  # the VM the job was stopped for is withdrawn
    services.vm_mark_stopped(vm=fresh(first))  # back in pending; its board is free again
    assert fresh(first).state == State.PENDING and fresh(second).state == State.STOPPING

    result = east.place()

    # Room for it on its own board, but its job-mate is still on its way back: it waits.
    assert result.placed == [] and held(first) is None
    reasons = {u.vm_id: u.reason for u in result.unsatisfied}
    assert f"waits for {second.instance_id} of its job sweep" in reasons[first.pk]

    services.vm_mark_stopped(vm=fresh(second))
    again = east.place()

    assert sorted(p.vm_id for p in again.placed) == sorted([first.pk, second.pk])
    no_gpu_held_twice()
