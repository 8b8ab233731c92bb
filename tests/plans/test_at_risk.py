"""At risk (issue #17): a VM named as a victim by its set's proposed plan is flagged, since the
first plan that named it, until a plan no longer names it; the tenant sees it on the VM page,
the VM list and the API, and never sees another tenant's."""

from datetime import datetime, timedelta

from django.urls import reverse

from gpucap.fleet import services as fleet
from gpucap.notices.models import InterruptionNotice
from gpucap.plans import services
from gpucap.plans.models import Plan
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from tests.plans.test_invariants import audit, broken
from tests.plans.test_services import tick, victims_of
from tests.plans.test_tenant_words import _text

WORDS = "a proposed plan would reclaim this VM; no notice yet"


def at_risk() -> dict[str, object]:
    """Each at-risk VM's instance id -> since when."""
    flagged = VirtualMachine.objects.exclude(at_risk_since=None)
    return {vm.instance_id: vm.at_risk_since for vm in flagged}


def test_a_dry_run_plan_puts_its_victims_at_risk_since_it_was_made(
    h100, full_set, on_demand_request
):
    on_demand_request()

    plan = tick(h100)

    assert plan.status == Plan.Status.PROPOSED
    assert sorted(at_risk()) == victims_of(plan)
    assert set(at_risk().values()) == {plan.created_at}
    assert not InterruptionNotice.objects.exists(), "the notice itself is unchanged"


def test_a_replan_that_names_the_victims_again_keeps_their_time(
    h100, full_set, on_demand_request, operator
):
    on_demand_request()
    first = tick(h100)
    before = at_risk()
    # A change that bumps the generation without changing who would be reclaimed.
    node = h100.nodes.get(hostname="h100-001")
    fleet.node_cordon(node=node, actor=operator)
    fleet.node_uncordon(node=node, actor=operator)
    second = tick(h100)

    first.refresh_from_db()
    assert second.pk != first.pk and first.status == Plan.Status.SUPERSEDED
    assert victims_of(second) == victims_of(first)
    assert at_risk() == before, "noticeTime never moves forward while plans keep naming it"


def test_at_risk_clears_when_a_plan_no_longer_names_the_vm(
    h100, full_set, on_demand_request, operator
):
    train = on_demand_request()
    tick(h100)
    assert at_risk()

    rentals.vm_terminate(vm=train, actor=operator)  # the demand is withdrawn
    idle = tick(h100)

    assert idle.status == Plan.Status.NOTHING
    assert at_risk() == {}


def test_at_risk_moves_to_the_victims_a_new_plan_names(h100, full_set, on_demand_request):
    on_demand_request(gpu_count=4)
    first = tick(h100)
    first_victims = victims_of(first)
    on_demand_request(name="train-2", gpu_count=8)
    second = tick(h100)

    assert sorted(at_risk()) == victims_of(second)
    kept = set(first_victims) & set(victims_of(second))
    assert all(at_risk()[vm] == first.created_at for vm in kept)
    assert all(at_risk()[vm] == second.created_at for vm in set(victims_of(second)) - kept)


def test_an_approved_plan_clears_at_risk_and_the_notice_takes_over(
    h100, full_set, on_demand_request, operator
):
    on_demand_request()
    plan = tick(h100)

    services.plan_approve(plan=plan, actor=operator)

    assert at_risk() == {}
    notified = VirtualMachine.objects.filter(state=VirtualMachine.State.NOTIFIED)
    assert sorted(vm.instance_id for vm in notified) == victims_of(plan)


def test_an_enforcing_set_never_shows_at_risk(h100, full_set, on_demand_request, operator):
    services.capacity_set_set_mode(capacity_set=h100, mode="enforce", actor=operator)
    on_demand_request()

    plan = tick(h100)

    assert plan.status == Plan.Status.APPLIED
    assert at_risk() == {}


# --- what the tenant sees -------------------------------------------------------------------------


def test_the_vm_page_and_list_show_at_risk_in_words_for_the_tenant(
    h100, full_set, on_demand_request, member_client, tenant
):
    train = on_demand_request()
    plan = tick(h100)
    victim = plan.actions.filter(kind="preemption").first().vm
    spared = next(vm for vm in full_set if vm.instance_id not in victims_of(plan))
    since = f"At risk since {plan.created_at:%H:%M} — {WORDS}"

    page = _text(member_client.get(reverse("rentals:vm-detail", args=[victim.pk])))
    calm = _text(member_client.get(reverse("rentals:vm-detail", args=[spared.pk])))
    listing = _text(member_client.get(reverse("rentals:tenant-vms", args=[tenant.slug])))
    portal = _text(member_client.get(reverse("tenant-detail", kwargs={"slug": tenant.slug})))

    assert since in " ".join(page.split())
    assert "At risk" not in calm
    assert listing.count(since) == len(victims_of(plan))
    assert portal.count(since) == len(victims_of(plan))
    # Tenant-safe words: nothing of the other tenant whose demand would take the GPUs.
    for text in (page, listing, portal):
        assert train.instance_id not in text and train.name not in text
        assert "globex" not in text.lower() and "h100-ondemand" not in text


def test_another_tenant_never_sees_an_at_risk_vm(
    h100, full_set, on_demand_request, other_member_client, other_tenant
):
    on_demand_request()
    plan = tick(h100)
    victim = plan.actions.filter(kind="preemption").first().vm

    page = other_member_client.get(reverse("rentals:vm-detail", args=[victim.pk]))
    listing = _text(
        other_member_client.get(reverse("rentals:tenant-vms", args=[other_tenant.slug]))
    )

    assert page.status_code == 404
    assert "At risk" not in listing and victim.name not in listing


def test_the_api_exposes_at_risk_to_the_owner_only(
    h100, full_set, on_demand_request, member_api, other_member_api
):
    on_demand_request()
    plan = tick(h100)
    victim = plan.actions.filter(kind="preemption").first().vm
    spared = next(vm for vm in full_set if vm.instance_id not in victims_of(plan))

    mine = member_api.get(f"/api/vms/{victim.pk}/").json()
    calm = member_api.get(f"/api/vms/{spared.pk}/").json()
    theirs = other_member_api.get(f"/api/vms/{victim.pk}/")
    listed = other_member_api.get("/api/vms/").json()

    assert mine["at_risk"] is True
    assert abs(datetime.fromisoformat(mine["at_risk_since"]) - plan.created_at) < timedelta(
        seconds=1
    )
    assert (calm["at_risk"], calm["at_risk_since"]) == (False, None)
    assert theirs.status_code == 404
    assert not any(vm["at_risk"] for vm in listed["results"])


def test_the_audit_names_an_at_risk_flag_that_disagrees_with_the_plans(
    h100, full_set, on_demand_request
):
    on_demand_request()
    plan = tick(h100)
    victim = plan.actions.filter(kind="preemption").first().vm
    stray = next(vm for vm in full_set if vm.instance_id not in victims_of(plan))
    assert "at_risk_matches_plans" not in audit()[1]
    VirtualMachine.objects.filter(pk=victim.pk).update(at_risk_since=None)
    VirtualMachine.objects.filter(pk=stray.pk).update(at_risk_since=plan.created_at)

    output = broken()

    assert (
        f"vm-{victim.pk}: proposed plan {plan.pk} names it as a victim, but it is not at risk"
        in output
    )
    assert f"vm-{stray.pk}: it is at risk since" in output
    assert "but no proposed plan names it" in output
