"""Recovery on a real machine (docs/bmc.md, Recovery; issue 20): the rig's QEMU domain stands in
for a physical server (tests/realguest/bare_metal.py), ``LibvirtBmc`` (sushy-emulator's libvirt
driver) is its BMC, and its cluster probes it by TCP (``probe_tcp_port``, docs/drivers.md): the
booted guest accepts connections on port 22 at its address on the rig's bridge, as a server's
sshd would. Set up through the REST API as an operator would, then left to a real Celery worker
and beat.

The machine hangs (its domain paused: its BMC still says On, it answers nothing); the hypervisor
watch marks its node down; the automatic power cycle switches it off and on through Redfish
(libvirt destroys the domain and starts a new QEMU process); the guest boots, answers the probe,
and the node is ready again. With a wrong BMC password the cycle is refused at once: recovery
stops after one attempt, the node's page and the operators' attention strip say why, and ticks
after that leave the machine alone.
"""

import re

import libvirt
import pytest

from gpucap.audit.models import AuditEvent
from gpucap.bmc.recovery_models import HypervisorProbe, RecoveryAttempt
from gpucap.drivers.tcp_probe import port_answers
from tests.bmc.conftest import TEST_KEY
from tests.realguest import bare_metal, rig
from tests.rentals import conftest as rentals_fixtures

pytestmark = pytest.mark.django_db(transaction=True)

celery_queue = rentals_fixtures.celery_queue
workers = rentals_fixtures.workers

TIMEOUT = 300  # QEMU emulation on a loaded 2-core machine: generous
PROBE_TIMEOUT_SECONDS = 5
ENVIRONMENT = {
    "BMC_CREDENTIAL_KEYS": TEST_KEY,
    "HYPERVISOR_WATCH_SECONDS": "2",
    # Long enough that an emulated guest starved of CPU for a few probes is not marked down
    # before the test pauses it.
    "NODE_DOWN_AFTER_SECONDS": "15",
    "RECOVERY_TICK_SECONDS": "2",
    "RECOVERY_POLL_SECONDS": "1",
}


def ok(response, status=(200, 201, 202)):
    statuses = status if isinstance(status, tuple) else (status,)
    assert response.status_code in statuses, (response.status_code, response.content[:2000])
    return response.json()


@pytest.fixture
def machine(bare_metal_server):
    """The rig's machine, running and answering on its probe's port (a test before may have
    left it hung)."""
    server = bare_metal_server
    server.resume()
    rig.wait_until(
        lambda: port_answers(server.address, bare_metal.PROBE_PORT, timeout=PROBE_TIMEOUT_SECONDS),
        timeout=TIMEOUT,
        what=f"the machine to answer on {server.address}:{bare_metal.PROBE_PORT}",
        every=1,
    )
    return server


@pytest.fixture
def background(workers, settings):
    settings.BMC_CREDENTIAL_KEYS = [TEST_KEY]  # this process stores the credentials
    worker = workers(**ENVIRONMENT)
    beat = workers(beat=True, **ENVIRONMENT)
    return worker, beat


def metal_node(api, server, *, password: str) -> dict:
    """A cluster probing its machine by TCP, with automatic power cycles after a short grace,
    and the machine as its node, its BMC the emulator: all through the API. The cluster's
    libvirt URI leads nowhere: only the probe asks the node anything."""
    cluster = ok(
        api.post(
            "/api/clusters/",
            {
                "name": "metal",
                "driver": "libvirt",
                "driver_settings": {
                    "uri": "qemu:///system?socket=/nonexistent/gpucap/libvirt-sock",
                    # A fleet names its machines' addresses by template, e.g.
                    # "{node}.mgmt.example.net"; this one-machine cluster names it as it is.
                    "probe_address": server.address,
                    "probe_tcp_port": bare_metal.PROBE_PORT,
                    "probe_timeout_seconds": PROBE_TIMEOUT_SECONDS,
                },
            },
            format="json",
        )
    )
    ok(
        api.put(
            f"/api/clusters/{cluster['id']}/recovery-policy/",
            {
                "auto_power_cycle": True,
                "grace_seconds": 2,
                "max_attempts": 3,
                "boot_timeout_seconds": 600,
            },
            format="json",
        )
    )
    node = ok(
        api.post(
            "/api/nodes/",
            {
                "cluster": cluster["id"],
                "hostname": server.name,
                "gpu_model": "H100-SXM5-80GB",
                "fabric": "nvswitch",
                "gpu_count": 8,
                "bmc_address": server.bmc.url,
            },
            format="json",
        )
    )
    ok(
        api.put(
            f"/api/nodes/{node['id']}/bmc/",
            {"username": server.bmc.username, "password": password},
            format="json",
        )
    )
    return node


def node_state(api, node: dict) -> str:
    return ok(api.get(f"/api/nodes/{node['id']}/"))["state"]


def recovery(api, node: dict) -> dict:
    return ok(api.get(f"/api/nodes/{node['id']}/recovery/"))


def first_answer(node: dict, worker) -> None:
    """The watch's TCP probe reached the booted guest."""
    rig.wait_until(
        lambda: HypervisorProbe.objects.filter(
            node_id=node["id"], answered_at__isnull=False
        ).exists(),
        timeout=TIMEOUT,
        what=f"the watch's probe to be answered\n{worker.log()[-6000:]}",
    )


def resets(server) -> int:
    return server.bmc.log().count("Actions/ComputerSystem.Reset HTTP")


def refusals(server) -> int:
    return server.bmc.log().count('HTTP/1.1" 401')


def ticks_done(worker) -> int:
    return len(re.findall(r"Task bmc\.recovery_tick\[[^\]]+\] succeeded", worker.log()))


def test_a_hung_machine_is_marked_down_power_cycled_through_redfish_and_ready_again(
    machine, background, operator_api
):
    server = machine
    worker, _beat = background
    node = metal_node(operator_api, server, password=server.bmc.password)
    first_answer(node, worker)
    assert node_state(operator_api, node) == "ready"
    domain_id, boots, reset = server.domain_id(), server.boots(), resets(server)
    logged = len(server.libvirt_log())

    server.pause()  # the machine hangs: no answer on its port, its BMC still says On

    rig.wait_until(
        lambda: node_state(operator_api, node) == "down",
        timeout=TIMEOUT,
        what=f"the watch to mark it down\n{worker.log()[-6000:]}",
    )
    down = AuditEvent.objects.get(verb="node.mark_down", object_id=str(node["id"]))
    assert down.message.startswith("hypervisor unreachable since ")

    rig.wait_until(
        lambda: node_state(operator_api, node) == "ready",
        timeout=TIMEOUT,
        what=f"the node to be ready again\n{worker.log()[-6000:]}\n{server.bmc.log()[-3000:]}",
        every=1,
    )

    # Through Redfish, for real: ForceOff and On, libvirt destroyed the paused domain and
    # started a new QEMU process, and the guest came up again in it.
    assert resets(server) == reset + 2
    libvirt_said = server.libvirt_log()[logged:]
    destroyed = libvirt_said.index("shutting down, reason=destroyed")
    assert "starting up" in libvirt_said[destroyed:]
    assert server.domain_id() not in (domain_id, -1)
    assert server.domain_state() == libvirt.VIR_DOMAIN_RUNNING
    assert server.boots() == boots + 1
    assert port_answers(server.address, bare_metal.PROBE_PORT, timeout=PROBE_TIMEOUT_SECONDS)

    [attempt] = recovery(operator_api, node)["history"]
    assert (attempt["trigger"], attempt["actor"]) == ("automatic", None)
    assert attempt["outcome"] == RecoveryAttempt.Outcome.RECOVERED
    assert attempt["message"].startswith("its hypervisor answered ")
    assert recovery(operator_api, node)["state"] == "idle"
    verbs = list(
        AuditEvent.objects.filter(object_type="node", object_id=str(node["id"]))
        .order_by("id")
        .values_list("verb", flat=True)
    )
    assert verbs[-3:] == ["node.mark_down", "bmc.power_cycle", "node.recover"]
    recovered = AuditEvent.objects.get(verb="node.recover", object_id=str(node["id"]))
    assert recovered.message.startswith("recovered by a power cycle: its hypervisor answered ")


def test_a_bmc_that_refuses_the_password_stops_recovery_at_once_and_is_not_asked_again(
    machine, background, operator_api, operator_client
):
    server = machine
    worker, _beat = background
    node = metal_node(operator_api, server, password="not-the-password")
    first_answer(node, worker)
    domain_id, reset = server.domain_id(), resets(server)

    server.pause()

    stopped = rig.wait_until(
        lambda: (found := recovery(operator_api, node))["state"] == "stopped" and found,
        timeout=TIMEOUT,
        what=f"recovery to stop\n{worker.log()[-6000:]}",
    )
    error = (
        f"node {server.name}: the BMC at {server.bmc.url} refused the user name or password "
        "(HTTP 401)"
    )
    assert (stopped["attempts"], stopped["last_error"]) == (1, error)
    [attempt] = stopped["history"]
    assert (attempt["outcome"], attempt["message"]) == (RecoveryAttempt.Outcome.REFUSED, error)
    assert node_state(operator_api, node) == "down"

    # Named on the node's page and on the operators' attention strip.
    page = operator_client.get(f"/fleet/nodes/metal/{server.name}/").content.decode()
    assert error in page
    strip = " ".join(operator_client.get("/").content.decode().split())
    assert (
        f'recovery stopped: <a href="/fleet/nodes/metal/{server.name}/">{server.name}</a>, '
        '<span class="small">1 power cycle failed:</span>'
    ) in strip

    # Not retried: a good many ticks later, still the one attempt, the BMC asked nothing more,
    # and the machine untouched (still paused, the same QEMU process).
    asked, ticks = refusals(server), ticks_done(worker)
    rig.wait_until(
        lambda: ticks_done(worker) >= ticks + 10,
        timeout=TIMEOUT,
        what=f"ten more recovery ticks\n{worker.log()[-6000:]}",
        every=1,
    )
    again = recovery(operator_api, node)
    assert (again["state"], again["attempts"], len(again["history"])) == ("stopped", 1, 1)
    assert refusals(server) == asked
    assert resets(server) == reset
    assert server.domain_state() == libvirt.VIR_DOMAIN_PAUSED
    assert server.domain_id() == domain_id
    assert AuditEvent.objects.filter(verb="bmc.recovery_stop").count() == 1
