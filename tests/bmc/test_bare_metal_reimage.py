"""A tenant re-images its machine rented whole from the cluster's catalogue
(gpucap/bmc/bare_metal.py, ``bare_metal_reimage``): a provisioning run of the rental against
sushy-emulator's fake system, which fetches the image from the image server the test runs on
loopback. No hypervisor is waited for: the image stays in the drive for the installer until
the deadline, then the run is done and the image ejected. The tenant reads how far it got in
its words, never the BMC's address nor the image's URL; refusals say why and change nothing."""

import re
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError

from gpucap.audit.models import AuditEvent
from gpucap.bmc import bare_metal, bare_metal_power
from gpucap.bmc import provisioning as runs
from gpucap.bmc.models import BareMetalRental, Provisioning
from gpucap.bmc.services import bmc_target
from gpucap.bmc.vmedia import boot_override_read, virtual_media_eject, virtual_media_read
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from tests.bmc.bare_metal_helpers import catalogue_image, dedicated, rent
from tests.bmc.emulators import DynamicBmc
from tests.bmc.media import ImageServer, tiny_iso

State = Provisioning.State
CLOCK = r"\d\d:\d\d UTC"


@pytest.fixture(scope="module")
def emulator():
    with DynamicBmc() as bmc:
        yield bmc


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    directory = tmp_path_factory.mktemp("images")
    tiny_iso(directory / "ubuntu-24.04-live-server.iso")
    with ImageServer(directory) as server:
        yield server


@pytest.fixture
def rental(fleet_east, tenant, operator, emulator) -> BareMetalRental:
    node = dedicated(fleet_east["nodes"]["a100-001"], tenant, bmc=emulator, operator=operator)
    virtual_media_eject(bmc_target(node))
    return rent(node, tenant, actor=operator)


@pytest.fixture
def image(fleet_east, images):
    return catalogue_image(
        fleet_east["cluster"], image_url=images.url_of("ubuntu-24.04-live-server.iso")
    )


def test_the_image_stays_for_the_installer_until_the_deadline_then_the_run_is_done(
    rental, image, member, member_api, images, emulator
):
    run = bare_metal.bare_metal_reimage(rental=rental, image=image, actor=member)

    assert (run.bare_metal_rental_id, run.image_url, run.requested_by) == (
        rental.pk,
        image.image_url,
        member,
    )
    assert BareMetalRental.objects.get(pk=rental.pk).image == image
    event = AuditEvent.objects.get(verb="bare_metal.reimage")
    assert (event.actor, event.after) == (member, {"image": "ubuntu-24.04-server"})

    step = runs.provisioning_advance(run.pk)

    assert (step.state, step.waiting) == (State.WAITING, True)
    target = bmc_target(rental.node)
    assert virtual_media_read(target).image == image.image_url
    assert boot_override_read(target).target == "Cd"
    assert runs.provisioning_advance(run.pk).state == State.WAITING  # the installer has it
    body = member_api.get(f"/api/bare-metal/{rental.pk}/").json()["reimage"]
    assert body["state"] == "waiting"
    assert body["words"].startswith("installing: the machine booted from ubuntu-24.04-server;")

    past = run.started_at + timedelta(microseconds=1)  # the deadline has passed
    Provisioning.objects.filter(pk=run.pk).update(deadline=past)
    step = runs.provisioning_advance(run.pk)

    run.refresh_from_db()
    assert step.state == State.DONE
    assert re.fullmatch(
        rf"the machine was reset to boot from the image at {CLOCK}; the image stayed in its "
        rf"drive for the installer until {CLOCK}; the image was still inserted and is ejected now",
        run.message,
    )
    assert virtual_media_read(target).inserted is False
    body = member_api.get(f"/api/bare-metal/{rental.pk}/").json()["reimage"]
    assert body["state"] == "done" and body["words"].startswith("done: the machine was reset")
    assert images.url not in str(body) and emulator.url not in str(body)


def test_a_run_that_fails_is_told_without_the_bmc_s_address_or_the_image_s_url(
    rental, fleet_east, member, member_api, images, emulator
):
    missing = catalogue_image(
        fleet_east["cluster"], name="missing", image_url=images.url_of("no-such.iso")
    )
    run = bare_metal.bare_metal_reimage(rental=rental, image=missing, actor=member)

    runs.provisioning_advance(run.pk)

    run.refresh_from_db()
    assert run.state == State.FAILED and emulator.url in run.message  # the operators' words
    body = member_api.get(f"/api/bare-metal/{rental.pk}/").json()["reimage"]
    assert body["words"] == (
        "failed: node a100-001: the machine's management controller refused "
        "VirtualMedia.InsertMedia (HTTP 400: Cannot download virtual media: got error 404 from "
        "the server)"
    )
    text = member_api.get(f"/api/bare-metal/{rental.pk}/").content.decode()
    assert "127.0.0.1" not in text and "no-such.iso" not in text


def test_a_bad_image_is_a_400_naming_image(rental, member):
    west = fleet.cluster_create(name="west")
    for image, words in (
        (catalogue_image(west, name="elsewhere"), "is in the catalogue of cluster west"),
        (catalogue_image(rental.node.cluster, name="old", enabled=False), "is disabled"),
    ):
        with pytest.raises(ValidationError) as caught:
            bare_metal.bare_metal_reimage(rental=rental, image=image, actor=member)
        assert words in caught.value.message_dict["image"][0]
    assert not Provisioning.objects.exists()


def test_one_thing_at_a_time_on_a_machine(rental, image, member, operator):
    power = bare_metal_power.bare_metal_power(rental=rental, action="off", actor=member)
    with pytest.raises(Conflict) as caught:
        bare_metal.bare_metal_reimage(rental=rental, image=image, actor=member)
    assert caught.value.code == "power_under_way"
    bare_metal_power._finish(power, "done", message="the machine is off")

    run = bare_metal.bare_metal_reimage(rental=rental, image=image, actor=member)

    with pytest.raises(Conflict) as caught:
        bare_metal.bare_metal_reimage(rental=rental, image=image, actor=member)
    assert caught.value.code == "reimage_under_way"
    assert "a re-image of a100-001 started at" in caught.value.message
    # While the image goes in and the machine is reset, the tenant's power waits.
    with pytest.raises(Conflict) as caught:
        bare_metal_power.bare_metal_power(rental=rental, action="reset", actor=member)
    assert caught.value.code == "reimage_under_way"
    Provisioning.objects.filter(pk=run.pk).update(state=State.WAITING)
    bare_metal_power.bare_metal_power(rental=rental, action="reset", actor=member)

    bare_metal.bare_metal_end(rental=rental, actor=operator)
    with pytest.raises(Conflict) as caught:
        bare_metal.bare_metal_reimage(rental=rental, image=image, actor=member)
    assert caught.value.code == "rental_ended"
    assert Provisioning.objects.count() == 1
