"""The hypervisor probe by TCP (docs/drivers.md, "The hypervisor probe"): with ``probe_tcp_port``
set, a driver's ``hypervisor_answers(node)`` connects to ``probe_address`` (a template on
``{node}``) on that port instead of asking its hypervisor. A port that accepts answers; one
nobody listens on, a name that does not resolve, and an address that never takes the
connection do not, the last within ``probe_timeout_seconds``. The real-guest story
(tests/realguest/test_recovery_story.py) probes a QEMU guest booted, paused and booted again."""

import socket

import pytest

from gpucap.drivers.base import DriverError
from gpucap.drivers.libvirt import LibvirtDriver
from gpucap.drivers.registry import driver_settings_problem
from gpucap.drivers.tcp_probe import port_answers
from tests.bmc.emulators import free_port
from tests.drivers.conftest import LIBVIRT_TEST_SETTINGS


@pytest.fixture
def listener():
    """A TCP port on loopback that accepts connections (the kernel completes the handshake
    from the backlog; nothing is read)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


@pytest.fixture
def full_listener():
    """A TCP port on loopback whose backlog is full: a new connection's handshake is never
    completed, as a paused machine's is not."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(0)
        held = []
        try:
            for _ in range(4):  # fill the accept queue, whatever the kernel rounds 0 up to
                client = socket.socket()
                client.setblocking(False)
                client.connect_ex(sock.getsockname())
                held.append(client)
            yield sock.getsockname()[1]
        finally:
            for client in held:
                client.close()


def libvirt_probing(port: int, **settings) -> LibvirtDriver:
    # The libvirt URI names a port nobody listens on: only the TCP probe can answer.
    return LibvirtDriver(
        {
            **LIBVIRT_TEST_SETTINGS,
            "uri": f"qemu+tcp://127.0.0.1:{free_port()}/system",
            "probe_tcp_port": port,
            "probe_address": "127.0.0.1",
            **settings,
        }
    )


def test_a_node_accepting_on_the_port_answers_whatever_its_libvirt_says(listener):
    assert libvirt_probing(listener).hypervisor_answers("h100-001") is True


def test_a_port_nobody_listens_on_does_not_answer():
    assert libvirt_probing(free_port()).hypervisor_answers("h100-001") is False


def test_a_port_that_never_completes_the_handshake_does_not_answer_within_the_timeout(
    full_listener,
):
    assert port_answers("127.0.0.1", full_listener, timeout=0.5) is False


def test_the_address_template_names_the_node_probed(listener):
    driver = libvirt_probing(listener, probe_address="{node}")

    assert driver.hypervisor_answers("localhost") is True
    assert driver.hypervisor_answers("no-such-node.invalid") is False


def test_without_a_port_the_driver_asks_its_hypervisor_as_before():
    settings = {**LIBVIRT_TEST_SETTINGS, "probe_address": "127.0.0.1"}

    assert LibvirtDriver(settings).hypervisor_answers("h100-001") is True  # test:///default
    nowhere = {**settings, "uri": f"qemu+tcp://127.0.0.1:{free_port()}/system"}
    assert LibvirtDriver(nowhere).hypervisor_answers("h100-001") is False


def test_the_simulated_fleet_asks_the_port_instead_of_its_silence(simulated, listener):
    probing = simulated(probe_tcp_port=listener, probe_address="127.0.0.1")
    silenced = simulated()
    silenced.hypervisor_silence("h100-001")

    assert silenced.hypervisor_answers("h100-001") is False
    assert probing.hypervisor_answers("h100-001") is True  # the port answers
    assert simulated(probe_tcp_port=free_port()).hypervisor_answers("h100-002") is False


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"probe_tcp_port": 70000}, "probe_tcp_port: must be a TCP port (1 to 65535), or 0"),
        ({"probe_tcp_port": -1}, "probe_tcp_port: must be a TCP port (1 to 65535), or 0"),
        ({"probe_tcp_port": "22"}, "probe_tcp_port: must be a whole number, got '22'"),
        ({"probe_address": "{host}.mgmt"}, "probe_address: unknown placeholder {host}"),
        ({"probe_address": " "}, "probe_address: must not be empty"),
    ],
)
def test_probe_settings_are_checked_by_name_for_both_drivers(settings, problem):
    for driver, required in (("libvirt", {"uri": "test:///default"}), ("simulated", {})):
        assert problem in driver_settings_problem(driver, {**required, **settings})


def test_a_driver_with_a_wrong_probe_setting_is_not_built():
    with pytest.raises(DriverError, match=r"probe_tcp_port: must be a TCP port"):
        libvirt_probing(0, probe_tcp_port=65536)
