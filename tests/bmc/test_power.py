"""Power through the BMC, against sushy-emulator's fake system (its power state really changes,
1 to 11 s after the request, as a real machine's does) and the static mockup (whose Reset
offers a fixed list)."""

import json
import time

import pytest

from gpucap.bmc import redfish
from gpucap.bmc.power import power_state_read, system_reset
from gpucap.bmc.redfish import BmcError, BmcTarget
from tests.bmc.emulators import DynamicBmc, StaticBmc, mockup_copy


@pytest.fixture(scope="module")
def machine():
    """An emulator of this module's own: the tests here switch its system off and on."""
    with DynamicBmc() as bmc:
        yield BmcTarget(
            name="node h100-001",
            address=bmc.url,
            username=bmc.username,
            password=bmc.password,
        )


def _becomes(target: BmcTarget, state: str, *, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (now := power_state_read(target)) != state:
        assert time.monotonic() < deadline, f"still {now} after {timeout:g} s, not {state}"
        time.sleep(0.5)


def test_a_machine_is_switched_off_and_on(machine):
    assert power_state_read(machine) == "on"

    system_reset(machine, "force_off")
    _becomes(machine, "off")

    system_reset(machine, "on")
    _becomes(machine, "on")


def test_a_reset_the_bmc_does_not_offer_is_refused_naming_it(tmp_path):
    mockup = mockup_copy(tmp_path / "gpu-server")
    path = mockup / "Systems" / "1" / "index.json"
    system = json.loads(path.read_text())
    system["Actions"]["#ComputerSystem.Reset"]["ResetType@Redfish.AllowableValues"] = [
        "On",
        "ForceOff",
    ]
    path.write_text(json.dumps(system))

    with StaticBmc(mockup) as bmc:
        target = BmcTarget(name="node h100-001", address=bmc.url, username="a", password="b")
        with pytest.raises(BmcError) as caught:
            system_reset(target, "force_restart")

    assert caught.value.kind == redfish.REFUSED
    assert caught.value.message == (
        f"node h100-001: the BMC at {bmc.url} does not offer ForceRestart (it offers: ForceOff, On)"
    )
