"""A machine's power through its BMC, for real: sushy-emulator's libvirt driver over the rig's
libvirtd (``LibvirtBmc``), so the ComputerSystem is a QEMU domain and a reset is libvirt's
destroy and start. What libvirt says of the domain is the truth each test checks against."""

import libvirt
import pytest

from gpucap.bmc import redfish
from gpucap.bmc.power import power_state_read, system_reset
from gpucap.bmc.redfish import BmcError, BmcTarget, inventory_read
from tests.realguest import rig

TIMEOUT = 120  # generous: QEMU emulation on a loaded 2-core machine


def _domain_becomes(server, state: int) -> None:
    rig.wait_until(
        lambda: server.domain_state() == state, timeout=TIMEOUT, what=f"domain state {state}"
    )


def test_the_power_state_read_is_the_domain_s(bare_metal_server):
    server = bare_metal_server
    _domain_becomes(server, libvirt.VIR_DOMAIN_RUNNING)

    assert power_state_read(server.target) == "on"
    machine = inventory_read(server.target)
    assert machine.uuid == server.uuid
    assert machine.power_state == "on"


def test_force_off_stops_the_domain_and_on_starts_it(bare_metal_server):
    server = bare_metal_server

    system_reset(server.target, "force_off")
    _domain_becomes(server, libvirt.VIR_DOMAIN_SHUTOFF)
    assert power_state_read(server.target) == "off"

    system_reset(server.target, "on")
    _domain_becomes(server, libvirt.VIR_DOMAIN_RUNNING)
    assert power_state_read(server.target) == "on"


def test_force_restart_restarts_the_domain(bare_metal_server):
    server = bare_metal_server
    _domain_becomes(server, libvirt.VIR_DOMAIN_RUNNING)
    rig.wait_until(lambda: server.boots() >= 1, timeout=TIMEOUT, what="the guest to boot")
    before, boots = server.domain_id(), server.boots()

    system_reset(server.target, "force_restart")

    # A new domain id is a new QEMU process; the guest comes up again in it.
    rig.wait_until(
        lambda: server.domain_id() not in (before, -1), timeout=TIMEOUT, what="a restart"
    )
    rig.wait_until(lambda: server.boots() > boots, timeout=TIMEOUT, what="the guest to boot again")
    assert server.domain_state() == libvirt.VIR_DOMAIN_RUNNING


def test_a_wrong_password_is_the_emulator_s_401_naming_the_node(bare_metal_server):
    server = bare_metal_server
    wrong = BmcTarget(
        name=server.target.name,
        address=server.target.address,
        username=server.target.username,
        password="not-the-password",
    )

    with pytest.raises(BmcError) as caught:
        power_state_read(wrong)

    assert caught.value.kind == redfish.CREDENTIALS
    assert caught.value.message == (
        f"node {server.name}: the BMC at {server.bmc.url} refused the user name or password "
        "(HTTP 401)"
    )
    assert server.domain_state() == libvirt.VIR_DOMAIN_RUNNING


def test_a_power_cycle_through_redfish_brings_the_machine_back(bare_metal_server):
    """Recovery's cycle (docs/bmc.md, Recovery): ForceOff, wait until the BMC says Off, On. The
    domain runs again and the guest boots again in it."""
    server = bare_metal_server
    rig.wait_until(lambda: server.boots() >= 1, timeout=TIMEOUT, what="the guest to boot")
    boots = server.boots()

    system_reset(server.target, "force_off")
    rig.wait_until(
        lambda: power_state_read(server.target) == "off", timeout=TIMEOUT, what="power Off"
    )
    system_reset(server.target, "on")
    rig.wait_until(lambda: power_state_read(server.target) == "on", timeout=TIMEOUT, what="On")

    assert server.domain_state() == libvirt.VIR_DOMAIN_RUNNING
    rig.wait_until(lambda: server.boots() > boots, timeout=TIMEOUT, what="the guest to boot again")
