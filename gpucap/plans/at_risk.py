"""At risk: the early signal for VMs a proposed plan would reclaim (issue #17, DESIGN.md
sections 3 and 5).

A VM is at risk while its capacity set's proposed plan — the one shown in dry-run, or waiting in
the approval queue — names it as a victim. ``VirtualMachine.at_risk_since`` says so, and since
when: the time of the first proposed plan that named it, kept while every later proposal names it
again, so a replan never moves a guest's ``noticeTime`` forward. It clears when a proposal no
longer names it: a new plan that spares it (or does nothing), or the plan applied (the real
notice takes over) or refused.

The state is stored on the VM rather than computed per read, because the metadata documents
(gpucap.notices.cache, an app below this one) and the tenant's pages read it from the VM row
with no query of plans. ``at_risk_follow`` is the one function that writes it: every service
that changes which plan of a set is proposed calls it in the same transaction, under the set's
advisory lock, and the guests whose flag changed have their documents republished on commit.
"""

from gpucap.fleet.models import CapacitySet
from gpucap.notices.cache import metadata_publish_on_commit
from gpucap.plans.models import Plan, PlanAction
from gpucap.rentals.models import VirtualMachine


def at_risk_follow(*, capacity_set: CapacitySet) -> set[int]:
    """Make the at-risk flags of the set's VMs agree with its proposed plan: its victims at risk
    (since that plan's time, unless they already were), every other VM of the set not. The
    caller holds the set's advisory lock. Returns the VMs whose flag changed; harmless to run
    again."""
    proposal = Plan.objects.filter(capacity_set=capacity_set, status=Plan.Status.PROPOSED).first()
    victims = set()
    if proposal is not None:
        victims = set(
            proposal.actions.filter(kind=PlanAction.Kind.PREEMPTION).values_list("vm_id", flat=True)
        )
    set_vms = VirtualMachine.objects.filter(pool__capacity_set=capacity_set)
    cleared = set(
        set_vms.filter(at_risk_since__isnull=False)
        .exclude(pk__in=victims)
        .values_list("pk", flat=True)
    )
    named = set(
        VirtualMachine.objects.filter(pk__in=victims, at_risk_since=None).values_list(
            "pk", flat=True
        )
    )
    # Only this function writes the flag, under the set's lock: the reads above still hold.
    if cleared:
        VirtualMachine.objects.filter(pk__in=cleared).update(at_risk_since=None)
    if named:
        VirtualMachine.objects.filter(pk__in=named).update(at_risk_since=proposal.created_at)
    for vm_id in cleared | named:
        metadata_publish_on_commit(vm_id)
    return cleared | named
