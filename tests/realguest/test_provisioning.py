"""Provisioning by virtual media on a real machine: the rig's QEMU domain behind ``LibvirtBmc``
(sushy-emulator's libvirt driver), an installer ISO built here and served over HTTP on
loopback. The BMC fetches the image and libvirt attaches it to the domain as a read-only CD-ROM
first in the boot order; the reset restarts the domain with the disc in it; the image is
ejected at the end.

The first run steps in this process with the hypervisor check put in (the guest's console says
it came up again), so it reaches done. The second runs as production does: started through the
API, stepped by a real Celery worker and beat, with nothing answering for the node's hypervisor
(its cluster's libvirt URI leads nowhere), so it ends at its deadline saying what happened."""

import re
import xml.etree.ElementTree as ET

import libvirt
import pytest

from gpucap.bmc import provisioning as runs
from gpucap.bmc import tasks
from gpucap.bmc.models import Provisioning
from gpucap.bmc.services import bmc_credential_set
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster
from tests.bmc.media import ImageServer, tiny_iso
from tests.realguest import rig
from tests.rentals import conftest as rentals_fixtures

celery_queue = rentals_fixtures.celery_queue
workers = rentals_fixtures.workers

KEY = "dGVzdHMtb25seS1ibWMta2V5LTMyLWJ5dGVzLWxvbmc="
TIMEOUT = 180  # QEMU emulation on a loaded 2-core machine: generous
CLOCK = r"\d\d:\d\d UTC"
State = Provisioning.State


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    directory = tmp_path_factory.mktemp("images")
    tiny_iso(directory / "installer.iso")
    with ImageServer(directory) as server:
        yield server


@pytest.fixture
def machine(bare_metal_server, settings, operator):
    """The rig's machine as a cordoned node of a libvirt cluster whose hypervisor URI leads
    nowhere, with the emulator as its BMC."""
    settings.BMC_CREDENTIAL_KEYS = [KEY]
    server = bare_metal_server
    cluster = fleet.cluster_create(
        name="metal",
        driver=Cluster.Driver.LIBVIRT,
        driver_settings={"uri": "qemu:///system?socket=/nonexistent/gpucap/libvirt-sock"},
    )
    node = fleet.node_create(
        cluster=cluster,
        hostname=server.name,
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
        gpu_count=8,
        bmc_address=server.bmc.url,
    )
    bmc_credential_set(node=node, username=server.bmc.username, password=server.bmc.password)
    fleet.node_cordon(node=node, actor=operator)
    rig.wait_until(
        lambda: server.domain_state() == libvirt.VIR_DOMAIN_RUNNING, timeout=TIMEOUT, what="on"
    )
    rig.wait_until(lambda: server.boots() >= 1, timeout=TIMEOUT, what="the guest to boot")
    return server, node


def _cdroms(domain: ET.Element) -> list[ET.Element]:
    return domain.findall("./devices/disk[@device='cdrom']")


def _resets(server) -> int:
    return server.bmc.log().count("Actions/ComputerSystem.Reset HTTP")


@pytest.mark.django_db
def test_the_image_is_attached_the_machine_boots_from_it_and_it_is_ejected(
    machine, images, operator, monkeypatch
):
    server, node = machine
    boots, domain_id = server.boots(), server.domain_id()
    monkeypatch.setattr(runs, "hypervisor_check", lambda node: server.boots() > boots)
    run = runs.provisioning_start(
        node=node, image_url=images.url_of("installer.iso"), actor=operator
    )

    assert tasks.provision_step(run.pk) == State.WAITING

    # libvirt holds the image the BMC fetched, as a read-only CD-ROM first in the boot order,
    # in the domain's definition and in the QEMU process the reset started.
    assert images.fetched == ["/installer.iso"]
    (cdrom,) = _cdroms(server.domain_xml())
    source = cdrom.find("source").get("file")
    assert server.uuid in source
    with open(source, "rb") as attached:
        assert attached.read() == (images.directory / "installer.iso").read_bytes()
    assert cdrom.find("readonly") is not None
    assert cdrom.find("boot").get("order") == "1"
    assert server.domain_xml().find("./os/boot") is None  # no other boot order left
    assert server.domain_id() not in (domain_id, -1)  # a new QEMU process: reset for real
    live = _cdroms(server.domain_xml(live=True))
    assert [disk.find("source").get("file") for disk in live] == [source]

    rig.wait_until(
        lambda: tasks.provision_step(run.pk) == State.DONE,
        timeout=TIMEOUT,
        what="the run to be done",
        every=1,
    )

    run.refresh_from_db()
    assert re.fullmatch(
        rf"booted from the image: its hypervisor answered at {CLOCK}; the image was still "
        "inserted and is ejected now",
        run.message,
    )
    assert _cdroms(server.domain_xml()) == []
    assert server.domain_state() == libvirt.VIR_DOMAIN_RUNNING
    assert _resets(server) == 1


@pytest.mark.django_db(transaction=True)
def test_a_machine_whose_hypervisor_never_answers_fails_at_its_deadline_saying_so(
    machine, images, operator_api, workers, settings
):
    server, node = machine
    settings.PROVISION_TIMEOUT_SECONDS = 45
    environment = {"BMC_CREDENTIAL_KEYS": KEY, "PROVISION_POLL_SECONDS": "1"}
    worker = workers(**environment)
    workers(beat=True, **environment)
    resets, domain_id = _resets(server), server.domain_id()

    started = operator_api.post(
        f"/api/nodes/{node.pk}/provisioning/",
        {"image_url": images.url_of("installer.iso")},
        format="json",
    )
    assert started.status_code == 201, started.content
    url = f"/api/nodes/{node.pk}/provisioning/"

    rig.wait_until(
        lambda: operator_api.get(url).json()["runs"][0]["state"] == State.WAITING,
        timeout=TIMEOUT,
        what=f"the reset\n{worker.log()}",
    )
    assert len(_cdroms(server.domain_xml())) == 1
    run = rig.wait_until(
        lambda: (run := operator_api.get(url).json()["runs"][0])["state"] == State.FAILED and run,
        timeout=TIMEOUT,
        what=f"the deadline\n{worker.log()}",
    )

    assert re.fullmatch(
        rf"the BMC accepted the image and the machine was reset at {CLOCK}, but its hypervisor "
        rf"has not answered by {CLOCK}; power is On; the image was still inserted and is "
        "ejected now",
        run["message"],
    ), run["message"]
    assert [step["status"] for step in run["steps"]] == ["done", "done", "failed", "failed"]
    assert _cdroms(server.domain_xml()) == []
    # Beat sent a step every second while the first one inserted and reset: one reset all the same.
    assert _resets(server) == resets + 1
    assert server.domain_id() not in (domain_id, -1)
