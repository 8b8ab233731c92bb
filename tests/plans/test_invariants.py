"""``manage.py audit_invariants`` (issue 16, build 4): each invariant broken on purpose through
the ORM (bypassing the services that keep it) is named with its rows and fails the command;
a realistic flow through the services leaves it clean; ``--json`` is what a monitor reads; the
audit runs a fixed number of queries however large the fleet, in one read-only snapshot."""

import io
import json
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.drivers.base import VmSpec
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Gpu
from gpucap.notices import cache
from gpucap.notices import services as notices
from gpucap.notices.models import InterruptionNotice
from gpucap.plans import services as plans
from gpucap.plans.invariants import RULES, invariants_audit, one_snapshot
from gpucap.plans.models import Plan, PlanAction
from gpucap.rentals import services as rentals
from gpucap.rentals.models import Allocation, VirtualMachine
from gpucap.usage.models import UsageInterval
from tests.rentals.vm_helpers import request_vm

State = VirtualMachine.State
DATABASE_RULES = [rule for rule in RULES if not rule.optional]


def audit(*args: str) -> tuple[int, str]:
    """Run the command as an operator would: its exit status and what it printed."""
    out = io.StringIO()
    try:
        call_command("audit_invariants", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def broken(*args: str) -> str:
    status, output = audit(*args)
    assert status == 1, output
    return output


def plan_row(capacity_set, *, status="applied", applied_ago=timedelta(0), pools=()) -> Plan:
    now = timezone.now()
    return Plan.objects.create(
        capacity_set=capacity_set,
        generation=capacity_set.generation,
        mode=capacity_set.mode,
        status=status,
        complete=True,
        digest="test",
        applied_at=now - applied_ago if status == "applied" else None,
        pools=list(pools),
    )


def vm_event(vm, verb: str, *, at, after=None) -> AuditEvent:
    event = AuditEvent.objects.create(
        actor_label="system",
        verb=verb,
        object_type="virtualmachine",
        object_id=str(vm.pk),
        object_label=str(vm),
        after=after or {"state": verb.removeprefix("vm.")},
    )
    AuditEvent.objects.filter(pk=event.pk).update(created_at=at)
    return event


# --- a clean fleet --------------------------------------------------------------------------------


def test_a_realistic_flow_through_the_services_leaves_every_invariant_holding(
    h100, full_set, on_demand_request, operator, tenant
):
    """globex asks for 8 on-demand GPUs in a set full of acme's spot VMs; the plan is approved,
    two spot VMs get 1-second notices and are stopped at their deadline, go back to pending and
    one resumes when the other on-demand VM ends; the owner of another terminates it."""
    fleet.capacity_set_update(capacity_set=h100, notice_seconds=1, actor=operator)
    train = on_demand_request()
    plan = plans.capacity_set_tick(capacity_set_id=h100.pk).plan
    plans.plan_approve(plan=plan, actor=operator)
    sent = list(InterruptionNotice.objects.filter(plan=plan))
    assert len(sent) == 2
    deadline = max(n.deadline for n in sent)
    while timezone.now() < deadline:  # the deadline is a second away
        time.sleep(0.05)
    for notice in sent:
        assert notices.notice_deadline_reached(notice=notice)
        rentals.vm_mark_stopped(vm=notice.vm)
    assert {vm.state for vm in VirtualMachine.objects.filter(notices__plan=plan)} == {State.PENDING}
    plans.capacity_set_tick(capacity_set_id=h100.pk)  # the freed partition goes to train-1
    train = VirtualMachine.objects.get(pk=train.pk)
    assert train.state == State.PROVISIONING
    train = rentals.vm_mark_running(vm=train, ip_address="10.9.0.1")
    # train-1 ends; a reclaimed spot VM resumes on half the GPUs it frees.
    rentals.vm_terminate(vm=train)
    rentals.vm_mark_stopped(vm=train)
    resumed = rentals.vm_place(vm=sent[0].vm, node=train.node, gpu_indices=[0, 1, 2, 3])
    rentals.vm_mark_running(vm=resumed, ip_address="10.9.0.2")
    # acme ends another spot VM itself.
    rentals.vm_terminate(vm=full_set[-1])
    rentals.vm_mark_stopped(vm=full_set[-1])
    assert InterruptionNotice.objects.filter(completed_at=None).count() == 0

    status, output = audit()

    assert status == 0, output
    assert output.startswith("audit_invariants at ")
    assert output.strip().endswith(f"{len(DATABASE_RULES)} rules checked, all hold.")


# --- each invariant, broken on purpose ------------------------------------------------------------


def test_a_gpu_held_by_two_vms_in_history_is_named_with_both_holders(full_set):
    holder, intruder = full_set[0], full_set[1]
    live = Allocation.objects.get(vm=holder, gpu__index=0)
    earlier = live.created_at - timedelta(minutes=5)
    # intruder held GPU 0 from 5 minutes before holder took it until a second after.
    overlap = Allocation.objects.create(
        vm=intruder, gpu=live.gpu, released_at=live.created_at + timedelta(seconds=1)
    )
    Allocation.objects.filter(pk=overlap.pk).update(created_at=earlier)

    output = broken()

    assert "gpu_held_twice: no GPU is held by two VMs at once" in output
    assert f"h100-001 GPU 0: vm-{intruder.pk} held it from {earlier:%Y-%m-%d %H:%M:%S}" in output
    assert f"and vm-{holder.pk} took it at" in output
    assert f"while vm-{intruder.pk} still held it" in output


def test_back_to_back_holders_of_a_gpu_are_not_held_twice(full_set):
    holder = full_set[0]
    live = Allocation.objects.get(vm=holder, gpu__index=0)
    before = Allocation.objects.create(vm=full_set[1], gpu=live.gpu, released_at=live.created_at)
    Allocation.objects.filter(pk=before.pk).update(created_at=live.created_at - timedelta(hours=1))

    status, output = audit()

    assert status == 0, output


def test_a_running_vm_missing_a_gpu_and_its_usage_is_named(full_set):
    vm = full_set[0]
    Allocation.objects.filter(vm=vm, gpu__index=3).update(released_at=timezone.now())
    UsageInterval.objects.filter(vm=vm).update(ended_at=timezone.now())

    output = broken()

    assert "holding_matches_state:" in output
    assert (
        f"vm-{vm.pk}: it is running, yet it holds 3 GPU(s) but asked for 4 and has 0 open "
        "usage intervals instead of one" in output
    )


def test_a_stopped_vm_still_holding_gpus_and_billed_is_named(full_set):
    vm = full_set[1]
    VirtualMachine.objects.filter(pk=vm.pk).update(state=State.STOPPED)

    output = broken()

    assert (
        f"vm-{vm.pk}: it is stopped, yet it still holds 4 GPU(s) and still has an open usage "
        "interval (it is being billed)" in output
    )


def test_an_open_notice_on_a_running_vm_and_a_notified_vm_without_one_are_named(full_set):
    running, notified = full_set[0], full_set[1]
    now = timezone.now()
    notice = InterruptionNotice.objects.create(
        vm=running, reason="reclaim", issued_at=now, deadline=now + timedelta(minutes=2)
    )
    VirtualMachine.objects.filter(pk=notified.pk).update(state=State.NOTIFIED)
    done = InterruptionNotice.objects.create(
        vm=full_set[2], reason="reclaim", issued_at=now, deadline=now, completed_at=now
    )

    output = broken()

    assert "notice_matches_vm:" in output
    assert (
        f"notice {notice.pk}: it is open, but its VM vm-{running.pk} is running "
        "(not notified/stopping)" in output
    )
    assert f"vm-{notified.pk}: it is notified, but has no open notice" in output
    assert (
        f"notice {done.pk}: it is completed (vm-{full_set[2].pk} is running) but says no outcome"
        in output
    )


def test_an_arbiter_notice_shorter_than_its_sets_notice_seconds_is_named(h100, full_set):
    vm = full_set[0]
    plan = plan_row(h100)
    now = timezone.now()
    notice = InterruptionNotice.objects.create(
        vm=vm, reason="arbiter", plan=plan, issued_at=now, deadline=now + timedelta(seconds=30)
    )

    output = broken()

    assert "notice_length:" in output
    assert (
        f"notice {notice.pk}: vm-{vm.pk} was given 30.0 s" in output
        and "but capacity set h100-east gives 120 s" in output
    )


def test_a_notice_issued_before_the_set_changed_its_notice_seconds_keeps_the_old_length(
    h100, full_set, operator
):
    """Deadlines are judged by the notice_seconds in force when the notice was issued."""
    vm = full_set[0]
    plan = plan_row(h100)
    AuditEvent.objects.create(
        actor_label="system",
        verb="plan.enforce",
        object_type="capacityset",
        object_id=str(h100.pk),
        object_label="h100-east",
        after={"plan": plan.pk},
    )
    notices.notice_issue(vm=vm, reason="arbiter", plan=plan)
    fleet.capacity_set_update(capacity_set=h100, notice_seconds=300, actor=operator)

    status, output = audit()

    assert status == 0, output  # the notice lasts 120 s; the set gives 300 s from now on


def test_two_notices_of_one_plan_to_one_vm_are_named(h100, full_set):
    vm = full_set[0]
    plan = plan_row(h100)
    now = timezone.now()
    first, second = (
        InterruptionNotice.objects.create(
            vm=vm,
            reason="arbiter",
            plan=plan,
            issued_at=now,
            deadline=now + timedelta(seconds=120),
            completed_at=now if n == 0 else None,
            outcome="ended" if n == 0 else "",
        )
        for n in range(2)
    )

    output = broken()

    assert "one_notice_per_victim:" in output
    assert f"plan {plan.pk}: it sent vm-{vm.pk} 2 notices ({first.pk}, {second.pk})" in output


def test_a_deadline_missed_by_more_than_the_tolerance_is_named(full_set, settings):
    settings.AUDIT_DEADLINE_TOLERANCE_SECONDS = 30
    vm = full_set[0]
    notice = notices.notice_issue(vm=vm, reason="reclaim", seconds=120)
    InterruptionNotice.objects.filter(pk=notice.pk).update(
        issued_at=notice.issued_at - timedelta(minutes=5),
        deadline=notice.deadline - timedelta(minutes=5),
    )

    output = broken()

    assert "deadline_kept:" in output
    assert f"notice {notice.pk}: vm-{vm.pk} still holds its GPUs 18" in output
    assert "(tolerance 30.0 s)" in output


def test_a_vm_stopped_before_its_deadline_without_the_guests_word_is_named(full_set):
    vm = full_set[0]
    notice = notices.notice_issue(vm=vm, reason="reclaim", seconds=600)
    InterruptionNotice.objects.filter(pk=notice.pk).update(outcome="deadline")
    VirtualMachine.objects.filter(pk=vm.pk).update(state=State.STOPPING, stop_reason="reclaimed")
    vm_event(
        vm,
        "vm.stopping",
        at=notice.issued_at + timedelta(seconds=10),
        after={"state": "stopping", "stop_reason": "reclaimed"},
    )

    output = broken()

    assert (
        f"notice {notice.pk}: vm-{vm.pk} was stopped at" in output
        and "590.0 s before its deadline" in output
        and "though its guest neither acknowledged nor shut down" in output
    )


def test_a_guest_that_acknowledged_early_keeps_its_deadline(full_set):
    vm = full_set[0]
    notices.notice_issue(vm=vm, reason="reclaim", seconds=600)
    notices.notice_acknowledge(vm=vm)
    rentals.vm_mark_stopped(vm=vm)

    status, output = audit()

    assert status == 0, output


def test_a_reclaimed_spot_vm_left_stopped_is_named(h100, full_set):
    vm = full_set[0]
    plan = plan_row(h100)
    notice = notices.notice_issue(vm=vm, reason="arbiter", plan=plan)
    notices.notice_acknowledge(vm=vm)
    # The release goes wrong: the VM ends stopped instead of back in pending.
    rentals.vm_transition(vm=vm, to=State.STOPPED)

    output = broken()

    assert "reclaimed_spot_resumes:" in output
    assert (
        f"vm-{vm.pk}: the arbiter reclaimed this spot VM (plan {plan.pk}, at "
        f"{notice.issued_at:%Y-%m-%d %H:%M:%S}" in output
    )
    assert "and it went to stopped at" in output and "instead of back to pending" in output


def test_a_spot_vm_its_owner_stopped_during_its_notice_may_stay_stopped(h100, full_set):
    vm = full_set[0]
    notices.notice_issue(vm=vm, reason="arbiter", plan=plan_row(h100))
    rentals.vm_stop(vm=vm)
    rentals.vm_mark_stopped(vm=vm)

    output = audit()[1]

    assert "reclaimed_spot_resumes:" not in output


def test_an_on_demand_vm_notified_or_preempted_by_the_arbiter_is_named(
    h100, full_set, on_demand_request
):
    vm = on_demand_request()
    plan = plan_row(h100)
    now = timezone.now()
    notice = InterruptionNotice.objects.create(
        vm=vm,
        reason="arbiter",
        plan=plan,
        issued_at=now,
        deadline=now,
        completed_at=now,
        outcome="ended",
    )
    PlanAction.objects.create(
        plan=plan,
        kind="preemption",
        position=0,
        vm=vm,
        for_vm=full_set[0],
        tenant=vm.tenant,
        pool=vm.pool,
        node=full_set[0].node,
        gpus=[0],
        progress="done",
    )

    output = broken()

    assert "on_demand_untouched:" in output
    assert f"vm-{vm.pk}: an on-demand VM got an arbiter notice at" in output
    assert f"vm-{vm.pk}: an on-demand VM got a preemption in an applied plan at" in output
    assert f"(plan {plan.pk})" in output
    assert notice.pk


def test_a_plan_applied_twice_or_never_recorded_is_named(h100, full_set):
    twice, silent = plan_row(h100), plan_row(h100)
    for verb in ("plan.approve", "plan.enforce"):
        AuditEvent.objects.create(
            actor_label="system",
            verb=verb,
            object_type="capacityset",
            object_id=str(h100.pk),
            object_label="h100-east",
            after={"plan": twice.pk},
        )

    output = broken()

    assert "one_apply_per_plan:" in output
    assert f"plan {twice.pk}: it was applied 2 times (audit events" in output
    assert (
        f"plan {silent.pk}: it is applied, but no plan.approve or plan.enforce event records "
        "the apply" in output
    )


def test_a_plan_that_took_a_pool_below_its_floor_is_named(h100, full_set):
    plan = plan_row(
        h100,
        pools=[
            {"name": "h100-spot", "floor_gpus": 8, "before_gpus": 16, "after_gpus": 4},
            # Below its floor already, and not taken lower: allowed.
            {"name": "h100-ondemand", "floor_gpus": 8, "before_gpus": 0, "after_gpus": 0},
        ],
    )
    AuditEvent.objects.create(
        actor_label="system",
        verb="plan.enforce",
        object_type="capacityset",
        object_id=str(h100.pk),
        object_label="h100-east",
        after={"plan": plan.pk},
    )

    output = broken()

    assert "floors_held:" in output
    assert (
        f"plan {plan.pk}: applied at" in output
        and "it took pool h100-spot of h100-east from 16 to 4 GPUs, below its floor of 8" in output
    )
    assert "h100-ondemand" not in output


def test_a_vm_stuck_stopping_is_named(full_set, settings):
    settings.AUDIT_STUCK_SECONDS = 600
    vm = full_set[0]
    since = timezone.now() - timedelta(hours=1)
    VirtualMachine.objects.filter(pk=vm.pk).update(state=State.STOPPING, updated_at=since)

    output = broken()

    assert "nothing_stuck:" in output
    assert f"vm-{vm.pk}: it has been stopping on h100-001 since {since:%Y-%m-%d %H:%M:%S}" in output
    assert "more than 600.0 s" in output


def test_a_placement_waiting_with_nobody_leaving_for_it_is_named(
    h100, full_set, on_demand_request, settings
):
    settings.AUDIT_STUCK_SECONDS = 600
    vm = on_demand_request()
    plan = plan_row(h100, applied_ago=timedelta(hours=2))
    AuditEvent.objects.create(
        actor_label="system",
        verb="plan.enforce",
        object_type="capacityset",
        object_id=str(h100.pk),
        object_label="h100-east",
        after={"plan": plan.pk},
    )
    node = full_set[0].node
    # GPUs 0-3 of h100-001 are held by a running VM that is not leaving.
    PlanAction.objects.create(
        plan=plan,
        kind="placement",
        position=0,
        vm=vm,
        tenant=vm.tenant,
        pool=vm.pool,
        node=node,
        gpus=[0, 1, 2, 3],
        progress="waiting",
    )

    output = broken()

    assert "placement_waits_for_someone:" in output
    assert (
        f"plan {plan.pk}: its placement of vm-{vm.pk} on h100-001 GPUs [0, 1, 2, 3] has waited"
        in output
    )
    assert "with no VM leaving for it" in output

    # Once a victim is on its way out, the placement has someone to wait for.
    notices.notice_issue(vm=full_set[0], reason="reclaim")
    assert "placement_waits_for_someone:" not in audit()[1]


# --- outside the database (flags) -----------------------------------------------------------------


def test_hypervisor_flag_names_vms_the_hypervisor_does_not_run(full_set, sim):
    running = full_set[0]
    booted = sim.create(
        VmSpec(
            instance_id=running.instance_id,
            node=running.node.hostname,
            gpus=(),
            image="ubuntu-24.04-cuda-12.6",
            ssh_public_key="ssh-ed25519 AAAA test",
        )
    )

    assert audit()[0] == 0  # the database alone is sound
    assert (
        f"vm-{running.pk}: on h100-001: the database says its address is 10.50.0.1, the "
        f"hypervisor {booted.ip_address}" in broken("--hypervisor")
    )
    VirtualMachine.objects.filter(pk=running.pk).update(ip_address=booted.ip_address)

    output = broken("--hypervisor")

    assert "hypervisor_agrees:" in output
    for vm in full_set[1:]:
        assert (
            f"vm-{vm.pk}: on {vm.node.hostname}: the database says running, the hypervisor "
            "says missing" in output
        )
    assert f"vm-{running.pk}:" not in output


@pytest.fixture
def metadata_keys(monkeypatch, settings):
    """Metadata documents under a prefix of this test's own in the test runs' metadata Redis."""
    settings.METADATA_REDIS_URL = "redis://127.0.0.1:6379/14"
    prefix = f"gpucap:imds:audit-test{id(settings)}:ip:"
    monkeypatch.setattr(cache, "KEY_PREFIX", prefix)
    client = cache.metadata_redis()
    yield client
    for key in client.scan_iter(match=f"{prefix}*"):
        client.delete(key)


def test_metadata_flag_names_missing_stale_and_outdated_documents(full_set, metadata_keys):
    published, outdated, missing = full_set[0], full_set[1], full_set[2]
    cache.metadata_publish_many([vm.pk for vm in full_set])
    metadata_keys.delete(cache.metadata_key(missing.ip_address))
    notices.notice_issue(vm=outdated, reason="reclaim")  # its publish waits for a commit
    metadata_keys.set(cache.metadata_key("10.77.0.9"), json.dumps({"vm": "vm-999"}))

    output = broken("--metadata")

    assert "metadata_agrees:" in output
    assert (
        f"address {missing.ip_address}: vm-{missing.pk} is running, but its guests get no "
        "document" in output
    )
    assert (
        f"address {outdated.ip_address}: the document of vm-{outdated.pk} differs from the "
        "database in notice" in output
    )
    assert "address 10.77.0.9: it is served, but no VM that holds GPUs has this address" in output
    assert f"address {published.ip_address}" not in output


def test_metadata_agrees_once_every_document_is_published(full_set, metadata_keys):
    cache.metadata_publish_many([vm.pk for vm in full_set])

    status, output = audit("--metadata")

    assert status == 0, output
    assert "14 rules checked, all hold." in output


# --- for monitoring -------------------------------------------------------------------------------


def test_json_report_lists_every_rule_and_each_violation_with_its_rows(full_set):
    vm = full_set[0]
    VirtualMachine.objects.filter(pk=vm.pk).update(state=State.PENDING)

    status, output = audit("--json")

    assert status == 1
    report = json.loads(output)
    assert set(report) == {"ok", "checked_at", "rules", "violations"}
    assert report["ok"] is False
    assert report["checked_at"].endswith("Z")
    assert [r["rule"] for r in report["rules"]] == [r.name for r in DATABASE_RULES]
    assert all(set(r) == {"rule", "says", "violations"} for r in report["rules"])
    counts = {r["rule"]: r["violations"] for r in report["rules"]}
    assert counts["holding_matches_state"] == 1
    assert sum(counts.values()) == len(report["violations"])
    (violation,) = report["violations"]
    assert violation == {
        "rule": "holding_matches_state",
        "subject": f"vm-{vm.pk}",
        "why": "it is pending, yet it still holds 4 GPU(s) and still has an open usage "
        "interval (it is being billed)",
        "rows": {
            "vm": vm.pk,
            "state": "pending",
            "gpu_count": 4,
            "live_allocations": 4,
            "allocations_off_node": 0,
            "open_usage_intervals": 1,
        },
    }


def test_json_report_of_a_clean_fleet_says_ok(full_set):
    status, output = audit("--json")

    assert status == 0
    report = json.loads(output)
    assert report["ok"] is True and report["violations"] == []


def test_limit_bounds_the_rows_reported_per_rule(full_set):
    VirtualMachine.objects.filter(pk__in=[vm.pk for vm in full_set]).update(state=State.PENDING)

    report = json.loads(audit("--json", "--limit", "2")[1])

    assert len(report["violations"]) == 2


# --- fast on a large fleet, in one snapshot -------------------------------------------------------


def test_the_audit_runs_a_fixed_number_of_queries_however_large_the_fleet(
    h100, full_set, fleet_east, tenant, django_assert_max_num_queries
):
    # The rules, the snapshot's clock, and the savepoint around them (inside the test's
    # transaction; a real run sets the isolation level instead).
    budget = len(DATABASE_RULES) + 3
    with django_assert_max_num_queries(budget):
        assert invariants_audit().ok

    # A larger fleet with history: many notices, plans, VMs and released allocations.
    pool = fleet_east["pools"]["h100-spot"]
    for n in range(30):
        vm = request_vm(tenant, pool, name=f"more-{n}", gpu_count=4)
        if n % 3 == 0:
            rentals.vm_terminate(vm=vm)
    for vm in full_set[:2]:
        notices.notice_issue(vm=vm, reason="arbiter", plan=plan_row(h100, status="superseded"))
    Allocation.objects.filter(vm=full_set[3]).update(released_at=timezone.now())

    with django_assert_max_num_queries(budget):
        report = invariants_audit()
    assert not report.ok  # the plans were never applied; vm-4 lost its GPUs


@pytest.mark.django_db(transaction=True)
def test_the_audit_reads_one_repeatable_read_snapshot_and_cannot_write(fleet_east):
    with one_snapshot():
        with connection.cursor() as cursor:
            cursor.execute("SHOW transaction_isolation")
            assert cursor.fetchone() == ("repeatable read",)
            cursor.execute("SHOW transaction_read_only")
            assert cursor.fetchone() == ("on",)
        with pytest.raises(DatabaseError, match="read-only transaction"):
            Gpu.objects.update(health="failed")
    assert not Gpu.objects.filter(health="failed").exists()
    assert invariants_audit().ok
