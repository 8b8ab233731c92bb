"""What the recovery tests share: a node given a BMC (address and credentials), its power read
until it settles, and the recovery rows read back."""

import time

from gpucap.bmc.power import power_state_read
from gpucap.bmc.recovery_models import NodeRecovery, RecoveryAttempt
from gpucap.bmc.redfish import BmcTarget
from gpucap.bmc.services import bmc_credential_set
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Node
from tests.bmc.emulators import DynamicBmc


def give_bmc(node: Node, url: str, *, password: str = DynamicBmc.password) -> Node:
    node = fleet.node_update(node=node, bmc_address=url)
    bmc_credential_set(node=node, username=DynamicBmc.username, password=password)
    return node


def target_of(url: str) -> BmcTarget:
    return BmcTarget(
        name="machine", address=url, username=DynamicBmc.username, password=DynamicBmc.password
    )


def power_becomes(url: str, state: str, *, timeout: float = 60) -> None:
    """Wait until the emulated machine's power reads ``state`` ("on", "off"): it changes 1 to
    11 s after a reset, as a real machine's does."""
    target = target_of(url)
    deadline = time.monotonic() + timeout
    while (now := power_state_read(target)) != state:
        assert time.monotonic() < deadline, f"power still {now} after {timeout:g} s, not {state}"
        time.sleep(0.2)


def recovery_of(node: Node) -> NodeRecovery:
    return NodeRecovery.objects.get(node=node)


def attempts_of(node: Node) -> list[RecoveryAttempt]:
    return list(RecoveryAttempt.objects.filter(node=node).order_by("started_at", "id"))


def state_of(node: Node) -> str:
    return Node.objects.values_list("state", flat=True).get(pk=node.pk)
