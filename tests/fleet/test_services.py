"""Fleet rules enforced by gpucap.fleet.services: clear errors that name the field, nothing
changed on refusal, generation bumped by every change that could alter a plan, audit events."""

import threading

import pytest
from django.core.exceptions import ValidationError
from django.db import connection

from gpucap.audit.models import AuditEvent
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet, Gpu, Node, Pool


def generation(capacity_set) -> int:
    return CapacitySet.objects.get(pk=capacity_set.pk).generation


def field_error(excinfo, field: str) -> str:
    return " ".join(excinfo.value.message_dict[field])


# --- nodes ------------------------------------------------------------------------------------


def test_node_create_generates_stable_gpus_with_hgx_pci_addresses(fleet_east):
    node = fleet_east["nodes"]["h100-001"]
    gpus = list(node.gpus.order_by("index"))
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[0].pci_address == "0000:18:00.0"
    assert gpus[7].pci_address == "0000:db:00.0"
    again = fleet.generated_gpu(cluster=node.cluster, hostname=node.hostname, index=3)
    assert gpus[3].uuid == again["uuid"]


def test_node_create_takes_listed_gpus_and_generates_the_rest(fleet_east):
    node = fleet.node_create(
        cluster=fleet_east["cluster"],
        hostname="l4-001",
        gpu_model="L4",
        fabric="pcie",
        gpu_count=2,
        gpus=[
            {"index": 1, "uuid": "GPU-listed", "pci_address": "0000:81:00.0", "health": "failed"}
        ],
    )
    listed = node.gpus.get(index=1)
    assert (listed.uuid, listed.pci_address, listed.health) == (
        "GPU-listed",
        "0000:81:00.0",
        "failed",
    )
    assert node.gpus.get(index=0).health == "ok"


@pytest.mark.parametrize(
    "changes,field,reason",
    [
        ({"gpu_count": 9}, "gpu_count", "between 1 and 8"),
        ({"gpu_count": 0}, "gpu_count", "between 1 and 8"),
        ({"fabric": "infiniband"}, "fabric", "unknown fabric"),
        ({"hostname": "h100-001"}, "hostname", "already exists"),
        ({"partitions": [[0, 1, 2]]}, "partitions", "1, 2, 4 or 8 GPUs"),
        ({"partitions": [[0, 9]]}, "partitions", "outside 0..7"),
        ({"partitions": [[0, 0]]}, "partitions", "names a GPU twice"),
        ({"partitions": [[0, 1], [1, 0]]}, "partitions", "listed twice"),
        ({"partitions": "0-7"}, "partitions", "non-empty list"),
        ({"fabric": "pcie", "partitions": [[0]]}, "partitions", "only NVSwitch"),
        ({"gpus": [{"index": 8}]}, "gpus", "out of range"),
        ({"state": "melted"}, "state", "unknown state"),
    ],
)
def test_node_create_refuses_bad_input_and_creates_nothing(fleet_east, changes, field, reason):
    values = {
        "cluster": fleet_east["cluster"],
        "hostname": "h100-099",
        "gpu_model": "H100-SXM5-80GB",
        "fabric": "nvswitch",
        "gpu_count": 8,
        **changes,
    }
    nodes, gpus = Node.objects.count(), Gpu.objects.count()
    with pytest.raises(ValidationError) as excinfo:
        fleet.node_create(**values)
    assert reason in field_error(excinfo, field)
    assert (Node.objects.count(), Gpu.objects.count()) == (nodes, gpus)


def test_cordon_and_uncordon_move_the_node_bump_the_set_and_are_audited(fleet_east, operator):
    node = fleet_east["nodes"]["h100-001"]
    h100 = fleet_east["sets"]["h100-east"]
    before = generation(h100)
    fleet.node_cordon(node=node, actor=operator)
    assert Node.objects.get(pk=node.pk).state == "cordoned"
    fleet.node_uncordon(node=node, actor=operator)
    assert Node.objects.get(pk=node.pk).state == "ready"
    assert generation(h100) == before + 2
    verbs = list(
        AuditEvent.objects.filter(object_type="node", object_id=str(node.pk))
        .order_by("id")
        .values_list("verb", "actor_label", "before", "after")
    )
    assert verbs[-2:] == [
        ("node.cordon", "olivia", {"state": "ready"}, {"state": "cordoned"}),
        ("node.uncordon", "olivia", {"state": "cordoned"}, {"state": "ready"}),
    ]


def test_cordoning_twice_is_harmless(fleet_east):
    node = fleet_east["nodes"]["h100-001"]
    fleet.node_cordon(node=node)
    events, gen = AuditEvent.objects.count(), generation(fleet_east["sets"]["h100-east"])
    fleet.node_cordon(node=node)
    assert AuditEvent.objects.count() == events
    assert generation(fleet_east["sets"]["h100-east"]) == gen


def test_a_down_node_comes_back_cordoned_not_ready(fleet_east):
    node = fleet_east["nodes"]["l40s-001"]
    fleet.node_set_state(node=node, state="down")
    with pytest.raises(Conflict, match="is down; it cannot become ready"):
        fleet.node_uncordon(node=node)
    assert Node.objects.get(pk=node.pk).state == "down"
    fleet.node_set_state(node=node, state="cordoned")
    assert Node.objects.get(pk=node.pk).state == "cordoned"


def test_changing_a_partition_table_bumps_the_generation(fleet_east):
    node = fleet_east["nodes"]["h100-001"]
    h100 = fleet_east["sets"]["h100-east"]
    before = generation(h100)
    fleet.node_update(node=node, partitions=[[0, 1, 2, 3, 4, 5, 6, 7], [0, 2], [1, 3]])
    assert generation(h100) == before + 1
    fleet.node_update(node=node, labels={"rack": "r12"})
    assert generation(h100) == before + 1
    assert Node.objects.get(pk=node.pk).labels == {"rack": "r12"}


def test_a_failed_gpu_bumps_its_sets_generation(fleet_east):
    gpu = fleet_east["nodes"]["h100-002"].gpus.get(index=5)
    before = generation(fleet_east["sets"]["h100-east"])
    fleet.gpu_set_health(gpu=gpu, health="failed")
    assert Gpu.objects.get(pk=gpu.pk).health == "failed"
    assert generation(fleet_east["sets"]["h100-east"]) == before + 1


# --- capacity sets ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "node_name,reason",
    [
        ("a100-001", "GPU model A100-SXM4-80GB is not the set's H100-SXM5-80GB"),
        ("l40s-001", "fabric pcie is not the set's nvswitch"),
    ],
)
def test_a_node_joins_only_a_set_of_its_model_and_fabric(fleet_east, node_name, reason):
    node = fleet_east["nodes"][node_name]
    if node.capacity_set_id:
        fleet.node_leave_set(node=node)
    with pytest.raises(ValidationError) as excinfo:
        fleet.node_join_set(node=node, capacity_set=fleet_east["sets"]["h100-east"])
    assert reason in field_error(excinfo, "capacity_set")
    assert Node.objects.get(pk=node.pk).capacity_set_id is None


def test_a_node_joins_only_a_set_of_its_own_cluster(fleet_east):
    west = fleet.cluster_create(name="west")
    stray = fleet.node_create(
        cluster=west,
        hostname="h100-w1",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
        gpu_count=8,
    )
    with pytest.raises(ValidationError) as excinfo:
        fleet.node_join_set(node=stray, capacity_set=fleet_east["sets"]["h100-east"])
    assert "cluster west is not the set's cluster east" in field_error(excinfo, "capacity_set")


def test_a_node_is_never_in_two_sets(fleet_east):
    h100 = fleet_east["sets"]["h100-east"]
    second = fleet.capacity_set_create(
        cluster=fleet_east["cluster"],
        name="h100-east-b",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
    )
    node = fleet_east["nodes"]["h100-001"]
    with pytest.raises(Conflict, match="already in capacity set h100-east"):
        fleet.node_join_set(node=node, capacity_set=second)
    assert Node.objects.get(pk=node.pk).capacity_set_id == h100.pk


def test_joining_and_leaving_bump_the_generation(fleet_east):
    h100 = fleet_east["sets"]["h100-east"]
    node = fleet_east["nodes"]["h100-001"]
    before = generation(h100)
    fleet.node_leave_set(node=node)
    fleet.node_join_set(node=node, capacity_set=h100)
    assert generation(h100) == before + 2


def test_a_node_cannot_leave_when_the_floors_would_no_longer_fit(fleet_east):
    h100 = fleet_east["sets"]["h100-east"]
    fleet.pool_set_floor(pool=fleet_east["pools"]["h100-spot"], floor_gpus=10)
    with pytest.raises(Conflict, match="less than its pools' floors"):
        fleet.node_leave_set(node=fleet_east["nodes"]["h100-002"])
    assert h100.nodes.count() == 2


def test_capacity_set_create_refuses_bad_input(fleet_east):
    with pytest.raises(ValidationError) as excinfo:
        fleet.capacity_set_create(
            cluster=fleet_east["cluster"],
            name="h100-east",
            gpu_model="",
            fabric="nvlink",
            notice_seconds=0,
        )
    errors = excinfo.value.message_dict
    assert set(errors) == {"name", "gpu_model", "fabric", "notice_seconds"}
    assert CapacitySet.objects.count() == 2


# --- pools ------------------------------------------------------------------------------------


def test_pool_create_refuses_a_rank_already_used_in_the_set(fleet_east):
    with pytest.raises(ValidationError) as excinfo:
        fleet.pool_create(
            name="h100-batch",
            kind="spot",
            cluster=fleet_east["cluster"],
            capacity_set=fleet_east["sets"]["h100-east"],
            rank=2,
        )
    assert "rank 2 is already used by another pool in capacity set h100-east" in field_error(
        excinfo, "rank"
    )
    assert not Pool.objects.filter(name="h100-batch").exists()


@pytest.mark.parametrize(
    "floor,reason", [(-1, "must be 0 or more"), (13, "exceeds the 16 GPUs of capacity set")]
)
def test_pool_floor_must_be_non_negative_and_fit_the_set(fleet_east, floor, reason):
    pool = fleet_east["pools"]["h100-spot"]
    before = generation(fleet_east["sets"]["h100-east"])
    with pytest.raises(ValidationError) as excinfo:
        fleet.pool_set_floor(pool=pool, floor_gpus=floor)
    assert reason in field_error(excinfo, "floor_gpus")
    assert Pool.objects.get(pk=pool.pk).floor_gpus == 0
    assert generation(fleet_east["sets"]["h100-east"]) == before


def test_setting_a_floor_bumps_the_generation_and_is_audited(fleet_east, operator):
    pool = fleet_east["pools"]["h100-spot"]
    before = generation(fleet_east["sets"]["h100-east"])
    fleet.pool_set_floor(pool=pool, floor_gpus=12, actor=operator)
    assert Pool.objects.get(pk=pool.pk).floor_gpus == 12
    assert generation(fleet_east["sets"]["h100-east"]) == before + 1
    event = AuditEvent.objects.filter(verb="pool.set_floor").get()
    assert (event.before, event.after) == ({"floor_gpus": 0}, {"floor_gpus": 12})


def test_rerank_swaps_ranks_atomically(fleet_east, operator):
    h100 = fleet_east["sets"]["h100-east"]
    before = generation(h100)
    fleet.pool_rerank(
        capacity_set=h100,
        pool_names=["h100-ondemand", "h100-inference", "h100-spot"],
        actor=operator,
    )
    ranks = dict(Pool.objects.filter(capacity_set=h100).values_list("name", "rank"))
    assert ranks == {"h100-ondemand": 1, "h100-inference": 2, "h100-spot": 3}
    assert generation(h100) == before + 1
    assert AuditEvent.objects.filter(verb="capacity_set.rerank").count() == 1


@pytest.mark.parametrize(
    "names,reason",
    [
        (["h100-ondemand", "h100-inference"], "missing: h100-spot"),
        (["h100-ondemand", "h100-inference", "h100-spot", "l40s-ondemand"], "not pools of"),
        (["h100-spot", "h100-spot", "h100-inference", "h100-ondemand"], "named more than once"),
    ],
)
def test_rerank_refuses_an_incomplete_or_wrong_order(fleet_east, names, reason):
    h100 = fleet_east["sets"]["h100-east"]
    before = dict(Pool.objects.filter(capacity_set=h100).values_list("name", "rank"))
    with pytest.raises(ValidationError) as excinfo:
        fleet.pool_rerank(capacity_set=h100, pool_names=names)
    assert reason in field_error(excinfo, "pools")
    assert dict(Pool.objects.filter(capacity_set=h100).values_list("name", "rank")) == before


def test_a_pool_cannot_name_a_set_of_another_cluster(fleet_east):
    west = fleet.cluster_create(name="west")
    with pytest.raises(ValidationError) as excinfo:
        fleet.pool_create(
            name="w",
            kind="spot",
            cluster=west,
            capacity_set=fleet_east["sets"]["h100-east"],
            rank=9,
        )
    assert "belongs to cluster east, not west" in field_error(excinfo, "capacity_set")


@pytest.mark.django_db(transaction=True)
def test_two_pools_created_at_once_on_one_rank_one_wins_cleanly(tenant, other_tenant):
    cluster = fleet.cluster_create(name="race")
    node = fleet.node_create(
        cluster=cluster, hostname="n1", gpu_model="H100", fabric="nvswitch", gpu_count=8
    )
    capacity_set = fleet.capacity_set_create(
        cluster=cluster, name="race-set", gpu_model="H100", fabric="nvswitch"
    )
    fleet.node_join_set(node=node, capacity_set=capacity_set)
    barrier = threading.Barrier(4)
    outcomes: list[str] = []

    def create(name: str) -> None:
        barrier.wait()
        try:
            fleet.pool_create(
                name=name, kind="spot", cluster=cluster, capacity_set=capacity_set, rank=1
            )
            outcomes.append("created")
        except ValidationError as exc:
            outcomes.append("refused: " + " ".join(exc.message_dict["rank"]))
        finally:
            connection.close()

    threads = [threading.Thread(target=create, args=(f"p{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count("created") == 1
    assert all("already used" in o for o in outcomes if o != "created")
    assert Pool.objects.filter(capacity_set=capacity_set).count() == 1
