"""The fleet REST API: who may read and change what, filters, commands, refused input that
changes nothing, and list endpoints with a fixed number of queries."""

import pytest

from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet, Cluster, Gpu, Node, Pool
from gpucap.tenancy.models import Membership

LIST_URLS = [
    "/api/clusters/",
    "/api/nodes/",
    "/api/gpus/",
    "/api/capacity-sets/",
    "/api/pools/",
]


def fleet_state() -> dict:
    """Every row an API write could touch, to prove a refused request changed nothing."""
    return {
        "clusters": list(Cluster.objects.order_by("pk").values()),
        "nodes": list(Node.objects.order_by("pk").values()),
        "gpus": list(Gpu.objects.order_by("pk").values()),
        "sets": list(CapacitySet.objects.order_by("pk").values()),
        "pools": list(Pool.objects.order_by("pk").values()),
        "pool_tenants": list(Pool.tenants.through.objects.order_by("pk").values()),
        "audit_events": AuditEvent.objects.count(),
    }


def error_fields(response) -> dict:
    assert set(response.data) == {"error"}, response.data
    return response.data["error"]["fields"]


def names(response) -> list[str]:
    return [row.get("name") or row.get("hostname") for row in response.data["results"]]


def generation(capacity_set: CapacitySet) -> int:
    return CapacitySet.objects.get(pk=capacity_set.pk).generation


# --- who may do what ----------------------------------------------------------------------------


@pytest.mark.parametrize("url", [*LIST_URLS, "/api/tenants/", "/api/"])
def test_anonymous_requests_are_refused_with_401(anonymous_api, fleet_east, url):
    response = anonymous_api.get(url)
    assert response.status_code == 401
    assert response.data["error"]["code"] == "not_authenticated"


def test_anonymous_cannot_run_a_command(anonymous_api, fleet_east):
    node = fleet_east["nodes"]["h100-001"]
    before = fleet_state()
    response = anonymous_api.post(f"/api/nodes/{node.pk}/cordon/")
    assert response.status_code == 401
    assert fleet_state() == before


@pytest.mark.parametrize(
    "url", ["/api/clusters/", "/api/nodes/", "/api/gpus/", "/api/capacity-sets/"]
)
def test_tenant_members_cannot_read_fleet_internals(member_api, fleet_east, url):
    response = member_api.get(url)
    assert response.status_code == 403
    assert response.data["error"]["code"] == "permission_denied"


def test_tenant_members_cannot_read_one_node_either(member_api, fleet_east):
    node = fleet_east["nodes"]["h100-001"]
    assert member_api.get(f"/api/nodes/{node.pk}/").status_code == 403
    assert member_api.get(f"/api/gpus/{node.gpus.first().pk}/").status_code == 403


def test_tenant_members_cannot_change_the_fleet(member_api, fleet_east):
    pool = fleet_east["pools"]["h100-spot"]
    node = fleet_east["nodes"]["h100-001"]
    before = fleet_state()
    attempts = [
        member_api.post(
            "/api/pools/",
            {"name": "mine", "kind": "spot", "cluster": fleet_east["cluster"].pk, "rank": 9},
            format="json",
        ),
        member_api.patch(f"/api/pools/{pool.pk}/", {"floor_gpus": 8}, format="json"),
        member_api.post(f"/api/pools/{pool.pk}/floor/", {"floor_gpus": 8}, format="json"),
        member_api.delete(f"/api/pools/{pool.pk}/"),
        member_api.post(f"/api/nodes/{node.pk}/cordon/"),
    ]
    assert [r.status_code for r in attempts] == [403] * len(attempts)
    assert fleet_state() == before


def test_tenant_member_lists_only_the_pools_their_tenant_may_use(member_api, fleet_east):
    response = member_api.get("/api/pools/")
    assert response.status_code == 200
    assert response.data["results"] == [
        {
            "id": fleet_east["pools"]["h100-spot"].pk,
            "name": "h100-spot",
            "kind": "spot",
            "gpu_model": "H100-SXM5-80GB",
            "fabric": "nvswitch",
            "tenants": ["acme"],
        }
    ]


def test_tenant_cannot_see_another_tenants_pool(member_api, other_member_api, fleet_east):
    globex_pool = fleet_east["pools"]["l40s-ondemand"]
    response = member_api.get(f"/api/pools/{globex_pool.pk}/")
    assert response.status_code == 404
    assert response.data["error"]["code"] == "not_found"
    assert names(other_member_api.get("/api/pools/")) == ["l40s-ondemand"]
    acme_pool = fleet_east["pools"]["h100-spot"]
    assert other_member_api.get(f"/api/pools/{acme_pool.pk}/").status_code == 404


def test_a_shared_pool_shows_a_member_only_their_own_tenant(
    member_api, operator_api, fleet_east, tenant, other_tenant
):
    pool = fleet_east["pools"]["h100-spot"]
    fleet.pool_set_tenants(pool=pool, tenants=[tenant, other_tenant])
    assert member_api.get(f"/api/pools/{pool.pk}/").data["tenants"] == ["acme"]
    assert operator_api.get(f"/api/pools/{pool.pk}/").data["tenants"] == ["acme", "globex"]


def test_a_member_sees_what_a_standalone_pool_rents(member_api, tenant, fleet_east):
    pool = fleet_east["pools"]["a100-standalone"]
    fleet.pool_set_tenants(pool=pool, tenants=[tenant])
    data = member_api.get(f"/api/pools/{pool.pk}/").data
    assert (data["gpu_model"], data["fabric"]) == ("A100-SXM4-80GB", "nvswitch")


def test_a_member_of_two_tenants_sees_the_pools_of_both_once(
    member, member_api, fleet_east, tenant, other_tenant
):
    Membership.objects.create(user=member, tenant=other_tenant)
    fleet.pool_set_tenants(pool=fleet_east["pools"]["h100-spot"], tenants=[tenant, other_tenant])
    response = member_api.get("/api/pools/")
    assert names(response) == ["h100-spot", "l40s-ondemand"]
    assert response.data["results"][0]["tenants"] == ["acme", "globex"]


def test_filtering_pools_by_an_unknown_cluster_tells_a_member_nothing(member_api, fleet_east):
    response = member_api.get("/api/pools/?cluster=987654")
    assert response.status_code == 200
    assert response.data["results"] == []


# --- clusters -----------------------------------------------------------------------------------


def test_operator_creates_a_cluster(operator_api, operator, db):
    response = operator_api.post(
        "/api/clusters/",
        {"name": "west", "driver": "libvirt", "driver_settings": {"uri": "qemu+ssh://{node}/"}},
        format="json",
    )
    assert response.status_code == 201
    assert response.data["name"] == "west"
    assert response.data["driver"] == "libvirt"
    assert response.data["node_count"] == 0
    assert response.data["gpu_total"] == 0
    event = AuditEvent.objects.get(verb="cluster.create")
    assert event.actor == operator


def test_cluster_list_counts_nodes_gpus_and_names_sets(operator_api, fleet_east):
    (east,) = operator_api.get("/api/clusters/").data["results"]
    assert east["node_count"] == 5
    assert east["gpu_total"] == 8 + 8 + 4 + 4 + 8
    assert east["capacity_sets"] == ["h100-east", "l40s-east"]


def test_operator_renames_a_cluster_and_changes_its_driver(operator_api, fleet_east):
    cluster = fleet_east["cluster"]
    response = operator_api.patch(
        f"/api/clusters/{cluster.pk}/",
        {"name": "east-1", "driver": "libvirt", "driver_settings": {"uri": "test:///default"}},
        format="json",
    )
    assert response.status_code == 200
    cluster.refresh_from_db()
    assert (cluster.name, cluster.driver) == ("east-1", "libvirt")
    assert cluster.driver_settings == {"uri": "test:///default"}
    assert response.data["node_count"] == 5


def test_cluster_create_refuses_a_taken_name(operator_api, fleet_east):
    before = fleet_state()
    response = operator_api.post("/api/clusters/", {"name": "east"}, format="json")
    assert response.status_code == 400
    assert error_fields(response) == {"name": ["a cluster named 'east' already exists"]}
    assert fleet_state() == before


def test_cluster_create_refuses_an_unknown_driver(operator_api, db):
    response = operator_api.post(
        "/api/clusters/", {"name": "west", "driver": "vmware"}, format="json"
    )
    assert response.status_code == 400
    assert error_fields(response) == {"driver": ["'vmware' is not one of: simulated, libvirt"]}
    assert not Cluster.objects.exists()


def test_deleting_a_cluster_in_use_is_a_409_naming_what_depends_on_it(operator_api, fleet_east):
    before = fleet_state()
    response = operator_api.delete(f"/api/clusters/{fleet_east['cluster'].pk}/")
    assert response.status_code == 409
    assert response.data["error"]["message"] == (
        "cluster east is still used by 2 capacity sets (h100-east, l40s-east), "
        "2 images (gpucap-model-server, ubuntu-24.04-cuda-12.6), "
        "5 nodes (a100-001, h100-001, h100-002, l40s-001, l40s-002) "
        "and 5 pools (a100-standalone, h100-inference, h100-ondemand, h100-spot, l40s-ondemand); "
        "remove those first"
    )
    assert fleet_state() == before


def test_deleting_an_empty_cluster(operator_api, operator, db):
    cluster = fleet.cluster_create(name="west")
    response = operator_api.delete(f"/api/clusters/{cluster.pk}/")
    assert response.status_code == 204
    assert not Cluster.objects.exists()
    assert AuditEvent.objects.filter(verb="cluster.delete", actor=operator).count() == 1


# --- nodes --------------------------------------------------------------------------------------


def node_body(fleet_east, **overrides) -> dict:
    body = {
        "cluster": fleet_east["cluster"].pk,
        "hostname": "h100-003",
        "gpu_model": "H100-SXM5-80GB",
        "fabric": "nvswitch",
        "gpu_count": 8,
    }
    return {**body, **overrides}


def test_operator_registers_a_node_with_some_gpus_listed(operator_api, fleet_east):
    body = node_body(
        fleet_east,
        bmc_address="10.0.0.3",
        labels={"rack": "r12"},
        gpus=[{"index": 0, "uuid": "GPU-aaaa", "pci_address": "0000:19:00.0", "health": "failed"}],
    )
    response = operator_api.post("/api/nodes/", body, format="json")
    assert response.status_code == 201
    node = response.data
    assert (node["hostname"], node["state"], node["cluster_name"]) == ("h100-003", "ready", "east")
    assert node["capacity_set"] is None
    assert node["labels"] == {"rack": "r12"}
    assert [gpu["index"] for gpu in node["gpus"]] == list(range(8))
    assert node["gpus"][0] | {"id": None} == {
        "id": None,
        "index": 0,
        "uuid": "GPU-aaaa",
        "pci_address": "0000:19:00.0",
        "module_id": None,
        "health": "failed",
    }
    assert node["gpus"][1]["uuid"].startswith("GPU-")
    assert node["gpus"][1]["health"] == "ok"


def test_node_detail_shows_its_cluster_set_and_gpus(operator_api, fleet_east):
    node = fleet_east["nodes"]["l40s-001"]
    data = operator_api.get(f"/api/nodes/{node.pk}/").data
    assert data["cluster_name"] == "east"
    assert data["capacity_set_name"] == "l40s-east"
    assert data["partitions"] is None
    assert [(g["index"], g["health"]) for g in data["gpus"]] == [(i, "ok") for i in range(4)]
    assert all(g["uuid"] and g["pci_address"] for g in data["gpus"])


@pytest.mark.parametrize("gpu_count", [0, 9])
def test_node_create_refuses_a_gpu_count_outside_1_to_8(operator_api, fleet_east, gpu_count):
    before = fleet_state()
    response = operator_api.post(
        "/api/nodes/", node_body(fleet_east, gpu_count=gpu_count), format="json"
    )
    assert response.status_code == 400
    assert error_fields(response)["gpu_count"] == [f"must be between 1 and 8, got {gpu_count}"]
    assert fleet_state() == before


@pytest.mark.parametrize(
    ("partitions", "reason"),
    [
        ([[0, 1, 2]], "partition 1 [0, 1, 2] has 3 GPUs"),
        ([[0, 9]], "partition 1 [0, 9] names GPU 9, outside 0..7"),
        ([[0, 0]], "partition 1 [0, 0] names a GPU twice"),
        ([[0, 1], [1, 0]], "partition 2 [1, 0] is listed twice"),
        ([], "must be a non-empty list of partitions"),
    ],
)
def test_node_create_refuses_a_malformed_partition_table(
    operator_api, fleet_east, partitions, reason
):
    before = fleet_state()
    response = operator_api.post(
        "/api/nodes/", node_body(fleet_east, partitions=partitions), format="json"
    )
    assert response.status_code == 400
    (problem,) = error_fields(response)["partitions"]
    assert reason in problem
    assert fleet_state() == before


def test_node_create_refuses_a_partition_table_that_is_not_a_list_of_lists(
    operator_api, fleet_east
):
    before = fleet_state()
    response = operator_api.post(
        "/api/nodes/", node_body(fleet_east, partitions=[[0, "x"]]), format="json"
    )
    assert response.status_code == 400
    assert error_fields(response) == {"partitions[0][1]": ["A valid integer is required."]}
    assert fleet_state() == before


def test_node_create_refuses_a_partition_table_on_a_pcie_node(operator_api, fleet_east):
    body = node_body(fleet_east, gpu_model="L40S", fabric="pcie", gpu_count=4, partitions=[[0]])
    response = operator_api.post("/api/nodes/", body, format="json")
    assert response.status_code == 400
    assert error_fields(response) == {"partitions": ["only NVSwitch nodes carry a partition table"]}


def test_node_create_refuses_a_malformed_gpu_listing(operator_api, fleet_east):
    before = fleet_state()
    body = node_body(fleet_east, gpus=[{"index": 0, "pci_address": "18:00.0", "colour": "red"}])
    response = operator_api.post("/api/nodes/", body, format="json")
    assert response.status_code == 400
    assert set(error_fields(response)) == {"gpus[0].colour"}
    body = node_body(fleet_east, gpus=[{"index": 0, "pci_address": "18:00.0"}])
    response = operator_api.post("/api/nodes/", body, format="json")
    assert error_fields(response) == {
        "gpus[0].pci_address": ["must be a PCI address like 0000:18:00.0 (lower-case hex)"]
    }
    assert fleet_state() == before


def test_node_create_refuses_a_hostname_taken_in_the_cluster(operator_api, fleet_east):
    before = fleet_state()
    response = operator_api.post(
        "/api/nodes/", node_body(fleet_east, hostname="h100-001"), format="json"
    )
    assert response.status_code == 400
    assert error_fields(response)["hostname"] == ["node 'h100-001' already exists in cluster east"]
    assert fleet_state() == before


def test_node_update_changes_partitions_and_labels_and_bumps_the_set(operator_api, fleet_east):
    node = fleet_east["nodes"]["h100-001"]
    h100 = fleet_east["sets"]["h100-east"]
    was = generation(h100)
    table = [[0, 1, 2, 3, 4, 5, 6, 7], [0, 2], [1, 3], [4, 6], [5, 7]]
    response = operator_api.patch(
        f"/api/nodes/{node.pk}/", {"partitions": table, "labels": {"rack": "r1"}}, format="json"
    )
    assert response.status_code == 200
    assert response.data["partitions"] == table
    assert response.data["labels"] == {"rack": "r1"}
    assert generation(h100) == was + 1


def test_node_update_refuses_a_state_change_and_names_the_commands(operator_api, fleet_east):
    node = fleet_east["nodes"]["h100-001"]
    before = fleet_state()
    response = operator_api.patch(f"/api/nodes/{node.pk}/", {"state": "down"}, format="json")
    assert response.status_code == 400
    assert error_fields(response) == {
        "state": ["change a node's state with the cordon/uncordon commands"]
    }
    assert fleet_state() == before


def test_cordon_and_uncordon_a_node(operator_api, operator, fleet_east):
    node = fleet_east["nodes"]["h100-001"]
    h100 = fleet_east["sets"]["h100-east"]
    was = generation(h100)
    response = operator_api.post(f"/api/nodes/{node.pk}/cordon/")
    assert response.status_code == 200
    assert response.data["state"] == "cordoned"
    assert response.data["gpus"]
    response = operator_api.post(f"/api/nodes/{node.pk}/uncordon/")
    assert response.data["state"] == "ready"
    assert generation(h100) == was + 2
    verbs = AuditEvent.objects.filter(actor=operator).values_list("verb", flat=True)
    assert sorted(verbs) == ["node.cordon", "node.uncordon"]


def test_uncordoning_a_down_node_is_a_conflict(operator_api, fleet_east):
    node = fleet.node_set_state(node=fleet_east["nodes"]["a100-001"], state="down")
    before = fleet_state()
    response = operator_api.post(f"/api/nodes/{node.pk}/uncordon/")
    assert response.status_code == 409
    assert response.data["error"]["message"] == "node a100-001 is down; it cannot become ready"
    assert fleet_state() == before


def test_a_standalone_node_joins_a_set_of_its_kind(operator_api, fleet_east):
    a100 = fleet.capacity_set_create(
        cluster=fleet_east["cluster"],
        name="a100-east",
        gpu_model="A100-SXM4-80GB",
        fabric="nvswitch",
    )
    node = fleet_east["nodes"]["a100-001"]
    response = operator_api.post(
        f"/api/nodes/{node.pk}/join-set/", {"capacity_set": a100.pk}, format="json"
    )
    assert response.status_code == 200
    assert response.data["capacity_set_name"] == "a100-east"
    assert generation(a100) == 1


def test_join_set_refuses_a_set_of_another_gpu_model(operator_api, fleet_east):
    node = fleet_east["nodes"]["a100-001"]
    before = fleet_state()
    response = operator_api.post(
        f"/api/nodes/{node.pk}/join-set/",
        {"capacity_set": fleet_east["sets"]["h100-east"].pk},
        format="json",
    )
    assert response.status_code == 400
    (reason,) = error_fields(response)["capacity_set"]
    assert "GPU model A100-SXM4-80GB is not the set's H100-SXM5-80GB" in reason
    assert fleet_state() == before


def test_join_set_refuses_a_set_of_another_fabric(operator_api, fleet_east):
    node = fleet.node_create(
        cluster=fleet_east["cluster"],
        hostname="h100-pcie-001",
        gpu_model="H100-SXM5-80GB",
        fabric="pcie",
        gpu_count=4,
    )
    before = fleet_state()
    response = operator_api.post(
        f"/api/nodes/{node.pk}/join-set/",
        {"capacity_set": fleet_east["sets"]["h100-east"].pk},
        format="json",
    )
    assert response.status_code == 400
    assert "fabric pcie is not the set's nvswitch" in error_fields(response)["capacity_set"][0]
    assert fleet_state() == before


def test_join_set_refuses_a_set_of_another_cluster(operator_api, fleet_east):
    west = fleet.cluster_create(name="west")
    node = fleet.node_create(
        cluster=west,
        hostname="h100-w01",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
        gpu_count=8,
    )
    before = fleet_state()
    response = operator_api.post(
        f"/api/nodes/{node.pk}/join-set/",
        {"capacity_set": fleet_east["sets"]["h100-east"].pk},
        format="json",
    )
    assert response.status_code == 400
    assert "cluster west is not the set's cluster east" in error_fields(response)["capacity_set"][0]
    assert fleet_state() == before


def test_join_set_refuses_a_node_already_in_another_set(operator_api, fleet_east):
    second = fleet.capacity_set_create(
        cluster=fleet_east["cluster"],
        name="h100-east-b",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
    )
    node = fleet_east["nodes"]["h100-001"]
    before = fleet_state()
    response = operator_api.post(
        f"/api/nodes/{node.pk}/join-set/", {"capacity_set": second.pk}, format="json"
    )
    assert response.status_code == 409
    assert response.data["error"]["code"] == "node_in_other_set"
    assert "already in capacity set h100-east" in response.data["error"]["message"]
    assert fleet_state() == before


def test_join_set_refuses_an_unknown_set(operator_api, fleet_east):
    node = fleet_east["nodes"]["a100-001"]
    before = fleet_state()
    response = operator_api.post(
        f"/api/nodes/{node.pk}/join-set/", {"capacity_set": 987654}, format="json"
    )
    assert response.status_code == 400
    assert list(error_fields(response)) == ["capacity_set"]
    assert fleet_state() == before


def test_a_node_leaves_its_set(operator_api, fleet_east):
    node = fleet_east["nodes"]["l40s-001"]
    response = operator_api.post(f"/api/nodes/{node.pk}/leave-set/")
    assert response.status_code == 200
    assert response.data["capacity_set"] is None
    assert response.data["capacity_set_name"] is None


def test_leave_set_refuses_to_break_the_sets_floors(operator_api, fleet_east):
    fleet.pool_set_floor(pool=fleet_east["pools"]["h100-inference"], floor_gpus=12)
    node = fleet_east["nodes"]["h100-001"]
    before = fleet_state()
    response = operator_api.post(f"/api/nodes/{node.pk}/leave-set/")
    assert response.status_code == 409
    assert "lower the floors first" in response.data["error"]["message"]
    assert fleet_state() == before


def test_deleting_a_node_in_a_set_is_refused_and_says_so(operator_api, fleet_east):
    node = fleet_east["nodes"]["h100-001"]
    before = fleet_state()
    response = operator_api.delete(f"/api/nodes/{node.pk}/")
    assert response.status_code == 409
    assert response.data["error"] == {
        "code": "node_in_set",
        "message": "node h100-001 is in capacity set h100-east; "
        "remove it from the set before deleting it",
        "fields": {},
    }
    assert fleet_state() == before


def test_deleting_a_standalone_node_removes_its_gpus(operator_api, fleet_east):
    node = fleet_east["nodes"]["a100-001"]
    response = operator_api.delete(f"/api/nodes/{node.pk}/")
    assert response.status_code == 204
    assert not Node.objects.filter(pk=node.pk).exists()
    assert not Gpu.objects.filter(node_id=node.pk).exists()
    assert AuditEvent.objects.filter(verb="node.delete", object_id=str(node.pk)).exists()


# --- GPUs ---------------------------------------------------------------------------------------


def test_marking_a_gpu_failed_bumps_its_set(operator_api, fleet_east):
    gpu = fleet_east["nodes"]["h100-002"].gpus.get(index=3)
    h100 = fleet_east["sets"]["h100-east"]
    was = generation(h100)
    response = operator_api.post(f"/api/gpus/{gpu.pk}/health/", {"health": "failed"}, format="json")
    assert response.status_code == 200
    assert response.data["health"] == "failed"
    assert response.data["node_hostname"] == "h100-002"
    assert generation(h100) == was + 1


def test_gpu_health_refuses_an_unknown_value(operator_api, fleet_east):
    gpu = fleet_east["nodes"]["h100-002"].gpus.get(index=3)
    before = fleet_state()
    response = operator_api.post(f"/api/gpus/{gpu.pk}/health/", {"health": "meh"}, format="json")
    assert response.status_code == 400
    assert error_fields(response) == {"health": ["'meh' is not one of: ok, failed"]}
    assert fleet_state() == before


def test_gpus_are_neither_created_nor_deleted_on_their_own(operator_api, fleet_east):
    gpu = fleet_east["nodes"]["h100-002"].gpus.first()
    before = fleet_state()
    assert operator_api.post("/api/gpus/", {"node": gpu.node_id}, format="json").status_code == 405
    assert operator_api.delete(f"/api/gpus/{gpu.pk}/").status_code == 405
    assert fleet_state() == before


# --- capacity sets ------------------------------------------------------------------------------


def test_operator_creates_a_capacity_set_that_starts_in_dry_run(operator_api, fleet_east):
    body = {
        "cluster": fleet_east["cluster"].pk,
        "name": "a100-east",
        "gpu_model": "A100-SXM4-80GB",
        "fabric": "nvswitch",
    }
    response = operator_api.post("/api/capacity-sets/", body, format="json")
    assert response.status_code == 201
    assert response.data["mode"] == "dry_run"
    assert response.data["notice_seconds"] == 120
    assert (response.data["node_count"], response.data["gpu_total"]) == (0, 0)
    assert response.data["pools"] == []


def test_a_capacity_set_cannot_be_created_in_enforce_mode(operator_api, fleet_east):
    before = fleet_state()
    body = {
        "cluster": fleet_east["cluster"].pk,
        "name": "a100-east",
        "gpu_model": "A100-SXM4-80GB",
        "fabric": "nvswitch",
        "mode": "enforce",
    }
    response = operator_api.post("/api/capacity-sets/", body, format="json")
    assert response.status_code == 400
    assert error_fields(response) == {"mode": ["a new capacity set always starts in dry_run"]}
    assert fleet_state() == before


def test_capacity_set_detail_summarises_nodes_gpus_and_pools_in_rank_order(
    operator_api, fleet_east
):
    h100 = fleet_east["sets"]["h100-east"]
    data = operator_api.get(f"/api/capacity-sets/{h100.pk}/").data
    assert (data["cluster_name"], data["node_count"], data["gpu_total"]) == ("east", 2, 16)
    assert [(p["name"], p["kind"], p["rank"], p["floor_gpus"]) for p in data["pools"]] == [
        ("h100-inference", "inference", 1, 4),
        ("h100-ondemand", "on_demand", 2, 0),
        ("h100-spot", "spot", 3, 0),
    ]


def test_operator_changes_a_sets_notice(operator_api, fleet_east):
    h100 = fleet_east["sets"]["h100-east"]
    response = operator_api.patch(
        f"/api/capacity-sets/{h100.pk}/", {"notice_seconds": 300}, format="json"
    )
    assert response.status_code == 200
    assert response.data["notice_seconds"] == 300
    assert response.data["gpu_total"] == 16


@pytest.mark.parametrize("body", [{"notice_seconds": 0}, {"mode": "enforce"}])
def test_capacity_set_update_refuses_a_zero_notice_or_a_mode_switch(operator_api, fleet_east, body):
    h100 = fleet_east["sets"]["h100-east"]
    before = fleet_state()
    response = operator_api.patch(f"/api/capacity-sets/{h100.pk}/", body, format="json")
    assert response.status_code == 400
    assert list(error_fields(response)) == list(body)
    assert fleet_state() == before


def test_rerank_reorders_the_sets_pools(operator_api, operator, fleet_east):
    h100 = fleet_east["sets"]["h100-east"]
    was = generation(h100)
    response = operator_api.post(
        f"/api/capacity-sets/{h100.pk}/rerank/",
        {"pools": ["h100-ondemand", "h100-inference", "h100-spot"]},
        format="json",
    )
    assert response.status_code == 200
    assert [(p["name"], p["rank"]) for p in response.data["pools"]] == [
        ("h100-ondemand", 1),
        ("h100-inference", 2),
        ("h100-spot", 3),
    ]
    assert generation(h100) == was + 1
    assert AuditEvent.objects.filter(verb="capacity_set.rerank", actor=operator).exists()


@pytest.mark.parametrize(
    ("order", "reason"),
    [
        (["h100-ondemand", "h100-inference"], "missing: h100-spot"),
        (["h100-ondemand", "h100-inference", "h100-spot", "l40s-ondemand"], "l40s-ondemand"),
        (["h100-ondemand", "h100-inference", "h100-spot", "h100-spot"], "named more than once"),
        (["h100-ondemand", "h100-inference", "nope"], "not pools of h100-east: nope"),
    ],
)
def test_rerank_refuses_a_missing_unknown_or_repeated_pool(operator_api, fleet_east, order, reason):
    h100 = fleet_east["sets"]["h100-east"]
    before = fleet_state()
    response = operator_api.post(
        f"/api/capacity-sets/{h100.pk}/rerank/", {"pools": order}, format="json"
    )
    assert response.status_code == 400
    (problem,) = error_fields(response)["pools"]
    assert reason in problem
    assert fleet_state() == before


def test_deleting_a_set_with_nodes_and_pools_is_a_409_naming_them(operator_api, fleet_east):
    l40s = fleet_east["sets"]["l40s-east"]
    before = fleet_state()
    response = operator_api.delete(f"/api/capacity-sets/{l40s.pk}/")
    assert response.status_code == 409
    assert response.data["error"]["message"] == (
        "capacity set l40s-east is still used by 2 nodes (l40s-001, l40s-002) "
        "and 1 pool (l40s-ondemand); remove those first"
    )
    assert fleet_state() == before


def test_deleting_an_empty_set(operator_api, fleet_east):
    empty = fleet.capacity_set_create(
        cluster=fleet_east["cluster"], name="spare", gpu_model="L4", fabric="pcie"
    )
    assert operator_api.delete(f"/api/capacity-sets/{empty.pk}/").status_code == 204
    assert not CapacitySet.objects.filter(pk=empty.pk).exists()


# --- pools --------------------------------------------------------------------------------------


def pool_body(fleet_east, **overrides) -> dict:
    body = {
        "name": "h100-batch",
        "kind": "spot",
        "cluster": fleet_east["cluster"].pk,
        "capacity_set": fleet_east["sets"]["h100-east"].pk,
        "rank": 4,
        "floor_gpus": 2,
    }
    return {**body, **overrides}


def test_operator_creates_a_pool_in_a_set(operator_api, fleet_east):
    response = operator_api.post("/api/pools/", pool_body(fleet_east), format="json")
    assert response.status_code == 201
    data = response.data
    assert (data["capacity_set_name"], data["gpu_model"], data["fabric"]) == (
        "h100-east",
        "H100-SXM5-80GB",
        "nvswitch",
    )
    assert (data["rank"], data["floor_gpus"], data["tenants"]) == (4, 2, [])


def test_operator_creates_a_standalone_pool_naming_its_gpus(operator_api, fleet_east):
    body = pool_body(
        fleet_east,
        name="a100-spot",
        capacity_set=None,
        rank=2,
        gpu_model="A100-SXM4-80GB",
        fabric="nvswitch",
    )
    response = operator_api.post("/api/pools/", body, format="json")
    assert response.status_code == 201
    data = response.data
    assert (data["capacity_set"], data["gpu_model"], data["fabric"]) == (
        None,
        "A100-SXM4-80GB",
        "nvswitch",
    )
    pool = Pool.objects.get(name="a100-spot")
    assert (pool.gpu_model, pool.fabric) == ("A100-SXM4-80GB", "nvswitch")


def test_a_standalone_pool_must_name_its_gpu_model_and_fabric(operator_api, fleet_east):
    before = fleet_state()
    body = pool_body(fleet_east, name="a100-spot", capacity_set=None, rank=2)
    response = operator_api.post("/api/pools/", body, format="json")
    assert response.status_code == 400
    assert error_fields(response) == {
        "gpu_model": ["a standalone pool must name the GPU model it rents"],
        "fabric": ["a standalone pool must name its fabric: pcie or nvswitch, got ''"],
    }
    assert fleet_state() == before


def test_a_pool_in_a_set_takes_the_sets_gpus_and_refuses_others(operator_api, fleet_east):
    response = operator_api.post(
        "/api/pools/", pool_body(fleet_east, gpu_model="H100-SXM5-80GB"), format="json"
    )
    assert response.status_code == 201
    assert response.data["fabric"] == "nvswitch"

    before = fleet_state()
    body = pool_body(fleet_east, name="h100-other", rank=5, gpu_model="L40S", fabric="pcie")
    response = operator_api.post("/api/pools/", body, format="json")
    assert response.status_code == 400
    assert error_fields(response) == {
        "gpu_model": ["a pool of h100-east rents its H100-SXM5-80GB, not L40S"],
        "fabric": ["a pool of h100-east rents its nvswitch, not pcie"],
    }
    assert fleet_state() == before


def test_pool_create_refuses_an_unknown_fabric(operator_api, fleet_east):
    before = fleet_state()
    body = pool_body(fleet_east, capacity_set=None, gpu_model="A100-SXM4-80GB", fabric="nvlink")
    response = operator_api.post("/api/pools/", body, format="json")
    assert response.status_code == 400
    assert error_fields(response) == {"fabric": ["'nvlink' is not one of: pcie, nvswitch"]}
    assert fleet_state() == before


@pytest.mark.parametrize(
    ("overrides", "field", "reason"),
    [
        ({"rank": 2}, "rank", "rank 2 is already used by another pool in capacity set h100-east"),
        ({"rank": 0}, "rank", "must be a whole number of at least 1"),
        ({"floor_gpus": -1}, "floor_gpus", "must be 0 or more GPUs, got -1"),
        ({"floor_gpus": 13}, "floor_gpus", "exceeds the 16 GPUs of capacity set h100-east"),
        ({"kind": "batch"}, "kind", "'batch' is not one of: on_demand, spot, inference"),
        ({"name": "h100-spot"}, "name", "a pool named 'h100-spot' already exists"),
    ],
)
def test_pool_create_refuses_bad_input(operator_api, fleet_east, overrides, field, reason):
    before = fleet_state()
    response = operator_api.post("/api/pools/", pool_body(fleet_east, **overrides), format="json")
    assert response.status_code == 400
    fields = error_fields(response)
    assert list(fields) == [field]
    assert reason in fields[field][0]
    assert fleet_state() == before


def test_pool_create_refuses_a_set_of_another_cluster(operator_api, fleet_east):
    west = fleet.cluster_create(name="west")
    before = fleet_state()
    response = operator_api.post(
        "/api/pools/", pool_body(fleet_east, cluster=west.pk), format="json"
    )
    assert response.status_code == 400
    assert error_fields(response) == {
        "capacity_set": ["capacity set h100-east belongs to cluster east, not west"]
    }
    assert fleet_state() == before


def test_operator_changes_a_pools_floor_and_tenants(operator_api, fleet_east):
    pool = fleet_east["pools"]["h100-ondemand"]
    response = operator_api.patch(
        f"/api/pools/{pool.pk}/", {"floor_gpus": 8, "tenants": ["globex", "acme"]}, format="json"
    )
    assert response.status_code == 200
    assert response.data["floor_gpus"] == 8
    assert response.data["tenants"] == ["acme", "globex"]


def test_pool_update_refuses_an_unknown_tenant(operator_api, fleet_east):
    pool = fleet_east["pools"]["h100-ondemand"]
    before = fleet_state()
    response = operator_api.patch(
        f"/api/pools/{pool.pk}/", {"floor_gpus": 2, "tenants": ["acme", "initech"]}, format="json"
    )
    assert response.status_code == 400
    assert list(error_fields(response)) == ["tenants"]
    assert fleet_state() == before


def test_pool_update_changes_nothing_when_the_floor_is_refused(operator_api, fleet_east):
    pool = fleet_east["pools"]["h100-ondemand"]
    before = fleet_state()
    response = operator_api.patch(
        f"/api/pools/{pool.pk}/", {"floor_gpus": 13, "tenants": ["globex"]}, format="json"
    )
    assert response.status_code == 400
    assert list(error_fields(response)) == ["floor_gpus"]
    assert fleet_state() == before


def test_pool_rank_is_not_changed_by_update(operator_api, fleet_east):
    pool = fleet_east["pools"]["h100-spot"]
    response = operator_api.patch(f"/api/pools/{pool.pk}/", {"rank": 1}, format="json")
    assert response.status_code == 400
    assert error_fields(response) == {
        "rank": ["re-rank a set's pools with the capacity set's rerank command"]
    }


def test_floor_command_sets_a_floor_and_bumps_the_set(operator_api, fleet_east):
    pool = fleet_east["pools"]["h100-spot"]
    h100 = fleet_east["sets"]["h100-east"]
    was = generation(h100)
    response = operator_api.post(f"/api/pools/{pool.pk}/floor/", {"floor_gpus": 6}, format="json")
    assert response.status_code == 200
    assert response.data["floor_gpus"] == 6
    assert generation(h100) == was + 1


@pytest.mark.parametrize(
    ("floor", "reason"),
    [
        (-1, "must be 0 or more GPUs, got -1"),
        (13, "a floor of 13 GPUs plus the other pools' floors (4) exceeds the 16 GPUs"),
    ],
)
def test_floor_command_refuses_a_negative_or_oversized_floor(
    operator_api, fleet_east, floor, reason
):
    pool = fleet_east["pools"]["h100-spot"]
    before = fleet_state()
    response = operator_api.post(
        f"/api/pools/{pool.pk}/floor/", {"floor_gpus": floor}, format="json"
    )
    assert response.status_code == 400
    assert reason in error_fields(response)["floor_gpus"][0]
    assert fleet_state() == before


def test_deleting_a_pool_bumps_its_set(operator_api, fleet_east):
    pool = fleet_east["pools"]["h100-spot"]
    h100 = fleet_east["sets"]["h100-east"]
    was = generation(h100)
    assert operator_api.delete(f"/api/pools/{pool.pk}/").status_code == 204
    assert not Pool.objects.filter(pk=pool.pk).exists()
    assert generation(h100) == was + 1


# --- filters ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", ["a100-001", "h100-001", "h100-002", "l40s-001", "l40s-002"]),
        ("?fabric=pcie", ["l40s-001", "l40s-002"]),
        ("?gpu_model=H100-SXM5-80GB", ["h100-001", "h100-002"]),
        ("?standalone=true", ["a100-001"]),
        ("?hostname=h100-002", ["h100-002"]),
        ("?hostname__icontains=L40S", ["l40s-001", "l40s-002"]),
        ("?state=cordoned", ["h100-002"]),
    ],
)
def test_nodes_filter(operator_api, fleet_east, query, expected):
    fleet.node_cordon(node=fleet_east["nodes"]["h100-002"])
    assert names(operator_api.get(f"/api/nodes/{query}")) == expected


def test_nodes_filter_by_cluster_and_set(operator_api, fleet_east):
    fleet.cluster_create(name="west")
    l40s = fleet_east["sets"]["l40s-east"]
    cluster = fleet_east["cluster"]
    assert names(operator_api.get(f"/api/nodes/?capacity_set={l40s.pk}")) == [
        "l40s-001",
        "l40s-002",
    ]
    assert len(names(operator_api.get(f"/api/nodes/?cluster={cluster.pk}"))) == 5
    west = Cluster.objects.get(name="west")
    assert names(operator_api.get(f"/api/nodes/?cluster={west.pk}")) == []


def test_a_bad_filter_value_is_a_400_naming_the_parameter(operator_api, fleet_east):
    response = operator_api.get("/api/nodes/?state=sleepy&cluster=abc")
    assert response.status_code == 400
    assert set(error_fields(response)) == {"state", "cluster"}


def test_gpus_filter_by_node_and_health(operator_api, fleet_east):
    node = fleet_east["nodes"]["h100-002"]
    fleet.gpu_set_health(gpu=node.gpus.get(index=5), health="failed")
    by_node = operator_api.get(f"/api/gpus/?node={node.pk}").data["results"]
    assert [g["index"] for g in by_node] == list(range(8))
    failed = operator_api.get("/api/gpus/?health=failed").data["results"]
    assert [(g["node_hostname"], g["index"]) for g in failed] == [("h100-002", 5)]


def test_capacity_sets_filter_by_fabric_mode_and_cluster(operator_api, fleet_east):
    cluster = fleet_east["cluster"]
    assert names(operator_api.get("/api/capacity-sets/?fabric=pcie")) == ["l40s-east"]
    assert names(operator_api.get("/api/capacity-sets/?mode=enforce")) == []
    assert names(operator_api.get(f"/api/capacity-sets/?cluster={cluster.pk}")) == [
        "h100-east",
        "l40s-east",
    ]


def test_pools_filter_by_kind_set_and_cluster(operator_api, fleet_east):
    h100 = fleet_east["sets"]["h100-east"]
    assert names(operator_api.get("/api/pools/?kind=on_demand")) == [
        "h100-ondemand",
        "l40s-ondemand",
        "a100-standalone",
    ]
    assert names(operator_api.get(f"/api/pools/?capacity_set={h100.pk}")) == [
        "h100-inference",
        "h100-ondemand",
        "h100-spot",
    ]
    assert names(operator_api.get("/api/pools/?standalone=true")) == ["a100-standalone"]
    assert names(operator_api.get("/api/pools/?gpu_model=A100-SXM4-80GB")) == ["a100-standalone"]
    assert names(operator_api.get("/api/pools/?fabric=pcie")) == ["l40s-ondemand"]
    cluster = fleet_east["cluster"]
    assert len(names(operator_api.get(f"/api/pools/?cluster={cluster.pk}"))) == 5


# --- query counts -------------------------------------------------------------------------------


def grow_fleet(tenant) -> None:
    """A second cluster with a set, nodes, GPUs and pools: more rows of every kind."""
    west = fleet.cluster_create(name="west")
    b200 = fleet.capacity_set_create(
        cluster=west, name="b200-west", gpu_model="B200", fabric="nvswitch"
    )
    for number in range(3):
        node = fleet.node_create(
            cluster=west,
            hostname=f"b200-{number}",
            gpu_model="B200",
            fabric="nvswitch",
            gpu_count=8,
        )
        fleet.node_join_set(node=node, capacity_set=b200)
    for rank, kind in enumerate(["inference", "on_demand", "spot"], start=1):
        pool = fleet.pool_create(
            name=f"b200-{kind}", kind=kind, cluster=west, capacity_set=b200, rank=rank
        )
        fleet.pool_set_tenants(pool=pool, tenants=[tenant])


# Per list: COUNT for the page, the rows, and one prefetch where rows carry a list.
LIST_QUERIES = {
    "/api/clusters/": 3,
    "/api/nodes/": 3,
    "/api/gpus/": 2,
    "/api/capacity-sets/": 3,
    "/api/pools/": 3,
}


@pytest.mark.parametrize("url", LIST_URLS)
def test_operator_list_endpoints_run_a_fixed_number_of_queries(
    operator_api, fleet_east, tenant, django_assert_num_queries, url
):
    operator_api.get(url)  # the first request caches the user's role
    with django_assert_num_queries(LIST_QUERIES[url]):
        small = operator_api.get(url).data["count"]
    grow_fleet(tenant)
    with django_assert_num_queries(LIST_QUERIES[url]):
        large = operator_api.get(url).data["count"]
    assert large > small


def test_member_pool_list_runs_a_fixed_number_of_queries(
    member_api, fleet_east, tenant, django_assert_num_queries
):
    member_api.get("/api/pools/")  # the first request caches the user's tenants
    with django_assert_num_queries(3):
        assert member_api.get("/api/pools/").data["count"] == 1
    grow_fleet(tenant)
    with django_assert_num_queries(3):
        assert member_api.get("/api/pools/").data["count"] == 4
