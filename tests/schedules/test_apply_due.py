"""Beat's pass over the scheduled sets (`policies_apply_due`) applies only what has something new
to put in force: a boundary passed since the last apply (also one lost while beat was down), or a
generation moved since. Every other pass is one query and no apply."""

from datetime import timedelta

import pytest

from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.inference.models import InferenceDeployment
from gpucap.schedules import services
from tests.schedules import test_boundary as story

# The story's fixtures (tests/schedules/test_boundary.py): h100-east, acme's chat (0..2 replicas)
# and the day shift raising its minimum to 2 from 08:00 to 20:00 in New York.
h100 = story.h100
inference_pools = story.inference_pools
inference_redis = story.inference_redis
chat = story.chat
sent = story.sent
day_shift = story.day_shift
BEFORE, OPENS = story.BEFORE, story.OPENS
# 20:00 in New York: the day shift closes.
CLOSES = OPENS + timedelta(hours=12)


@pytest.fixture
def applies(monkeypatch) -> list:
    """The moments `policy_apply` ran at (cleared after writing the schedule, which applies it)."""
    found = []
    real = services.policy_apply

    def counted(*, now, **kwargs):
        found.append(now)
        return real(now=now, **kwargs)

    monkeypatch.setattr(services, "policy_apply", counted)
    return found


def min_in_force(deployment: InferenceDeployment) -> int:
    deployment.refresh_from_db()
    return deployment.min_replicas_in_force


@pytest.mark.django_db
def test_beat_applies_a_set_only_when_a_boundary_has_passed_since_its_last_apply(
    h100, chat, operator, sent, applies, django_assert_num_queries
):
    services.schedule_entry_save(capacity_set=h100, data=day_shift(), actor=operator, now=BEFORE)
    applies.clear()

    # No boundary since the entry was written and applied: one query, nothing applied, however
    # often beat passes at one moment.
    for _ in range(3):
        with django_assert_num_queries(1):
            assert services.policies_apply_due(now=BEFORE + timedelta(seconds=30)) == 0
    assert applies == []

    # The window opened at 08:00 in New York (its wake-up lost): the next pass applies it, once.
    assert services.policies_apply_due(now=OPENS + timedelta(seconds=20)) == 1
    assert min_in_force(chat) == 2
    with django_assert_num_queries(1):
        assert services.policies_apply_due(now=OPENS + timedelta(seconds=50)) == 0
    assert applies == [OPENS + timedelta(seconds=20)]

    # Beat down over 20:00, back three hours later: the close it missed is applied then.
    back = CLOSES + timedelta(hours=3)
    assert services.policies_apply_due(now=back) == 1
    assert min_in_force(chat) == 0
    assert services.policies_apply_due(now=back + timedelta(seconds=30)) == 0
    assert applies == [OPENS + timedelta(seconds=20), back]
    assert AuditEvent.objects.filter(verb="policy.apply").count() == 2


@pytest.mark.django_db
def test_beat_applies_again_a_set_whose_generation_moved(h100, chat, operator, sent, applies):
    """A change to what the policy is computed from (a pool re-ranked, a floor moved) bumps the
    set's generation: the next pass applies the set again, at once."""
    services.schedule_entry_save(capacity_set=h100, data=day_shift(), actor=operator, now=OPENS)
    applies.clear()
    assert services.policies_apply_due(now=OPENS + timedelta(seconds=30)) == 0
    assert applies == []

    fleet.capacity_set_bump(capacity_set_id=h100.pk)
    assert services.policies_apply_due(now=OPENS + timedelta(seconds=60)) == 0  # nothing changed
    assert services.policies_apply_due(now=OPENS + timedelta(seconds=90)) == 0
    assert applies == [OPENS + timedelta(seconds=60)]
