"""Virtual media in the client (gpucap/bmc/vmedia.py), against sushy-emulator's fake system,
which downloads what it is asked to insert from the image server the test runs on loopback,
and against the shipped mockup, whose CD drive is the Manager's. The libvirt emulator attaching
the image to a real domain is tests/realguest/test_provisioning.py."""

import json

import pytest

from gpucap.bmc import redfish
from gpucap.bmc.redfish import BmcError, BmcTarget
from gpucap.bmc.vmedia import (
    MediaState,
    boot_once_from_cd,
    boot_override_read,
    virtual_media_eject,
    virtual_media_insert,
    virtual_media_read,
)
from tests.bmc.emulators import DynamicBmc, StaticBmc, mockup_copy
from tests.bmc.media import ImageServer, tiny_iso


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    directory = tmp_path_factory.mktemp("images")
    tiny_iso(directory / "installer.iso")
    tiny_iso(directory / "other.iso", label="OTHER")
    with ImageServer(directory) as server:
        yield server


@pytest.fixture(scope="module")
def emulator():
    with DynamicBmc() as bmc:
        yield bmc


@pytest.fixture
def machine(emulator, images):
    """The emulator's system with an empty drive, and the image server's log cleared."""
    target = BmcTarget(
        name="node h100-001",
        address=emulator.url,
        username=emulator.username,
        password=emulator.password,
    )
    virtual_media_eject(target)
    images.fetched.clear()
    return target


def test_an_image_is_inserted_write_protected_and_read_back(machine, images):
    url = images.url_of("installer.iso")

    state = virtual_media_insert(machine, url)

    assert state == MediaState(drive="Cd", image=url, inserted=True, write_protected=True)
    assert virtual_media_read(machine) == state
    assert images.fetched == ["/installer.iso"]  # the BMC fetched it from the image server


def test_inserting_the_image_the_drive_holds_asks_nothing_again(machine, images):
    url = images.url_of("installer.iso")
    virtual_media_insert(machine, url)

    virtual_media_insert(machine, url)

    assert images.fetched == ["/installer.iso"]


def test_another_image_replaces_the_one_in_the_drive(machine, images):
    virtual_media_insert(machine, images.url_of("installer.iso"))

    state = virtual_media_insert(machine, images.url_of("other.iso"))

    assert state.image == images.url_of("other.iso")
    assert state.inserted


def test_eject_empties_the_drive_and_twice_is_harmless(machine, images):
    virtual_media_insert(machine, images.url_of("installer.iso"))

    state = virtual_media_eject(machine)
    again = virtual_media_eject(machine)

    assert state == again == MediaState(drive="Cd", image="", inserted=False, write_protected=False)
    assert virtual_media_read(machine).inserted is False


def test_the_next_boot_is_set_to_the_cd(machine):
    boot_once_from_cd(machine)

    # sushy-emulator keeps any override Continuous (it says so in its code); the target is ours.
    assert boot_override_read(machine).target == "Cd"


def test_an_image_the_bmc_cannot_fetch_is_refused_in_its_own_words(machine, images):
    with pytest.raises(BmcError) as caught:
        virtual_media_insert(machine, images.url_of("no-such.iso"))

    assert caught.value.kind == redfish.REFUSED
    assert caught.value.message == (
        f"node h100-001: the BMC at {machine.url} refused VirtualMedia.InsertMedia "
        "(HTTP 400: Cannot download virtual media: got error 404 from the server)"
    )
    assert virtual_media_read(machine).inserted is False


def test_a_wrong_password_is_refused_naming_the_node(emulator, images):
    wrong = BmcTarget(name="node h100-001", address=emulator.url, username="admin", password="x")
    images.fetched.clear()

    with pytest.raises(BmcError) as caught:
        virtual_media_insert(wrong, images.url_of("installer.iso"))

    assert caught.value.kind == redfish.CREDENTIALS
    assert caught.value.message.startswith("node h100-001: the BMC at")
    assert images.fetched == []


def test_the_drive_is_the_manager_s(gpu_server_bmc):
    target = BmcTarget(name="node h100-001", address=gpu_server_bmc.url, username="a", password="b")

    assert virtual_media_read(target) == MediaState(
        drive="Cd", image="", inserted=False, write_protected=True
    )


def test_a_bmc_without_a_cd_drive_is_named(tmp_path):
    mockup = mockup_copy(tmp_path / "gpu-server")
    path = mockup / "Managers" / "1" / "index.json"
    manager = json.loads(path.read_text())
    del manager["VirtualMedia"]
    path.write_text(json.dumps(manager))

    with StaticBmc(mockup) as bmc:
        target = BmcTarget(name="node h100-001", address=bmc.url, username="a", password="b")
        with pytest.raises(BmcError) as caught:
            virtual_media_insert(target, "http://images.example/installer.iso")

    assert caught.value.kind == redfish.INVENTORY
    assert caught.value.message == (
        f"node h100-001: the BMC at {bmc.url} has no CD/DVD virtual media drive"
    )
