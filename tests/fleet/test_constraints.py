"""Integrity the database holds even when code forgets: each case bypasses the services."""

import pytest
from django.db import IntegrityError, transaction

from gpucap.fleet.models import CapacitySet, Cluster, Gpu, Node, Pool
from gpucap.tenancy.models import Membership


@pytest.fixture
def cluster(db):
    return Cluster.objects.create(name="west")


@pytest.fixture
def node(cluster):
    return Node.objects.create(
        cluster=cluster, hostname="n1", gpu_model="H100", fabric="nvswitch", gpu_count=8
    )


@pytest.fixture
def capacity_set(cluster):
    return CapacitySet.objects.create(
        cluster=cluster, name="h100-west", gpu_model="H100", fabric="nvswitch"
    )


def refused(create) -> bool:
    try:
        with transaction.atomic():
            create()
    except IntegrityError:
        return True
    return False


@pytest.mark.parametrize("gpu_count", [0, 9])
def test_database_refuses_a_node_with_an_impossible_gpu_count(cluster, gpu_count):
    assert refused(
        lambda: Node.objects.create(
            cluster=cluster, hostname="x", gpu_model="H100", fabric="pcie", gpu_count=gpu_count
        )
    )


def test_database_refuses_two_nodes_with_one_hostname_in_a_cluster(node):
    assert refused(
        lambda: Node.objects.create(
            cluster=node.cluster, hostname="n1", gpu_model="H100", fabric="nvswitch", gpu_count=8
        )
    )


def test_same_hostname_is_fine_in_another_cluster(node):
    other = Cluster.objects.create(name="south")
    Node.objects.create(cluster=other, hostname="n1", gpu_model="H100", fabric="pcie", gpu_count=1)
    assert Node.objects.filter(hostname="n1").count() == 2


@pytest.mark.parametrize("field,value", [("state", "exploded"), ("fabric", "infiniband")])
def test_database_refuses_unknown_node_state_or_fabric(cluster, field, value):
    values = {
        "cluster": cluster,
        "hostname": "x",
        "gpu_model": "H100",
        "fabric": "pcie",
        "gpu_count": 1,
        field: value,
    }
    assert refused(lambda: Node.objects.create(**values))


def test_database_refuses_a_partition_table_on_a_pcie_node(cluster):
    assert refused(
        lambda: Node.objects.create(
            cluster=cluster,
            hostname="x",
            gpu_model="L40S",
            fabric="pcie",
            gpu_count=4,
            partitions=[[0], [1]],
        )
    )


def test_database_refuses_a_gpu_index_twice_on_one_node(node):
    Gpu.objects.create(node=node, index=0, uuid="GPU-a", pci_address="0000:18:00.0")
    assert refused(
        lambda: Gpu.objects.create(node=node, index=0, uuid="GPU-b", pci_address="0000:2a:00.0")
    )


@pytest.mark.parametrize(
    "values",
    [
        {"index": 8, "uuid": "GPU-x", "pci_address": "0000:18:00.0"},
        {"index": 1, "uuid": "GPU-x", "pci_address": "18:00.0"},
        {"index": 1, "uuid": "GPU-x", "pci_address": "0000:18:00.0", "health": "meh"},
    ],
    ids=["index-out-of-range", "malformed-pci-address", "unknown-health"],
)
def test_database_refuses_a_malformed_gpu(node, values):
    assert refused(lambda: Gpu.objects.create(node=node, **values))


def test_database_refuses_one_gpu_uuid_on_two_cards(node):
    Gpu.objects.create(node=node, index=0, uuid="GPU-a", pci_address="0000:18:00.0")
    assert refused(
        lambda: Gpu.objects.create(node=node, index=1, uuid="GPU-a", pci_address="0000:2a:00.0")
    )


def pool(**values) -> Pool:
    """A pool row written straight to the database (the services are bypassed here)."""
    return Pool.objects.create(
        **{"kind": "spot", "gpu_model": "H100", "fabric": "nvswitch", **values}
    )


def test_database_refuses_two_pools_on_one_rank_in_a_set(cluster, capacity_set):
    pool(name="a", cluster=cluster, capacity_set=capacity_set, rank=1)
    assert refused(lambda: pool(name="b", cluster=cluster, capacity_set=capacity_set, rank=1))


def test_database_refuses_two_standalone_pools_on_one_rank_in_a_cluster(cluster):
    pool(name="a", cluster=cluster, rank=1)
    assert refused(lambda: pool(name="b", cluster=cluster, rank=1))


def test_a_set_pool_and_a_standalone_pool_may_share_a_rank(cluster, capacity_set):
    pool(name="a", cluster=cluster, capacity_set=capacity_set, rank=1)
    pool(name="b", cluster=cluster, rank=1)
    assert Pool.objects.filter(rank=1).count() == 2


def test_a_well_formed_pool_row_is_accepted(cluster):
    assert not refused(lambda: pool(name="p", cluster=cluster, rank=1))


@pytest.mark.parametrize(
    "values",
    [
        {"rank": 0},
        {"rank": 1, "floor_gpus": -1},
        {"rank": 1, "kind": "batch"},
        {"rank": 1, "fabric": "nvlink"},
        {"rank": 1, "fabric": ""},
    ],
    ids=["rank-zero", "negative-floor", "unknown-kind", "unknown-fabric", "no-fabric"],
)
def test_database_refuses_a_malformed_pool(cluster, values):
    assert refused(lambda: pool(name="p", cluster=cluster, **values))


@pytest.mark.parametrize(
    "values", [{"notice_seconds": 0}, {"mode": "yolo"}, {"generation": -1}, {"fabric": "nvlink"}]
)
def test_database_refuses_a_malformed_capacity_set(cluster, values):
    values = {"cluster": cluster, "name": "s", "gpu_model": "H100", "fabric": "pcie", **values}
    assert refused(lambda: CapacitySet.objects.create(**values))


def test_new_capacity_sets_start_in_dry_run(capacity_set):
    assert capacity_set.mode == CapacitySet.Mode.DRY_RUN
    assert capacity_set.notice_seconds == 120


def test_database_refuses_a_membership_twice_or_with_an_unknown_role(member, tenant):
    assert refused(lambda: Membership.objects.create(user=member, tenant=tenant))
    other = type(tenant).objects.create(name="Other", slug="other")
    assert refused(lambda: Membership.objects.create(user=member, tenant=other, role="owner"))
