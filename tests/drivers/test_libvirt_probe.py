"""The libvirt driver's hypervisor probe (docs/bmc.md, Recovery): the node's libvirt asked for
its version, within ``probe_timeout_seconds``. libvirt's test hypervisor answers; a port nobody
listens on does not; nor does a socket that takes the connection and never says a word, which
costs the probe its timeout and no more."""

import socket

import pytest

from gpucap.drivers import libvirt_host
from gpucap.drivers.base import DriverError
from gpucap.drivers.libvirt import LibvirtDriver
from tests.bmc.emulators import free_port
from tests.drivers.conftest import LIBVIRT_TEST_SETTINGS


@pytest.fixture
def mute_listener():
    """A TCP socket on loopback that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


def driver(uri: str, **settings) -> LibvirtDriver:
    return LibvirtDriver({**LIBVIRT_TEST_SETTINGS, "uri": uri, **settings})


def test_a_hypervisor_that_answers_is_seen_to(hypervisor):
    assert hypervisor.hypervisor_answers("h100-001") is True
    # And again, over the connection the driver keeps.
    assert hypervisor.hypervisor_answers("h100-001") is True


def test_a_hypervisor_nobody_listens_for_does_not_answer():
    port = free_port()

    assert driver(f"qemu+tcp://127.0.0.1:{port}/system").hypervisor_answers("h100-001") is False


def test_a_hypervisor_that_never_says_a_word_does_not_answer_within_the_timeout(mute_listener):
    uri = f"qemu+tcp://127.0.0.1:{mute_listener}/system"

    assert driver(uri, probe_timeout_seconds=0.5).hypervisor_answers("h100-001") is False
    # The connection the probe hung on is not handed to the next caller.
    assert uri not in libvirt_host._connections


def test_a_node_template_names_the_node_probed():
    answering = driver("test:///{node}")

    # test:///default is libvirt's test hypervisor; test:///elsewhere names no such file.
    assert answering.hypervisor_answers("default") is True
    assert answering.hypervisor_answers("elsewhere") is False


def test_the_probe_timeout_is_checked_by_name():
    with pytest.raises(DriverError, match=r"probe_timeout_seconds: must be at least 0\.1"):
        driver("test:///default", probe_timeout_seconds=0)
