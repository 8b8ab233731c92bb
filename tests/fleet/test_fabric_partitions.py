"""Fabric Manager's names in the fleet: each GPU's module id (services, REST API, fleet file,
database), and ``manage.py fabric_partitions_import`` storing a node's partition table from
Fabric Manager's listing — mapped to GPU indices, unsupported partitions left out, every problem
named and nothing changed on refusal, audited like any fleet change."""

import sys
import textwrap
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction
from django.urls import reverse

from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet, Gpu, Node
from tests.conftest import PASSWORD

LISTING = Path(__file__).parents[1] / "drivers" / "fixtures" / "nv_partitioner_hgx_h100.txt"

# How an HGX board might number its cards: Fabric Manager's module id of GPU index 0..7.
MODULE_OF_INDEX = {0: 2, 1: 4, 2: 1, 3: 3, 4: 6, 5: 8, 6: 5, 7: 7}


@pytest.fixture
def hgx(fleet_east) -> Node:
    """h100-001 with every GPU's module id set."""
    node = fleet_east["nodes"]["h100-001"]
    fleet.node_set_module_ids(node=node, module_ids=MODULE_OF_INDEX)
    return Node.objects.get(pk=node.pk)


def node_state(node: Node) -> dict:
    node = Node.objects.get(pk=node.pk)
    return {
        "partitions": node.partitions,
        "ids": node.fabric_partition_ids,
        "generation": CapacitySet.objects.get(pk=node.capacity_set_id).generation,
        "modules": list(node.gpus.order_by("index").values_list("module_id", flat=True)),
        "audit": AuditEvent.objects.count(),
    }


def import_listing(hostname: str, path, *args, stdin: str | None = None) -> str:
    out = StringIO()
    if stdin is not None:
        original = sys.stdin
        sys.stdin = StringIO(stdin)
        try:
            call_command("fabric_partitions_import", hostname, "-", *args, stdout=out)
        finally:
            sys.stdin = original
    else:
        call_command("fabric_partitions_import", hostname, str(path), *args, stdout=out)
    return out.getvalue()


def refused_import(hostname: str, path) -> str:
    with pytest.raises(CommandError) as excinfo:
        import_listing(hostname, path)
    return str(excinfo.value)


def listing(tmp_path, rows: str) -> Path:
    path = tmp_path / "listing.txt"
    path.write_text(
        "Partition ID   Number of GPUs GPU Module ID            Max NVLinks/GPU     STATUS\n"
        + "-" * 80
        + "\n"
        + textwrap.dedent(rows)
    )
    return path


# --- module ids ---------------------------------------------------------------------------------


def test_module_ids_are_set_together_so_two_cards_may_swap(hgx):
    fleet.node_set_module_ids(node=hgx, module_ids={0: 4, 1: 2})

    assert list(hgx.gpus.order_by("index").values_list("module_id", flat=True))[:2] == [4, 2]
    event = AuditEvent.objects.filter(verb="gpu.module_id").latest("pk")
    assert (event.before, event.after) == ({"gpu0": 2, "gpu1": 4}, {"gpu0": 4, "gpu1": 2})


@pytest.mark.parametrize(
    "module_ids,field,reason",
    [
        ({0: 9}, "module_id", "GPU 0: must be 1..8 (Fabric Manager counts modules from 1), got 9"),
        ({0: 0}, "module_id", "must be 1..8"),
        ({0: "2"}, "module_id", "must be a whole number 1..8 or null, got '2'"),
        ({0: 4}, "module_id", "module 4 is given to GPU 0 and GPU 1; each card has its own"),
        ({8: 1}, "index", "GPU 8 is not a GPU of h100-001 (0..7)"),
    ],
)
def test_bad_module_ids_are_refused_by_field_and_change_nothing(hgx, module_ids, field, reason):
    before = node_state(hgx)

    with pytest.raises(ValidationError) as excinfo:
        fleet.node_set_module_ids(node=hgx, module_ids=module_ids)

    assert reason in " ".join(excinfo.value.message_dict[field])
    assert node_state(hgx) == before


def test_a_node_registered_with_module_ids_keeps_them(fleet_east):
    node = fleet.node_create(
        cluster=fleet_east["cluster"],
        hostname="h100-009",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
        gpu_count=2,
        gpus=[{"index": 0, "module_id": 2}, {"index": 1, "module_id": 1}],
    )

    assert list(node.gpus.order_by("index").values_list("module_id", flat=True)) == [2, 1]


def test_a_node_registered_with_one_module_id_twice_is_refused(fleet_east):
    with pytest.raises(ValidationError) as excinfo:
        fleet.node_create(
            cluster=fleet_east["cluster"],
            hostname="h100-009",
            gpu_model="H100-SXM5-80GB",
            fabric="nvswitch",
            gpu_count=2,
            gpus=[{"index": 0, "module_id": 1}, {"index": 1, "module_id": 1}],
        )

    assert "module 1 is given to GPU 0 and GPU 1" in excinfo.value.message_dict["gpus"][0]
    assert not Node.objects.filter(hostname="h100-009").exists()


def test_the_database_holds_module_ids_to_1_to_8_and_once_per_node(hgx):
    gpu = hgx.gpus.get(index=0)
    with pytest.raises(IntegrityError), transaction.atomic():
        Gpu.objects.filter(pk=gpu.pk).update(module_id=9)
    with pytest.raises(IntegrityError), transaction.atomic():
        Gpu.objects.filter(pk=gpu.pk).update(module_id=MODULE_OF_INDEX[1])


def test_the_database_holds_one_fabric_id_per_partition(fleet_east):
    node = fleet_east["nodes"]["h100-002"]  # carries a 15-partition table
    with pytest.raises(IntegrityError), transaction.atomic():
        Node.objects.filter(pk=node.pk).update(fabric_partition_ids=[0, 1])
    standalone = fleet_east["nodes"]["a100-001"]  # the default table: nothing to name
    with pytest.raises(IntegrityError), transaction.atomic():
        Node.objects.filter(pk=standalone.pk).update(fabric_partition_ids=[0])


# --- the REST API -------------------------------------------------------------------------------


def test_operator_sets_and_clears_a_gpus_module_id(operator_api, operator, fleet_east):
    gpu = fleet_east["nodes"]["h100-001"].gpus.get(index=3)

    set_ = operator_api.post(f"/api/gpus/{gpu.pk}/module-id/", {"module_id": 7}, format="json")
    shown = operator_api.get(f"/api/nodes/{gpu.node_id}/").data["gpus"][3]["module_id"]
    cleared = operator_api.post(
        f"/api/gpus/{gpu.pk}/module-id/", {"module_id": None}, format="json"
    )

    assert set_.status_code == 200
    assert set_.data["module_id"] == 7
    assert shown == 7
    assert cleared.data["module_id"] is None
    event = AuditEvent.objects.filter(verb="gpu.module_id").latest("pk")
    assert event.actor_id == operator.pk


@pytest.mark.parametrize(
    "body,reason",
    [
        ({"module_id": 9}, "must be 1..8"),
        ({"module_id": "seven"}, "A valid integer is required"),
        ({}, "This field is required"),
    ],
)
def test_a_bad_module_id_is_a_400_naming_the_field(operator_api, fleet_east, body, reason):
    gpu = fleet_east["nodes"]["h100-001"].gpus.get(index=3)

    response = operator_api.post(f"/api/gpus/{gpu.pk}/module-id/", body, format="json")

    assert response.status_code == 400
    assert reason in " ".join(response.data["error"]["fields"]["module_id"])
    assert Gpu.objects.get(pk=gpu.pk).module_id is None


def test_a_module_id_another_card_of_the_node_has_is_a_400(operator_api, hgx):
    gpu = hgx.gpus.get(index=0)

    response = operator_api.post(
        f"/api/gpus/{gpu.pk}/module-id/", {"module_id": MODULE_OF_INDEX[5]}, format="json"
    )

    assert response.status_code == 400
    problems = response.data["error"]["fields"]["module_id"]
    assert "module 8 is given to GPU 0 and GPU 5" in problems[0]


def test_tenant_members_cannot_set_a_module_id(member_api, other_member_api, fleet_east):
    gpu = fleet_east["nodes"]["h100-001"].gpus.get(index=3)

    attempts = [
        client.post(f"/api/gpus/{gpu.pk}/module-id/", {"module_id": 1}, format="json")
        for client in (member_api, other_member_api)
    ]

    assert [r.status_code for r in attempts] == [403, 403]
    assert Gpu.objects.get(pk=gpu.pk).module_id is None


def test_operator_registers_a_node_with_module_ids(operator_api, fleet_east):
    body = {
        "cluster": fleet_east["cluster"].pk,
        "hostname": "h100-010",
        "gpu_model": "H100-SXM5-80GB",
        "fabric": "nvswitch",
        "gpu_count": 2,
        "gpus": [{"index": 0, "module_id": 2}, {"index": 1, "module_id": 1}],
    }

    response = operator_api.post("/api/nodes/", body, format="json")

    assert response.status_code == 201, response.data
    assert [g["module_id"] for g in response.data["gpus"]] == [2, 1]
    assert response.data["fabric_partition_ids"] is None


# --- importing Fabric Manager's listing ----------------------------------------------------------


def test_import_maps_module_ids_to_gpu_indices_and_leaves_out_unsupported_partitions(hgx):
    generation = node_state(hgx)["generation"]

    output = import_listing("h100-001", LISTING)

    node = Node.objects.get(pk=hgx.pk)
    assert node.partitions == [
        [0, 1, 2, 3, 4, 5, 6, 7],
        [0, 1, 2, 3],  # modules 1-4
        [4, 5, 6, 7],  # modules 5-8
        [2, 3],  # modules 1, 3
        [0, 1],  # modules 2, 4
        [6, 7],  # modules 5, 7
        [2],  # module 1
        [0],
        [3],
        [1],
        [6],
        [4],
        [7],
        [5],
    ]
    assert node.fabric_partition_ids == [0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14]
    assert "left out partition 6 (modules 6, 8): the listing marks it unsupported" in output
    assert "partition 3: GPUs 2, 3" in output
    assert output.rstrip().endswith(
        "h100-001: 14 partitions from Fabric Manager stored, 1 unsupported left out"
    )
    assert node_state(hgx)["generation"] == generation + 1
    event = AuditEvent.objects.get(verb="node.fabric_partitions")
    assert event.after["fabric_partition_ids"] == node.fabric_partition_ids
    assert event.before == {"partitions": None, "fabric_partition_ids": None}


def test_the_driver_finds_a_vms_partition_by_its_gpus(hgx):
    import_listing("h100-001", LISTING)
    node = Node.objects.get(pk=hgx.pk)

    assert node.fabric_partition_id([3, 2]) == 3
    assert node.fabric_partition_id([0, 1, 2, 3]) == 1
    assert node.fabric_partition_id([4, 5]) is None  # unsupported: not in the table
    assert Node.objects.get(hostname="a100-001").fabric_partition_id([0, 1]) is None


def test_importing_the_same_listing_twice_changes_nothing_the_second_time(hgx):
    import_listing("h100-001", LISTING)
    after_first = node_state(hgx)

    import_listing("h100-001", LISTING)

    assert node_state(hgx) == after_first


def test_the_listing_may_come_from_standard_input(hgx):
    output = import_listing("h100-001", None, stdin=LISTING.read_text())

    assert "14 partitions from Fabric Manager stored" in output


def test_a_partition_naming_an_unknown_module_is_refused_and_nothing_changes(hgx, tmp_path):
    fleet.node_set_module_ids(node=hgx, module_ids={5: None})  # module 8 not known
    before = node_state(hgx)

    message = refused_import("h100-001", LISTING)

    assert message.splitlines() == [
        "h100-001: the partition table was not changed:",
        "Fabric Manager partition 0 (modules 1, 2, 3, 4, 5, 6, 7, 8) names module 8, which no "
        "GPU of h100-001 carries (its GPUs carry modules 1, 2, 3, 4, 5, 6, 7)",
        "Fabric Manager partition 2 (modules 5, 6, 7, 8) names module 8, which no GPU of "
        "h100-001 carries (its GPUs carry modules 1, 2, 3, 4, 5, 6, 7)",
        "Fabric Manager partition 14 (modules 8) names module 8, which no GPU of h100-001 "
        "carries (its GPUs carry modules 1, 2, 3, 4, 5, 6, 7)",
    ]
    assert node_state(hgx) == before


@pytest.mark.parametrize(
    "rows,reason",
    [
        (
            "0  3  1, 2, 3  18  INACTIVE\n",
            "Fabric Manager partition 0 (modules 1, 2, 3) = GPUs [0, 2, 3] has 3 GPUs; "
            "a partition has 1, 2, 4 or 8 GPUs",
        ),
        (
            "3  2  1, 3  18  INACTIVE\n9  2  3, 1  18  INACTIVE\n",
            "Fabric Manager partition 9 (modules 3, 1) = GPUs [2, 3] is listed twice",
        ),
    ],
)
def test_a_table_that_breaks_the_partition_rules_is_refused_naming_the_partition(
    hgx, tmp_path, rows, reason
):
    before = node_state(hgx)

    message = refused_import("h100-001", listing(tmp_path, rows))

    assert reason in message
    assert node_state(hgx) == before


def test_an_unreadable_listing_is_refused_naming_the_line(hgx, tmp_path):
    path = listing(tmp_path, "0  8  1, 2, 3, 4, 5, 6, 7, 8  18  INACTIVE\n1  4  1, 2, 3\n")
    before = node_state(hgx)

    message = refused_import("h100-001", path)

    assert message == (
        f"{path}: line 4: cannot read '1  4  1, 2, 3' as a partition (Partition ID, Number of "
        "GPUs, GPU Module ID, Max NVLinks/GPU, STATUS)"
    )
    assert node_state(hgx) == before


def test_a_node_without_module_ids_is_told_to_set_them_first(fleet_east):
    message = refused_import("h100-001", LISTING)

    assert "no GPU of h100-001 has a Fabric Manager module id; set each GPU's module_id" in message


def test_a_pcie_node_has_no_nvlink_partitions(fleet_east):
    node = fleet_east["nodes"]["l40s-001"]
    fleet.node_set_module_ids(node=node, module_ids={0: 1, 1: 2, 2: 3, 3: 4})

    message = refused_import("l40s-001", LISTING)

    assert "l40s-001 is pcie; only NVSwitch nodes have NVLink partitions" in message


def test_an_unknown_node_or_file_is_named(hgx, tmp_path):
    assert refused_import("h100-404", LISTING) == "no node h100-404"
    missing = tmp_path / "missing.txt"
    assert refused_import("h100-001", missing) == (
        f"cannot read {missing}: No such file or directory"
    )


def test_an_operators_table_edit_keeps_the_ids_of_the_partitions_it_keeps(hgx):
    import_listing("h100-001", LISTING)

    fleet.node_update(node=hgx, partitions=[[0, 1, 2, 3], [2, 3], [0, 2], [0]])

    node = Node.objects.get(pk=hgx.pk)
    assert node.fabric_partition_ids == [1, 3, None, 8]
    fleet.node_update(node=hgx, partitions=None)
    assert Node.objects.get(pk=hgx.pk).fabric_partition_ids is None


def test_the_node_api_shows_the_fabric_partition_ids(operator_api, hgx):
    import_listing("h100-001", LISTING)

    data = operator_api.get(f"/api/nodes/{hgx.pk}/").data

    assert data["fabric_partition_ids"][:4] == [0, 1, 2, 3]
    assert data["partitions"][3] == [2, 3]


# --- the fleet file -----------------------------------------------------------------------------

FLEET = """\
version: 1
clusters:
  - name: west
    nodes:
      - hostname: h100-101
        gpu_model: H100-SXM5-80GB
        fabric: nvswitch
        gpus: 2
        gpu_list: [{index: 0, module_id: 2}, {index: 1, module_id: 1}]
"""


def apply(tmp_path, text: str) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    out = StringIO()
    call_command("fleet_apply", str(path), stdout=out)
    return out.getvalue()


def modules(hostname: str) -> list:
    node = Node.objects.get(hostname=hostname)
    return list(node.gpus.order_by("index").values_list("module_id", flat=True))


def refused_apply(tmp_path, text: str) -> str:
    with pytest.raises(CommandError) as excinfo:
        apply(tmp_path, text)
    return str(excinfo.value)


@pytest.mark.django_db
def test_a_fleet_file_gives_module_ids_and_the_export_writes_them(tmp_path):
    apply(tmp_path, FLEET)
    out = StringIO()
    call_command("fleet_export", stdout=out)

    assert modules("h100-101") == [2, 1]
    assert "{index: 0, module_id: 2}" in out.getvalue()
    assert "{index: 1, module_id: 1}" in out.getvalue()


@pytest.mark.django_db
def test_a_fleet_file_swaps_two_cards_module_ids_in_one_audited_step(tmp_path):
    apply(tmp_path, FLEET)
    swapped = FLEET.replace(
        "[{index: 0, module_id: 2}, {index: 1, module_id: 1}]",
        "[{index: 0, module_id: 1}, {index: 1, module_id: 2}]",
    )

    output = apply(tmp_path, swapped)

    assert modules("h100-101") == [1, 2]
    assert "GPU 0 module_id 2 -> 1" in output
    assert "GPU 1 module_id 1 -> 2" in output
    assert AuditEvent.objects.filter(verb="gpu.module_id").count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "gpu_list,reason",
    [
        (
            "[{index: 0, module_id: 1}, {index: 1, module_id: 1}]",
            "gpu_list[1]: module_id: module 1 is already GPU 0's; each card has its own module id",
        ),
        ("[{index: 0, module_id: 9}]", "gpu_list[0]: module_id:"),
    ],
)
def test_a_bad_module_id_in_a_fleet_file_is_refused_with_its_place(tmp_path, gpu_list, reason):
    text = FLEET.replace("[{index: 0, module_id: 2}, {index: 1, module_id: 1}]", gpu_list)

    message = refused_apply(tmp_path, text)

    assert reason in message
    assert not Node.objects.exists()


# --- the admin ----------------------------------------------------------------------------------


def test_the_admin_edits_a_gpus_module_id_through_the_service(client, hgx):
    client.force_login(User.objects.create_superuser("root", password=PASSWORD))
    gpu = hgx.gpus.get(index=0)
    url = reverse("admin:fleet_gpu_change", args=[gpu.pk])

    taken = client.post(url, {"module_id": MODULE_OF_INDEX[1]})
    cleared = client.post(url, {"module_id": ""})

    assert taken.status_code == 200
    assert "module 4 is given to GPU 0 and GPU 1" in str(taken.context["adminform"].form.errors)
    assert cleared.status_code == 302
    assert Gpu.objects.get(pk=gpu.pk).module_id is None
    assert AuditEvent.objects.filter(verb="gpu.module_id").latest("pk").after == {"gpu0": None}
    assert client.get(reverse("admin:fleet_gpu_add")).status_code == 403


def test_the_admin_shows_a_nodes_fabric_partition_ids_and_model_checks_pass(client, hgx):
    import_listing("h100-001", LISTING)
    client.force_login(User.objects.create_superuser("root", password=PASSWORD))
    node = Node.objects.get(pk=hgx.pk)

    page = client.get(reverse("admin:fleet_node_change", args=[node.pk]))
    node.validate_constraints()  # what an admin form runs before saving a node
    node.fabric_partition_ids = [0]

    assert page.status_code == 200
    assert "[0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14]" in page.content.decode()
    with pytest.raises(ValidationError, match="node_fabric_partition_ids_match_partitions"):
        node.validate_constraints()
