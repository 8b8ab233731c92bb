"""Provisioning by virtual media, the services (gpucap/bmc/provisioning.py): who may start a
run, and each step against sushy-emulator's fake system, which fetches the image from the image
server the test runs on loopback. The same run on a real QEMU domain, with a real worker, is
tests/realguest/test_provisioning.py."""

import re
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connections
from django.utils import timezone

from gpucap import locks
from gpucap.audit.models import AuditEvent
from gpucap.bmc import provisioning as runs
from gpucap.bmc import redfish, tasks
from gpucap.bmc.models import Provisioning
from gpucap.bmc.redfish import BmcError
from gpucap.bmc.services import bmc_credential_set, bmc_target
from gpucap.bmc.vmedia import boot_override_read, virtual_media_eject, virtual_media_read
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster, Node
from tests.bmc.emulators import DynamicBmc, free_port
from tests.bmc.media import ImageServer, tiny_iso
from tests.rentals.vm_helpers import grant_pools, running_vm

State = Provisioning.State
CLOCK = r"\d\d:\d\d UTC"


@pytest.fixture(scope="module")
def emulator():
    with DynamicBmc() as bmc:
        yield bmc


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    directory = tmp_path_factory.mktemp("images")
    tiny_iso(directory / "installer.iso")
    with ImageServer(directory) as server:
        yield server


@pytest.fixture
def node(db, emulator, operator):
    """A cordoned node whose BMC is the emulator, its drive empty."""
    cluster = fleet.cluster_create(name="east", driver=Cluster.Driver.SIMULATED)
    node = fleet.node_create(
        cluster=cluster,
        hostname="h100-001",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
        gpu_count=8,
        bmc_address=emulator.url,
    )
    bmc_credential_set(node=node, username=emulator.username, password=emulator.password)
    node = fleet.node_cordon(node=node, actor=operator)
    virtual_media_eject(bmc_target(node))
    return node


@pytest.fixture
def answers(monkeypatch):
    """The node's hypervisor, as the waiting step asks it: silent until told to answer."""
    state = {"up": False}
    monkeypatch.setattr(runs, "hypervisor_check", lambda node: state["up"])
    return state


def _resets(emulator) -> int:
    return emulator.log().count("Actions/ComputerSystem.Reset HTTP")


def _run(node, images, operator) -> Provisioning:
    return runs.provisioning_start(
        node=node, image_url=images.url_of("installer.iso"), actor=operator
    )


# --- starting ------------------------------------------------------------------------------------


def test_a_run_starts_on_a_cordoned_node_audited(node, images, operator):
    run = _run(node, images, operator)

    assert run.state == State.INSERTING
    assert run.requested_by == operator
    assert run.deadline == run.started_at + timedelta(seconds=3600)
    event = AuditEvent.objects.get(verb="bmc.provision")
    assert (event.actor, event.object_id) == (operator, str(node.pk))
    assert event.after["image_url"] == images.url_of("installer.iso")


@pytest.mark.parametrize(
    ("image_url", "reason"),
    [
        ("", "is required"),
        ("ftp://images.example/a.iso", "must be an http:// or https:// URL"),
        ("installer.iso", "must be an http:// or https:// URL"),
        ("http://images.example/a\u202e.iso", "bidirectional"),
    ],
)
def test_an_image_url_that_is_no_web_address_is_refused_naming_the_field(
    node, operator, image_url, reason
):
    with pytest.raises(ValidationError) as caught:
        runs.provisioning_start(node=node, image_url=image_url, actor=operator)

    assert reason in caught.value.message_dict["image_url"][0]
    assert not Provisioning.objects.exists()


def test_a_node_in_service_is_refused(node, images, operator):
    fleet.node_uncordon(node=node, actor=operator)

    with pytest.raises(Conflict) as caught:
        _run(node, images, operator)

    assert caught.value.message == (
        "node h100-001 is ready: provisioning boots it from another image, so only a cordoned "
        "or down node is provisioned; cordon or drain it first"
    )


def test_a_node_whose_gpus_vms_hold_is_refused(fleet_east, tenant, other_tenant, operator):
    pools = grant_pools(fleet_east, tenant, other_tenant)
    node = fleet_east["nodes"]["h100-001"]
    running_vm(tenant, pools["h100-spot"], node, [0, 1], name="train-1", ip="10.0.0.9")
    node = fleet.node_cordon(node=Node.objects.get(pk=node.pk), actor=operator)

    with pytest.raises(Conflict) as caught:
        runs.provisioning_start(node=node, image_url="http://images.example/a.iso", actor=operator)

    assert caught.value.message == (
        "node h100-001: 1 VM still hold its GPUs (train-1); drain the node first"
    )


def test_a_node_without_bmc_credentials_is_refused(fleet_east, operator):
    node = fleet.node_cordon(node=fleet_east["nodes"]["a100-001"], actor=operator)

    with pytest.raises(Conflict) as caught:
        runs.provisioning_start(node=node, image_url="http://images.example/a.iso", actor=operator)

    assert caught.value.message == "node a100-001 has no BMC address"


def test_one_run_at_a_time(node, images, operator):
    _run(node, images, operator)

    with pytest.raises(Conflict) as caught:
        _run(node, images, operator)

    assert re.fullmatch(
        rf"node h100-001 is being provisioned already, from {images.url}/installer.iso "
        rf"\(started {CLOCK}, inserting the image\)",
        caught.value.message,
    )
    assert Provisioning.objects.count() == 1


# --- the steps -----------------------------------------------------------------------------------


def test_a_run_inserts_boots_resets_and_is_done_once_the_hypervisor_answers(
    node, images, operator, emulator, answers
):
    run = _run(node, images, operator)
    resets = _resets(emulator)

    step = runs.provisioning_advance(run.pk)

    run.refresh_from_db()
    assert (step.state, step.waiting) == (State.WAITING, True)
    assert run.inserted_at and run.reset_at and run.reset_type == "ForceRestart"
    target = bmc_target(node)
    assert virtual_media_read(target).image == images.url_of("installer.iso")
    assert boot_override_read(target).target == "Cd"
    assert _resets(emulator) == resets + 1

    assert runs.provisioning_advance(run.pk).state == State.WAITING  # nobody answers yet
    answers["up"] = True
    step = runs.provisioning_advance(run.pk)

    run.refresh_from_db()
    assert (step.state, step.waiting) == (State.DONE, False)
    assert run.finished_at and run.answered_at
    assert re.fullmatch(
        rf"booted from the image: its hypervisor answered at {CLOCK}; the image was still "
        "inserted and is ejected now",
        run.message,
    )
    assert virtual_media_read(target).inserted is False
    assert _resets(emulator) == resets + 1
    assert AuditEvent.objects.filter(verb="bmc.provision_done", actor=None).count() == 1


def test_steps_run_again_never_reset_twice(node, images, operator, emulator, answers):
    run = _run(node, images, operator)
    resets = _resets(emulator)

    for _ in range(3):
        runs.provisioning_advance(run.pk)

    assert _resets(emulator) == resets + 1


def test_a_reset_claimed_by_a_step_that_died_is_not_asked_again(node, images, operator, emulator):
    run = _run(node, images, operator)
    Provisioning.objects.filter(pk=run.pk).update(
        state=State.BOOTING, inserted_at=timezone.now(), reset_at=timezone.now()
    )
    resets = _resets(emulator)

    step = runs.provisioning_advance(run.pk)

    assert step.state == State.WAITING
    assert _resets(emulator) == resets


def test_the_timeout_says_what_happened(node, images, operator, answers):
    """(The fake system's power goes Off and back On some seconds after a reset.)"""
    run = _run(node, images, operator)
    runs.provisioning_advance(run.pk)
    Provisioning.objects.filter(pk=run.pk).update(deadline=timezone.now())

    step = runs.provisioning_advance(run.pk)

    run.refresh_from_db()
    assert step.state == State.FAILED
    assert re.fullmatch(
        rf"the BMC accepted the image and the machine was reset at {CLOCK}, but its hypervisor "
        rf"has not answered by {CLOCK}; power is (On|Off); the image was still inserted and is "
        "ejected now",
        run.message,
    ), run.message
    assert virtual_media_read(bmc_target(node)).inserted is False
    event = AuditEvent.objects.get(verb="bmc.provision_failed")
    assert event.message == run.message


def test_an_image_the_bmc_cannot_fetch_fails_the_run_in_its_words(node, images, operator, emulator):
    run = runs.provisioning_start(node=node, image_url=images.url_of("no-such.iso"), actor=operator)
    resets = _resets(emulator)

    step = runs.provisioning_advance(run.pk)

    run.refresh_from_db()
    assert step.state == State.FAILED
    assert run.message == (
        f"node h100-001: the BMC at {emulator.url} refused VirtualMedia.InsertMedia (HTTP 400: "
        "Cannot download virtual media: got error 404 from the server)"
    )
    assert _resets(emulator) == resets


def test_a_bmc_that_does_not_answer_is_tried_again_until_the_deadline(node, images, operator):
    run = _run(node, images, operator)
    Node.objects.filter(pk=node.pk).update(bmc_address=f"http://127.0.0.1:{free_port()}")

    assert runs.provisioning_advance(run.pk).state == State.INSERTING
    run.refresh_from_db()
    assert run.message.startswith("retrying inserting the image: node h100-001: no answer")

    Provisioning.objects.filter(pk=run.pk).update(deadline=timezone.now())
    assert runs.provisioning_advance(run.pk).state == State.FAILED
    run.refresh_from_db()
    assert re.fullmatch(
        rf"the BMC did not take the image by {CLOCK} \(last: inserting the image: node h100-001: "
        r"no answer from the BMC at http://127.0.0.1:\d+ \(connection refused\)\); its power "
        r"could not be read \(.*\)",
        run.message,
    ), run.message


def test_a_step_that_finds_another_at_work_leaves_the_run_to_it(node, images, operator, emulator):
    """Two workers stepping one run: the second finds the run's lock taken and does nothing."""
    run = _run(node, images, operator)
    images.fetched.clear()
    key = locks.key(locks.PROVISIONING, run.pk)
    other = connections.create_connection("default")  # another worker's database session
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", key)

        assert tasks.provision_step(run.pk) is None

        assert Provisioning.objects.get(pk=run.pk).state == State.INSERTING
        assert images.fetched == []
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", key)
    finally:
        other.close()
    assert tasks.provision_step(run.pk) == State.WAITING


def test_a_refused_reset_ends_the_run_and_is_never_asked_again(
    node, images, operator, emulator, monkeypatch
):
    def refuse(target, reset):
        raise BmcError(
            f"{target.name}: the BMC at {target.url} refused ComputerSystem.Reset "
            "(HTTP 409: the system is in a firmware update)",
            kind=redfish.REFUSED,
        )

    monkeypatch.setattr(runs, "system_reset", refuse)
    run = _run(node, images, operator)

    step = runs.provisioning_advance(run.pk)
    runs.provisioning_advance(run.pk)

    run.refresh_from_db()
    assert step.state == State.FAILED
    assert run.message == (
        f"node h100-001: the BMC at {emulator.url} refused ComputerSystem.Reset (HTTP 409: the "
        "system is in a firmware update); the image was still inserted and is ejected now"
    )
    assert run.reset_at is not None
    assert virtual_media_read(bmc_target(node)).inserted is False
