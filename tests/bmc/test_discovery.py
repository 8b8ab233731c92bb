"""Discovery against the emulated GPU server (issue 20's "Must show"): the mockup becomes a node
with 8 GPUs and one failed; a second run changes nothing; a changed GPU shows in the preview;
a BMC that refuses, cannot be reached or is not Redfish is a clear error naming the node, and
nothing changes."""

import json

import pytest

from gpucap.audit.models import AuditEvent
from gpucap.bmc.discovery import DiscoveryEntry, DiscoveryError, discovery_entry, discovery_run
from gpucap.bmc.models import BmcCredential, NodeInventory
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster, Gpu, Node
from gpucap.notices.models import InterruptionNotice
from tests.bmc.emulators import StaticBmc, free_port, mockup_copy
from tests.rentals.vm_helpers import running_vm

PCI_ORDER = [f"0000:{bus}:00.0" for bus in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")]


@pytest.fixture
def east(db):
    return fleet.cluster_create(name="east", driver=Cluster.Driver.SIMULATED)


def _entry(url: str, **fields) -> DiscoveryEntry:
    return DiscoveryEntry(
        **{
            "where": "entries[0]",
            "cluster": "east",
            "address": url,
            "username": "admin",
            "password": "s3cret",
            "fabric": "nvswitch",
            "gpu_model": "H100-SXM5-80GB",
            **fields,
        }
    )


def _lines(result) -> list[str]:
    return [*result.lines(), result.summary()]


def test_the_preview_shows_the_new_node_and_writes_nothing(east, gpu_server_bmc):
    events = AuditEvent.objects.count()

    result = discovery_run(entries=[_entry(gpu_server_bmc.url)], dry_run=True)

    assert _lines(result) == [
        "would create node east/h100-001: 8 x H100-SXM5-80GB nvswitch, standalone, failed GPU 5 "
        f"(BMC: Critical), BMC {gpu_server_bmc.url}, Contoso GS-8H100 serial S8H1000421",
        "dry run, nothing written: would create 1 node, unchanged 0",
    ]
    assert not Node.objects.exists()
    assert AuditEvent.objects.count() == events


def test_the_mockup_becomes_a_node_with_eight_gpus_and_one_failed(east, gpu_server_bmc, operator):
    discovery_run(entries=[_entry(gpu_server_bmc.url)], dry_run=False, actor=operator)

    node = Node.objects.get(cluster=east, hostname="h100-001")
    assert (node.gpu_count, node.gpu_model, node.fabric, node.state) == (
        8,
        "H100-SXM5-80GB",
        "nvswitch",
        "ready",
    )
    assert node.bmc_address == gpu_server_bmc.url
    gpus = list(node.gpus.order_by("index"))
    assert [gpu.pci_address for gpu in gpus] == PCI_ORDER
    assert [gpu.health for gpu in gpus] == ["ok"] * 5 + ["failed"] + ["ok"] * 2
    assert gpus[0].uuid == "GPU-7a1c5e02-9b2d-4c3e-8f40-000000000018"
    credential = BmcCredential.objects.get(node=node)
    assert (credential.username, credential.verify_tls) == ("admin", True)
    facts = NodeInventory.objects.get(node=node).facts
    assert facts["serial_number"] == "S8H1000421"
    assert [gpu["serial_number"] for gpu in facts["gpus"]][5] == "1654923000106"
    assert "s3cret" not in json.dumps(list(AuditEvent.objects.values("before", "after")))


def test_a_second_run_changes_nothing(east, gpu_server_bmc):
    discovery_run(entries=[_entry(gpu_server_bmc.url)], dry_run=False)
    node = Node.objects.get(hostname="h100-001")
    events = AuditEvent.objects.count()

    again = discovery_run(entries=[discovery_entry(node)], dry_run=False)

    assert _lines(again) == ["nothing to change, unchanged 1"]
    assert AuditEvent.objects.count() == events


def test_a_changed_gpu_shows_in_the_preview(east, gpu_server_bmc, tmp_path):
    discovery_run(entries=[_entry(gpu_server_bmc.url)], dry_run=False)
    node = Node.objects.get(hostname="h100-001")
    changed = mockup_copy(tmp_path / "gpu-server")
    # The card in SXM3 (bus 3a, the host's GPU 2) swapped; the one in SXM6 healthy again.
    _edit(changed, "GPU_SXM_3", UUID="0b5e55ed-0000-4000-8000-00000000003a")
    _edit(changed, "GPU_SXM_6", Status={"State": "Enabled", "Health": "OK"})

    with StaticBmc(changed) as swapped:
        node = fleet.node_update(node=node, bmc_address=swapped.url)
        preview = discovery_run(entries=[discovery_entry(node)], dry_run=True)

    assert _lines(preview) == [
        "would update node east/h100-001: GPU 2 replaced: uuid "
        "GPU-7a1c5e03-9b2d-4c3e-8f40-00000000003a -> GPU-0b5e55ed-0000-4000-8000-00000000003a; "
        "GPU 5 health failed -> ok (BMC: OK); inventory changed",
        "dry run, nothing written: would update 1 node, unchanged 0",
    ]
    assert Gpu.objects.get(node=node, index=2).uuid == "GPU-7a1c5e03-9b2d-4c3e-8f40-00000000003a"


def _edit(mockup, processor: str, **fields) -> None:
    path = mockup / "Systems" / "1" / "Processors" / processor / "index.json"
    doc = json.loads(path.read_text())
    doc.update(fields)
    path.write_text(json.dumps(doc))


def test_wrong_credentials_are_named_and_nothing_changes(east, refusing_bmc):
    with pytest.raises(DiscoveryError) as caught:
        discovery_run(entries=[_entry(refusing_bmc.url, hostname="h100-009")], dry_run=False)

    assert caught.value.problems == [
        f"node h100-009: the BMC at {refusing_bmc.url} refused the user name or password (HTTP 401)"
    ]
    assert not Node.objects.exists()


def test_an_unreachable_bmc_is_named_and_nothing_changes(east, gpu_server_bmc):
    dead = f"http://127.0.0.1:{free_port()}"

    with pytest.raises(DiscoveryError) as caught:
        discovery_run(
            entries=[
                _entry(gpu_server_bmc.url),
                _entry(dead, where="entries[1]", hostname="h100-002"),
            ],
            dry_run=False,
        )

    assert caught.value.problems == [
        f"node h100-002: no answer from the BMC at {dead} (connection refused)"
    ]
    assert not Node.objects.exists()  # the first entry, fine on its own, is not applied either


def test_a_bmc_that_is_not_redfish_is_named(east, web_page_server):
    with pytest.raises(DiscoveryError) as caught:
        discovery_run(entries=[_entry(web_page_server.url)], dry_run=True)

    assert caught.value.problems == [
        f"entries[0]: {web_page_server.url} answers HTTP but is not a Redfish service "
        "(GET /redfish/v1/ is not JSON)"
    ]


def test_what_the_bmc_cannot_say_is_asked_for(east, gpu_server_bmc):
    with pytest.raises(DiscoveryError) as caught:
        discovery_run(
            entries=[
                _entry(gpu_server_bmc.url, cluster="west"),
                _entry(gpu_server_bmc.url, fabric=""),
            ],
            dry_run=True,
        )

    assert caught.value.problems == [
        "node h100-001: cluster: no cluster named west",
        "node h100-001: fabric: say pcie or nvswitch for a new node (the BMC does not tell)",
    ]


def test_a_registered_node_whose_count_differs_is_refused(east, gpu_server_bmc):
    fleet.node_create(
        cluster=east,
        hostname="h100-001",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
        gpu_count=4,
    )

    with pytest.raises(DiscoveryError) as caught:
        discovery_run(entries=[_entry(gpu_server_bmc.url)], dry_run=False)

    assert caught.value.problems == [
        "node h100-001: gpus: cannot change in place (registered 4, the BMC says 8)"
    ]


def test_a_card_the_bmc_says_failed_has_its_vm_warned_with_a_drain_notice(east, tenant, tmp_path):
    healthy = mockup_copy(tmp_path / "healthy")
    _edit(healthy, "GPU_SXM_6", Status={"State": "Enabled", "Health": "OK"})
    with StaticBmc(healthy) as bmc:
        discovery_run(entries=[_entry(bmc.url)], dry_run=False)
    node = Node.objects.get(hostname="h100-001")
    pool = fleet.pool_create(
        name="h100-rent",
        kind="on_demand",
        cluster=east,
        rank=1,
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
    )
    fleet.pool_set_tenants(pool=pool, tenants=[tenant])
    fleet.image_create(cluster=east, name="ubuntu-24.04-cuda-12.6", base_image="/images/u.qcow2")
    vm = running_vm(tenant, pool, node, [5], name="train", ip="10.0.0.9")

    with StaticBmc() as bmc:  # the shipped mockup: SXM6, the host's GPU 5, Critical
        node = fleet.node_update(node=node, bmc_address=bmc.url)
        discovery_run(entries=[discovery_entry(node)], dry_run=False)

    vm.refresh_from_db()
    assert vm.state == "notified"
    notice = InterruptionNotice.objects.get(vm=vm)
    assert (notice.reason, notice.message) == (
        "drain",
        "GPU 5 of node h100-001 failed: the VM is stopped at the deadline",
    )
