"""``manage.py simulate SET PROFILE`` (issue 21, the command over the pure simulator): the set
as it is now, replayed under a load profile, nothing live touched.

h100-east is full of acme's four 4-GPU spot VMs (spot-1 oldest). acme's chat deployment in
h100-inference (rank 1) serves 1-second requests from 4-GPU replicas, 0..2 of them, 8 at once
each, aiming at 4 in flight: a load of 6 requests/s asks for 2 replicas, 8 GPUs, which the
arbiter takes from the two most recently started spot VMs.
"""

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from gpucap.audit.models import AuditEvent
from gpucap.notices.models import InterruptionNotice
from gpucap.plans.models import Plan
from gpucap.rentals.models import VirtualMachine
from tests.plans import simulation_set

full_set = simulation_set.full_set
inference_pools = simulation_set.inference_pools
inference_redis = simulation_set.inference_redis
chat = simulation_set.chat
LOAD = simulation_set.LOAD


def _simulate(tmp_path, profile: dict, *args: str) -> str:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    out = StringIO()
    call_command("simulate", "h100-east", str(path), "--hours", "2", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_a_load_that_needs_two_replicas_notifies_the_two_newest_spot_vms(full_set, chat, tmp_path):
    assert chat.slug == "acme-chat"
    before = (AuditEvent.objects.count(), Plan.objects.count())

    result = json.loads(_simulate(tmp_path, LOAD, "--json"))

    notices = [e for e in result["events"] if e["kind"] == "notice"]
    newest = [vm.instance_id for vm in full_set[2:]]  # spot-3 and spot-4
    assert sorted(e["vm"] for e in notices) == sorted(newest)
    assert {e["pool"] for e in notices} == {"h100-spot"}
    # Nothing live was touched: no notice, no plan, no audit event, every VM as it was.
    assert not InterruptionNotice.objects.exists()
    assert (AuditEvent.objects.count(), Plan.objects.count()) == before
    assert set(VirtualMachine.objects.values_list("state", flat=True)) == {"running"}


@pytest.mark.django_db
def test_the_summary_says_notices_per_pool_and_the_worst_moments(full_set, chat, tmp_path):
    printed = _simulate(tmp_path, LOAD)

    assert printed.startswith("h100-east: 120 steps of 60 s")
    assert "h100-spot notices/day: 24" in printed  # 2 in two hours
    assert "worst (notices)" in printed


@pytest.mark.django_db
def test_a_bad_profile_is_refused_naming_the_field(full_set, chat, tmp_path):
    bad = {"deployments": {"acme-chat": {"points": [[0, -1]], "service_seconds": 1.0}}}
    with pytest.raises(CommandError) as refused:
        _simulate(tmp_path, bad)
    assert "profile: deployments.acme-chat.points[0]" in str(refused.value)
    assert refused.value.returncode == 2


@pytest.mark.django_db
def test_an_unknown_set_is_refused(fleet_east, tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(LOAD))
    with pytest.raises(CommandError, match="no capacity set is named 'nowhere'"):
        call_command("simulate", "nowhere", str(path))
