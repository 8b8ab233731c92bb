"""Post-commit side effects cannot swallow each other (gpucap.tasks.on_commit): a hook that
fails after its transaction committed is logged and counted, the hooks after it still run, the
API answers for the change it committed, and a VM's driver task goes first."""

import pytest
import redis
from django.db import transaction
from kombu.exceptions import OperationalError

from gpucap import metrics
from gpucap.celery import app
from gpucap.rentals import services
from gpucap.rentals.models import VirtualMachine

pytestmark = pytest.mark.django_db(transaction=True)

State = VirtualMachine.State


@pytest.fixture
def after_commit(monkeypatch):
    """What happens after commit, in order: ``("send", task, args)`` for each task sent,
    ``("publish", vm ids)`` for each metadata publish tried, ``("failed", hook)`` for each
    failure counted. ``after_commit.refuse`` names tasks the broker refuses;
    ``after_commit.publish_fails`` makes the metadata store refuse every publish."""

    class Record(list):
        refuse: set = set()
        publish_fails = False

    record = Record()

    def send_task(name, args=None, **options):
        if name in record.refuse:
            raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        record.append(("send", name, list(args or [])))

    def publish(vm_ids):
        record.append(("publish", sorted(vm_ids)))
        if record.publish_fails:
            raise redis.ConnectionError("metadata store unreachable")

    monkeypatch.setattr(app, "send_task", send_task)
    monkeypatch.setattr("gpucap.notices.cache.metadata_publish_many", publish)
    monkeypatch.setattr(
        metrics, "shared_count", lambda counter, **labels: record.append(("failed", labels))
    )
    return record


def stop_of(vm):
    return ("send", "rentals.vm_stop", [vm.pk])


def test_a_failing_metadata_publish_still_sends_the_stop_first_and_the_api_answers(
    vm_in, member_api, after_commit
):
    vm = vm_in("running")
    after_commit.clear()
    after_commit.publish_fails = True

    response = member_api.post(f"/api/vms/{vm.pk}/stop/")

    assert response.status_code == 202, response.content
    assert response.json()["state"] == State.STOPPING
    assert VirtualMachine.objects.get(pk=vm.pk).state == State.STOPPING
    # The driver task went first, then the publish was tried, failed and was counted.
    assert after_commit[:3] == [
        stop_of(vm),
        ("publish", [vm.pk]),
        ("failed", {"hook": "metadata cache flush"}),
    ]


def test_a_task_the_broker_refuses_is_counted_and_the_api_answers_for_what_it_committed(
    vm_in, member_api, after_commit
):
    vm = vm_in("running")
    after_commit.clear()
    after_commit.refuse = {"rentals.vm_stop"}

    response = member_api.post(f"/api/vms/{vm.pk}/stop/")

    assert response.status_code == 202, response.content
    assert VirtualMachine.objects.get(pk=vm.pk).state == State.STOPPING
    assert ("failed", {"hook": "send rentals.vm_stop"}) in after_commit
    # The hooks after the refused one ran: the guest's metadata document was published.
    assert ("publish", [vm.pk]) in after_commit


def test_one_failing_hook_does_not_swallow_the_next_vms_stop(vm_in, after_commit):
    first = vm_in("running", gpus=(0,))
    second = vm_in("running", gpus=(1,))
    after_commit.clear()
    after_commit.publish_fails = True

    with transaction.atomic():
        services.vm_stop(vm=first)
        services.vm_stop(vm=second)

    sends = [entry for entry in after_commit if entry[0] == "send"]
    assert sends == [stop_of(first), stop_of(second)]
    # Both driver tasks went before the one (failing) metadata flush of the transaction.
    assert after_commit.index(stop_of(second)) < after_commit.index(
        ("publish", sorted([first.pk, second.pk]))
    )
