"""A rented machine's power, switched by its tenant through gpucap, against sushy-emulator's
fake system (its power really changes 1 to 11 s after the request, as a machine's does): a real
Celery worker asks the BMC and reads the power until the machine follows; a message delivered
twice asks the BMC once; a BMC that refuses or does not answer is reported in the tenant's words,
never with the BMC's address, user or password; one action at a time."""

from datetime import timedelta

import pytest
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.bmc import bare_metal_power
from gpucap.bmc.models import BareMetalPowerAction
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from tests.bmc.bare_metal_helpers import dedicated, rent
from tests.bmc.conftest import TEST_KEY
from tests.bmc.emulators import DynamicBmc, RefusingBmc, free_port
from tests.rentals import conftest as rentals_fixtures
from tests.rentals.conftest import wait_for

celery_queue = rentals_fixtures.celery_queue
workers = rentals_fixtures.workers
State = BareMetalPowerAction.State


@pytest.fixture(scope="module")
def machine():
    """An emulator of this module's own: its tests switch the system off and on."""
    with DynamicBmc() as bmc:
        yield bmc


@pytest.fixture
def rental(fleet_east, tenant, operator, machine):
    node = dedicated(fleet_east["nodes"]["a100-001"], tenant, bmc=machine, operator=operator)
    return rent(node, tenant, actor=operator)


def _power(member_api, rental, action: str):
    return member_api.post(f"/api/bare-metal/{rental.pk}/power/", {"action": action}, format="json")


def _finished(rental_id: int, action_id: int):
    return BareMetalPowerAction.objects.filter(
        pk=action_id, state__in=[State.DONE, State.FAILED]
    ).first()


def _never_names_the_bmc(text: str, bmc) -> None:
    for secret in (bmc.url, "127.0.0.1", bmc.username, bmc.password, "bmc_address", "password"):
        assert secret not in text, f"{secret!r} shown to the tenant"


@pytest.mark.django_db(transaction=True)
def test_a_tenant_switches_its_machine_off_on_and_resets_it_through_a_worker(
    rental, member_api, workers, machine
):
    worker = workers(BMC_CREDENTIAL_KEYS=TEST_KEY)
    for action, power in (("off", "off"), ("on", "on"), ("reset", "on")):
        response = _power(member_api, rental, action)
        assert response.status_code == 202, response.content
        asked = response.json()["power_action"]
        assert (asked["action"], asked["state"]) == (action, "queued")

        done = wait_for(
            lambda asked=asked: _finished(rental.pk, asked["id"]),
            timeout=90,
            what=f"power {action} to finish",
            log=worker.log,
        )

        assert done.state == State.DONE, (done.message, done.bmc_error)
        body = member_api.get(f"/api/bare-metal/{rental.pk}/").json()
        assert body["power_state"] == power
        assert body["power_action"]["state"] == "done"
        assert body["power_action"]["message"].startswith(f"the machine is {power} (")
        _never_names_the_bmc(str(body), machine)
    events = AuditEvent.objects.filter(verb__startswith="bare_metal.power")
    verbs = list(events.values_list("verb", flat=True))
    assert sorted(verbs) == sorted(["bare_metal.power", "bare_metal.power_done"] * 3)


def test_a_message_delivered_twice_asks_the_bmc_once(rental, member, monkeypatch):
    asked = []
    real = bare_metal_power.system_reset
    monkeypatch.setattr(
        bare_metal_power,
        "system_reset",
        lambda target, reset: (asked.append(reset), real(target, reset)),
    )
    power = bare_metal_power.bare_metal_power(rental=rental, action="on", actor=member)

    bare_metal_power.power_send(action_id=power.pk)
    bare_metal_power.power_send(action_id=power.pk)

    assert asked == ["on"]
    power.refresh_from_db()
    assert power.state == State.SENT and "accepted it at" in power.message


def test_one_action_at_a_time_and_one_a_lost_worker_left_is_given_up(rental, member):
    first = bare_metal_power.bare_metal_power(rental=rental, action="off", actor=member)
    with pytest.raises(Conflict) as caught:
        bare_metal_power.bare_metal_power(rental=rental, action="on", actor=member)
    assert caught.value.code == "power_under_way"
    assert "power off asked at" in caught.value.message

    later = first.requested_at + timedelta(seconds=bare_metal_power.POWER_STALE_SECONDS)
    second = bare_metal_power.bare_metal_power(rental=rental, action="on", actor=member, now=later)

    first.refresh_from_db()
    assert first.state == State.FAILED and "lost track of it" in first.message
    assert second.state == State.QUEUED


def test_a_machine_that_does_not_follow_by_the_deadline_fails_the_action(
    fleet_east, tenant, operator, member, gpu_server_bmc
):
    """The static emulator's machine is On whatever it is asked: an accepted power off is read
    again until ``POWER_SETTLE_SECONDS``, then failed with what was seen."""
    bmc = type("Bmc", (), {"url": gpu_server_bmc.url, "username": "a", "password": "b"})
    node = dedicated(fleet_east["nodes"]["a100-001"], tenant, bmc=bmc, operator=operator)
    rental = rent(node, tenant, actor=operator)
    power = bare_metal_power.bare_metal_power(rental=rental, action="off", actor=member)
    sent_at = timezone.now()
    BareMetalPowerAction.objects.filter(pk=power.pk).update(state=State.SENT, sent_at=sent_at)

    assert bare_metal_power.power_read(rental_id=rental.pk, action_id=power.pk, now=sent_at)
    late = sent_at + timedelta(seconds=bare_metal_power.POWER_SETTLE_SECONDS)
    assert not bare_metal_power.power_read(rental_id=rental.pk, action_id=power.pk, now=late)

    power.refresh_from_db()
    rental.refresh_from_db()
    assert (rental.power_state, rental.power_read_at) == ("on", late)
    assert power.state == State.FAILED
    assert power.message == (
        f"the management controller accepted it at {sent_at:%H:%M:%S} UTC, but the machine's "
        f"power was still on at {late:%H:%M:%S} UTC"
    )


@pytest.mark.parametrize(
    ("bmc_of", "words"),
    [
        ("refusing", "gpucap could not log in to the machine's management controller"),
        ("nothing", "the machine's management controller did not answer"),
    ],
)
def test_a_bmc_that_refuses_or_does_not_answer_is_reported_in_the_tenant_s_words(
    fleet_east, tenant, operator, member, member_api, bmc_of, words
):
    with RefusingBmc() as refusing:
        address = refusing.url if bmc_of == "refusing" else f"http://127.0.0.1:{free_port()}"
        node = fleet.node_update(node=fleet_east["nodes"]["a100-001"], bmc_address=address)
        machine = type("Bmc", (), {"url": address, "username": "admin", "password": "s3cret!"})
        node = dedicated(node, tenant, bmc=machine, operator=operator)
        rental = rent(node, tenant, actor=operator)
        power = bare_metal_power.bare_metal_power(rental=rental, action="off", actor=member)

        bare_metal_power.power_send(action_id=power.pk)

    power.refresh_from_db()
    assert power.state == State.FAILED
    assert power.message.startswith(words)
    assert address in power.bmc_error  # the operators' words name it
    body = member_api.get(f"/api/bare-metal/{rental.pk}/").json()
    assert body["power_action"]["state"] == "failed"
    assert "bmc_error" not in body["power_action"]
    _never_names_the_bmc(str(body), machine)
    event = AuditEvent.objects.get(verb="bare_metal.power_failed")
    assert address not in event.message


def test_an_ended_rental_is_not_switched(rental, member, operator):
    from gpucap.bmc.bare_metal import bare_metal_end

    power = bare_metal_power.bare_metal_power(rental=rental, action="off", actor=member)
    bare_metal_end(rental=rental, actor=operator, now=timezone.now())

    bare_metal_power.power_send(action_id=power.pk)

    power.refresh_from_db()
    assert (power.state, power.message) == (State.FAILED, "the rental ended before it was sent")
    with pytest.raises(Conflict) as caught:
        bare_metal_power.bare_metal_power(rental=rental, action="on", actor=member)
    assert caught.value.code == "rental_ended"
