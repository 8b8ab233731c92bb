"""A machine rented whole runs its tenant's system, not a hypervisor: the hypervisor watch never
marks it down for its silence, and recovery never power-cycles it, automatically or at an
operator's word (its power is the tenant's, docs/bmc.md "Whole machines for tenants")."""

from datetime import timedelta

import pytest
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.bmc import recovery
from gpucap.bmc.hypervisor_watch import hypervisor_watch
from gpucap.bmc.models import HypervisorProbe, RecoveryAttempt
from gpucap.bmc.power_cycle import recovery_tick
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Node
from tests.bmc.bare_metal_helpers import dedicated, rent
from tests.bmc.recovery_helpers import give_bmc


@pytest.fixture
def rented(fleet_east, sim, tenant, operator, settings) -> Node:
    """The A100 node, dedicated to acme and rented to it whole, with a BMC gpucap could use."""
    settings.NODE_DOWN_AFTER_SECONDS = 300
    node = dedicated(fleet_east["nodes"]["a100-001"], tenant, operator=operator)
    node = give_bmc(node, "http://127.0.0.1:9")  # never asked: nothing here may cycle it
    rent(node, tenant, actor=operator)
    return Node.objects.get(pk=node.pk)


def test_a_rented_machine_silent_on_the_probe_is_never_marked_down(rented, sim):
    sim.hypervisor_silence(rented.hostname)
    t0 = timezone.now()

    assert hypervisor_watch(now=t0) == []
    assert hypervisor_watch(now=t0 + timedelta(seconds=3600)) == []

    assert Node.objects.get(pk=rented.pk).state == Node.State.CORDONED
    assert not HypervisorProbe.objects.filter(node=rented).exists()


def test_a_rented_machine_marked_down_is_never_power_cycled(rented, fleet_east, operator):
    fleet.node_set_state(node=rented, state=Node.State.DOWN, actor=operator)
    recovery.recovery_policy_set(
        cluster=rented.cluster, actor=operator, auto_power_cycle=True, grace_seconds=0
    )
    events = AuditEvent.objects.count()

    assert recovery_tick(now=timezone.now() + timedelta(hours=1))["started"] == []
    with pytest.raises(Conflict) as refused:
        recovery.power_cycle_request(node=rented, actor=operator)

    assert refused.value.code == "node_rented"
    assert "rented whole to a tenant" in refused.value.message
    assert not RecoveryAttempt.objects.filter(node=rented).exists()
    assert AuditEvent.objects.count() == events
