"""Fabric Manager clients: NVIDIA's partition listing read as it is printed (table and CSV),
the simulated Fabric Manager refusing what a real one refuses, and ``NvPartitionerClient``
running a real executable (a fake ``nv-partitioner`` written by the test) through its command
template."""

import json
import sys
from pathlib import Path

import pytest

from gpucap.drivers.base import DriverError, DriverUnavailable
from gpucap.drivers.fabric_listing import FabricListingError, FabricPartition, partitions_parse
from gpucap.drivers.fabric_manager import (
    NvPartitionerClient,
    SimulatedFabricManager,
    fabric_manager_for,
    simulated_fabric_reset,
)

LISTING = Path(__file__).parent / "fixtures" / "nv_partitioner_hgx_h100.txt"


@pytest.fixture(autouse=True)
def fresh_simulated_fabric():
    simulated_fabric_reset()
    yield
    simulated_fabric_reset()


# --- the listing --------------------------------------------------------------------------------


def test_the_hgx_listing_is_read_with_module_ids_status_and_unsupported_partitions():
    partitions = partitions_parse(LISTING.read_text())

    assert [(p.id, p.modules) for p in partitions[:7]] == [
        (0, (1, 2, 3, 4, 5, 6, 7, 8)),
        (1, (1, 2, 3, 4)),
        (2, (5, 6, 7, 8)),
        (3, (1, 3)),
        (4, (2, 4)),
        (5, (5, 7)),
        (6, (6, 8)),
    ]
    assert [p.modules for p in partitions[7:]] == [(m,) for m in range(1, 9)]
    assert [p.id for p in partitions if p.active] == [1]
    assert [p.id for p in partitions if not p.supported] == [6]
    assert partitions[0].max_nvlinks == 18


def test_the_csv_listing_reads_the_same():
    csv = (
        "Partition_ID,Num_GPUs,GPU_Module_IDs,Max_NVLinks_per_GPU,Status\n"
        '0,8,"1 2 3 4 5 6 7 8",18,INACTIVE\n'
        '3,2,"1 3",18,ACTIVE\n'
        '7,1,"1",18,INACTIVE\n'
    )

    assert partitions_parse(csv) == [
        FabricPartition(id=0, modules=(1, 2, 3, 4, 5, 6, 7, 8), max_nvlinks=18),
        FabricPartition(id=3, modules=(1, 3), active=True, max_nvlinks=18),
        FabricPartition(id=7, modules=(1,), max_nvlinks=18),
    ]


def test_rows_under_an_unsupported_heading_are_unsupported():
    text = (
        "Partition ID   Number of GPUs GPU Module ID   Max NVLinks/GPU  STATUS\n"
        "0              2              1, 3            18               INACTIVE\n"
        "\n"
        "Unsupported partitions:\n"
        "1              2              2, 4            0                INACTIVE\n"
    )

    assert [(p.id, p.supported) for p in partitions_parse(text)] == [(0, True), (1, False)]


@pytest.mark.parametrize(
    "text,reason",
    [
        ("", "no partition table in the listing"),
        (
            "Error: Failed to connect to Fabric Manager. (Code: -9)\n",
            "it begins 'Error: Failed to connect",
        ),
        ("Partition ID  Number of GPUs  GPU Module ID\n", "header but no partitions"),
        (
            "Partition ID  Number of GPUs  GPU Module ID  Max NVLinks/GPU  STATUS\n"
            "0  4  1, 2, 3  18  INACTIVE\n",
            "line 2: partition 0 says 4 GPUs but lists 3 module ids",
        ),
        (
            "Partition ID  Number of GPUs  GPU Module ID  Max NVLinks/GPU  STATUS\n"
            "0  2  1, 1  18  INACTIVE\n",
            "partition 0 lists a GPU module twice",
        ),
        (
            "Partition ID  Number of GPUs  GPU Module ID  Max NVLinks/GPU  STATUS\n"
            "0  2  1, 3  18  BROKEN\n",
            "partition 0 has status 'BROKEN'",
        ),
        (
            "Partition ID  Number of GPUs  GPU Module ID  Max NVLinks/GPU  STATUS\n"
            "0  2  1, 3  18  INACTIVE\n"
            "0  2  2, 4  18  INACTIVE\n",
            "partition 0 is listed twice",
        ),
        (
            "Partition ID  Number of GPUs  GPU Module ID  Max NVLinks/GPU  STATUS\n"
            "0  2  1, 3  18  INACTIVE\n"
            "1  two  2, 4  18  INACTIVE\n",
            "line 3: cannot read '1  two  2, 4  18  INACTIVE' as a partition",
        ),
        (
            "Total supported partitions: 15\n\n"
            "Partition ID  Number of GPUs  GPU Module ID  Max NVLinks/GPU  STATUS\n"
            "0  2  1, 3  18  INACTIVE\n",
            "says 15 supported partitions but lists 1; was it cut short?",
        ),
        (
            'Partition_ID,Num_GPUs,GPU_Module_IDs,Max_NVLinks_per_GPU,Status\n0,2,"1 3",18\n',
            "line 2: 4 columns, expected 5",
        ),
    ],
)
def test_a_listing_that_cannot_be_read_is_refused_naming_the_line(text, reason):
    with pytest.raises(FabricListingError) as excinfo:
        partitions_parse(text)

    assert reason in str(excinfo.value)


# --- the simulated Fabric Manager --------------------------------------------------------------


def test_simulated_activation_is_idempotent_and_per_node():
    fabric = SimulatedFabricManager("h100-001")

    fabric.activate(1)
    fabric.activate(1)
    fabric.deactivate(5)  # not active: fine

    assert fabric.active() == {1}
    assert SimulatedFabricManager("h100-002").active() == set()
    assert [p.id for p in fabric.partitions() if p.active] == [1]


def test_simulated_fabric_manager_refuses_a_partition_sharing_a_gpu_with_an_active_one():
    fabric = SimulatedFabricManager("h100-001")
    fabric.activate(1)  # modules 1-4

    with pytest.raises(DriverError) as excinfo:
        fabric.activate(3)  # modules 1, 3

    assert str(excinfo.value) == (
        "Fabric Manager on h100-001 refused to activate partition 3 (modules 1, 3): "
        "GPU module 1, 3 is in active partition 1 (modules 1, 2, 3, 4)"
    )
    fabric.activate(2)  # modules 5-8: disjoint
    assert fabric.active() == {1, 2}
    fabric.deactivate(1)
    fabric.activate(3)
    assert fabric.active() == {2, 3}


def test_simulated_fabric_manager_refuses_an_unknown_partition():
    with pytest.raises(DriverError, match="has no partition 15 \\(it lists 0, 1, 2"):
        SimulatedFabricManager("h100-001").activate(15)


def test_no_fabric_manager_means_no_client():
    assert fabric_manager_for("none", "h100-001", command=["x"], timeout_seconds=1) is None


# --- nv-partitioner, for real ------------------------------------------------------------------

# A stand-in for NVIDIA's nv-partitioner: the same options (-o 0|1|2, -p ID), the same table,
# the same refusals, its state in a JSON file, every call logged with the node it was run for.
FAKE_NV_PARTITIONER = """\
import json, os, sys, time
state_file, log_file = os.environ["FAKE_FM_STATE"], os.environ["FAKE_FM_LOG"]
args = sys.argv[1:]
with open(log_file, "a") as log:
    log.write(json.dumps({"node": os.environ.get("FM_NODE"), "args": args}) + "\\n")
if os.environ.get("FAKE_FM_MODE") == "hang":
    time.sleep(60)
if os.environ.get("FAKE_FM_MODE") == "down":
    print("Error: Failed to connect to Fabric Manager. (Code: -9)")
    sys.exit(247)
PARTITIONS = {0: [1, 2, 3, 4, 5, 6, 7, 8], 1: [1, 2, 3, 4], 2: [5, 6, 7, 8], 3: [1, 3], 4: [2, 4]}
active = set(json.load(open(state_file))) if os.path.exists(state_file) else set()
print("Successfully connected to Fabric Manager at 127.0.0.1")
op = args[args.index("-o") + 1]
if op == "0":
    print(f"Total supported partitions: {len(PARTITIONS)}\\n")
    print(f"{'Partition ID':<15}{'Number of GPUs':<15}{'GPU Module ID':<25}"
          f"{'Max NVLinks/GPU':<20}STATUS")
    print("-" * 80)
    for pid, modules in PARTITIONS.items():
        status = "ACTIVE" if pid in active else "INACTIVE"
        print(f"{pid:<15}{len(modules):<15}{', '.join(map(str, modules)):<25}{18:<20}{status}")
    sys.exit(0)
pid = int(args[args.index("-p") + 1])
if op == "1":
    if pid in active or any(set(PARTITIONS[a]) & set(PARTITIONS[pid]) for a in active):
        print("Error: Failed to activate partition. (Code: -7)")
        sys.exit(249)
    active.add(pid)
    print(f"Successfully sent activation request for partition {pid}")
elif op == "2":
    if pid not in active:
        print("Error: Failed to deactivate partition. (Code: -1)")
        sys.exit(255)
    active.discard(pid)
    print(f"Successfully sent deactivation request for partition {pid}")
json.dump(sorted(active), open(state_file, "w"))
"""


@pytest.fixture
def nv_partitioner(tmp_path):
    """Build a client whose command template runs the fake tool through env(1), so the
    template's ``{node}`` reaches it."""
    script = tmp_path / "nv-partitioner"
    script.write_text(f"#!{sys.executable}\n{FAKE_NV_PARTITIONER}")
    script.chmod(0o755)
    log = tmp_path / "calls.jsonl"

    def build(mode: str = "", timeout_seconds: float = 30) -> NvPartitionerClient:
        command = [
            "env",
            f"FAKE_FM_STATE={tmp_path / 'state.json'}",
            f"FAKE_FM_LOG={log}",
            f"FAKE_FM_MODE={mode}",
            "FM_NODE={node}",
            str(script),
        ]
        return NvPartitionerClient("h100-001", command=command, timeout_seconds=timeout_seconds)

    build.calls = lambda: [json.loads(line) for line in log.read_text().splitlines()]
    return build


def test_nv_partitioner_lists_activates_and_deactivates_for_its_node(nv_partitioner):
    fabric = nv_partitioner()

    listed = fabric.partitions()
    fabric.activate(3)
    after_activate = fabric.active()
    fabric.deactivate(3)

    assert [(p.id, p.modules, p.active) for p in listed][:2] == [
        (0, (1, 2, 3, 4, 5, 6, 7, 8), False),
        (1, (1, 2, 3, 4), False),
    ]
    assert after_activate == {3}
    assert fabric.active() == set()
    calls = nv_partitioner.calls()
    assert {call["node"] for call in calls} == {"h100-001"}
    assert ["-o", "1", "-p", "3"] in [call["args"] for call in calls]
    assert ["-o", "2", "-p", "3"] in [call["args"] for call in calls]


def test_nv_partitioner_activation_is_idempotent(nv_partitioner):
    fabric = nv_partitioner()

    fabric.activate(3)
    fabric.activate(3)  # the tool itself refuses an active partition: not asked again
    fabric.deactivate(3)
    fabric.deactivate(3)

    changes = [call["args"] for call in nv_partitioner.calls() if call["args"][1] != "0"]
    assert changes == [["-o", "1", "-p", "3"], ["-o", "2", "-p", "3"]]


def test_nv_partitioner_refusal_is_a_driver_error_with_the_tools_words(nv_partitioner):
    fabric = nv_partitioner()
    fabric.activate(1)

    with pytest.raises(DriverError) as excinfo:
        fabric.activate(3)

    assert not isinstance(excinfo.value, DriverUnavailable)
    assert "Fabric Manager on h100-001:" in str(excinfo.value)
    assert "-o 1 -p 3 failed (exit 249): Error: Failed to activate partition. (Code: -7)" in str(
        excinfo.value
    )
    assert fabric.active() == {1}


def test_fabric_manager_not_answering_is_transient(nv_partitioner):
    with pytest.raises(DriverUnavailable, match="Failed to connect to Fabric Manager"):
        nv_partitioner(mode="down").partitions()


def test_a_hung_tool_is_transient_after_the_timeout(nv_partitioner):
    with pytest.raises(DriverUnavailable, match=r"did not answer within 0\.5 s"):
        nv_partitioner(mode="hang", timeout_seconds=0.5).partitions()


def test_a_tool_that_cannot_run_is_a_driver_error_naming_it(tmp_path):
    missing = str(tmp_path / "no-such-nv-partitioner")
    fabric = NvPartitionerClient("h100-001", command=[missing], timeout_seconds=5)

    with pytest.raises(DriverError, match=r"cannot run .*no-such-nv-partitioner"):
        fabric.active()
