"""What the driver tasks hand a driver for a VM: on an NVSwitch node the Fabric Manager
partition its GPUs form, looked up in the node's imported partition table; its catalogue image's
base on the node."""

from gpucap.fleet import services as fleet
from gpucap.fleet.models import Node
from gpucap.rentals import tasks

# h100-002's cards: module ids as Fabric Manager numbers them, by GPU index.
MODULES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 5, 5: 6, 6: 7, 7: 8}
# (Fabric Manager partition id, module ids), as nv-partitioner -o 0 lists them.
LISTED = [
    (0, (1, 2, 3, 4, 5, 6, 7, 8)),
    (1, (1, 2, 3, 4)),
    (2, (5, 6, 7, 8)),
    (3, (1, 3)),
    (4, (2, 4)),
    (5, (5, 7)),
    (6, (6, 8)),
    *((6 + module, (module,)) for module in range(1, 9)),
]


def imported(node: Node) -> Node:
    fleet.node_set_module_ids(node=node, module_ids=MODULES)
    return fleet.node_set_fabric_partitions(node=node, fabric_partitions=LISTED)


def test_a_vm_on_an_nvswitch_node_is_created_with_its_fabric_partition(vm_in, nodes):
    imported(nodes["h100-002"])

    pair = vm_in("provisioning", node="h100-002", gpus=(0, 2))
    half = vm_in("provisioning", node="h100-002", gpus=(4, 5, 6, 7))
    single = vm_in("provisioning", node="h100-002", gpus=(1,))

    assert tasks._spec(pair).fabric_partition == 3  # modules 1, 3
    assert tasks._spec(half).fabric_partition == 2
    assert tasks._spec(single).fabric_partition == 8  # module 2 alone
    assert [g.index for g in tasks._spec(pair).gpus] == [0, 2]


def test_a_node_without_fabric_manager_ids_gives_no_partition(vm_in):
    vm = vm_in("provisioning", node="h100-001", gpus=(0, 1))

    assert tasks._spec(vm).fabric_partition is None


def test_a_replica_is_created_with_its_images_base_and_port(vm_in, fleet_east):
    vm = vm_in("provisioning")

    spec = tasks._spec(vm)

    assert spec.base_image == "/var/lib/gpucap/images/ubuntu-24.04-cuda-12.6.qcow2"
    assert spec.service_port is None  # a rental serves nothing gpucap routes to
