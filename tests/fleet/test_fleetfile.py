"""Fleet as code: ``manage.py fleet_apply`` and ``fleet_export``.

A file applies all or nothing, through the fleet services; a second run changes nothing; every
problem names the file, the item and the reason; export and apply round-trip."""

import textwrap
from io import StringIO

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import CommandError, call_command

from gpucap.audit.models import AuditEvent
from gpucap.fleet.models import CapacitySet, Cluster, Gpu, Node, Pool
from gpucap.roles import is_operator
from gpucap.tenancy.models import Membership, Tenant

User = get_user_model()

# What the standalone pools of FLEET rent.
A100 = "gpu_model: A100-SXM4-80GB, fabric: nvswitch"

FLEET = """\
version: 1
tenants:
  - name: Acme AI
    slug: acme
    members:
      - {username: alice, email: alice@acme.example, role: admin, password: alice-pw-123}
      - {username: adam, email: adam@acme.example, role: member}
  - name: Globex Research
    slug: globex
operators:
  - {username: ops, email: ops@example.com, password: ops-pw-123}
clusters:
  - name: east
    driver: simulated
    nodes:
      - hostname: "h100-{:03d}"
        count: 3
        gpu_model: H100-SXM5-80GB
        fabric: nvswitch
        gpus: 8
        capacity_set: h100-east
        bmc_address: "10.20.12.{}"
        labels: {rack: r12}
      - hostname: h100-004
        gpu_model: H100-SXM5-80GB
        fabric: nvswitch
        gpus: 8
        capacity_set: h100-east
        partitions: [[0, 1, 2, 3, 4, 5, 6, 7], [0, 2], [1, 3], [4, 6], [5, 7]]
      - {hostname: l40s-001, gpu_model: L40S, fabric: pcie, gpus: 4, capacity_set: l40s-east}
      - {hostname: l40s-002, gpu_model: L40S, fabric: pcie, gpus: 4, capacity_set: l40s-east}
      - {hostname: a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8}
capacity_sets:
  - {name: h100-east, cluster: east, gpu_model: H100-SXM5-80GB, fabric: nvswitch}
  - {name: l40s-east, cluster: east, gpu_model: L40S, fabric: pcie, notice_seconds: 300}
pools:
  - {name: h100-inference, kind: inference, cluster: east, capacity_set: h100-east, rank: 1, floor_gpus: 8, tenants: [acme]}
  - {name: h100-ondemand, kind: on_demand, cluster: east, capacity_set: h100-east, rank: 2}
  - {name: h100-spot, kind: spot, cluster: east, capacity_set: h100-east, rank: 3, tenants: [acme, globex]}
  - {name: l40s-ondemand, kind: on_demand, cluster: east, capacity_set: l40s-east, rank: 1}
  - {name: a100-ondemand, kind: on_demand, cluster: east, gpu_model: A100-SXM4-80GB, fabric: nvswitch, rank: 1}
  - {name: a100-spot, kind: spot, cluster: east, gpu_model: A100-SXM4-80GB, fabric: nvswitch, rank: 2}
"""  # noqa: E501


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def fleet_file(tmp_path):
    """Write a fleet file (the default one, or the text given) and return its path."""

    def write(text: str = FLEET, name: str = "fleet.yaml"):
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


def apply(path, *args) -> str:
    out = StringIO()
    call_command("fleet_apply", str(path), *args, stdout=out)
    return out.getvalue()


def refused(path, *args) -> str:
    with pytest.raises(CommandError) as excinfo:
        apply(path, *args)
    return str(excinfo.value)


def export() -> str:
    out = StringIO()
    call_command("fleet_export", stdout=out)
    return out.getvalue()


def rows() -> dict:
    """Everything a fleet file can change, to prove that a refused file changed nothing."""
    return {
        "users": list(
            User.objects.order_by("username").values_list("username", "email", "is_staff")
        ),
        "tenants": list(Tenant.objects.values_list("slug", "name")),
        "memberships": list(
            Membership.objects.values_list("tenant__slug", "user__username", "role")
        ),
        "clusters": list(Cluster.objects.values_list("name", "driver", "driver_settings")),
        "sets": list(CapacitySet.objects.values_list("name", "notice_seconds", "generation")),
        "nodes": list(
            Node.objects.order_by("hostname").values_list(
                "hostname", "state", "capacity_set__name", "partitions", "labels", "bmc_address"
            )
        ),
        "gpus": list(Gpu.objects.order_by("uuid").values_list("uuid", "health")),
        "pools": list(
            Pool.objects.order_by("name").values_list("name", "rank", "floor_gpus", "capacity_set")
        ),
        "pool_tenants": list(Pool.tenants.through.objects.values_list("pool_id", "tenant_id")),
        "audit": AuditEvent.objects.count(),
    }


def edited(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"{old!r} must occur once in the fleet file"
    return text.replace(old, new)


def with_new_node(text: str) -> str:
    """The fleet file with one more L40S node (l40s-003) at the end of east's nodes."""
    return edited(
        text,
        "\ncapacity_sets:\n",
        "\n      - {hostname: l40s-003, gpu_model: L40S, fabric: pcie, gpus: 4, "
        "capacity_set: l40s-east}\ncapacity_sets:\n",
    )


# --- applying ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_apply_creates_the_declared_fleet(fleet_file):
    output = apply(fleet_file())

    assert output.splitlines()[-1] == (
        "created 2 tenants, 3 users, 2 memberships, 1 operator, 1 cluster, 2 capacity sets, "
        "7 nodes and 6 pools, unchanged 0"
    )
    h100 = CapacitySet.objects.get(name="h100-east")
    assert h100.mode == CapacitySet.Mode.DRY_RUN
    assert sorted(h100.nodes.values_list("hostname", flat=True)) == [
        "h100-001",
        "h100-002",
        "h100-003",
        "h100-004",
    ]
    assert Node.objects.get(hostname="h100-002").bmc_address == "10.20.12.2"
    assert Node.objects.get(hostname="h100-002").labels == {"rack": "r12"}
    assert Node.objects.get(hostname="a100-001").capacity_set is None
    assert Gpu.objects.filter(node__hostname="h100-004").count() == 8
    assert CapacitySet.objects.get(name="l40s-east").notice_seconds == 300
    assert list(h100.pools.order_by("rank").values_list("name", "floor_gpus")) == [
        ("h100-inference", 8),
        ("h100-ondemand", 0),
        ("h100-spot", 0),
    ]
    spot = Pool.objects.get(name="h100-spot")
    assert sorted(spot.tenants.values_list("slug", flat=True)) == ["acme", "globex"]
    # A set's pools rent the set's GPUs; a standalone pool the GPUs it names.
    assert (spot.gpu_model, spot.fabric) == ("H100-SXM5-80GB", "nvswitch")
    assert (Pool.objects.get(name="l40s-ondemand").fabric) == "pcie"
    a100 = Pool.objects.get(name="a100-spot")
    assert (a100.capacity_set, a100.gpu_model, a100.fabric) == (None, "A100-SXM4-80GB", "nvswitch")
    alice = Membership.objects.get(user__username="alice")
    assert (alice.tenant.slug, alice.role) == ("acme", "admin")
    assert is_operator(authenticate(username="ops", password="ops-pw-123"))
    assert authenticate(username="alice", password="alice-pw-123") is not None
    assert not User.objects.get(username="adam").has_usable_password()


@pytest.mark.django_db
def test_applying_the_same_file_twice_changes_nothing(fleet_file):
    path = fleet_file()
    apply(path)
    before = rows()

    output = apply(path)

    assert rows() == before  # no writes, no audit events, no generation bumps
    assert output.strip() == "nothing to change, unchanged 24"


@pytest.mark.django_db
def test_dry_run_lists_the_changes_and_writes_nothing(fleet_file):
    apply(fleet_file())
    before = rows()
    changed = with_new_node(FLEET)

    output = apply(fleet_file(changed), "--dry-run")

    assert "would create node east/l40s-003: 4 x L40S pcie, set l40s-east" in output
    assert output.splitlines()[-1] == "dry run, nothing written: would create 1 node, unchanged 24"
    assert rows() == before


@pytest.mark.django_db
def test_a_changed_rank_order_re_ranks_the_set_through_pool_rerank(fleet_file):
    apply(fleet_file())
    h100 = CapacitySet.objects.get(name="h100-east")
    changed = edited(
        FLEET,
        "h100-ondemand, kind: on_demand, cluster: east, capacity_set: h100-east, rank: 2",
        "h100-ondemand, kind: on_demand, cluster: east, capacity_set: h100-east, rank: 3",
    )
    changed = edited(
        changed,
        "capacity_set: h100-east, rank: 3, tenants",
        "capacity_set: h100-east, rank: 2, tenants",
    )

    output = apply(fleet_file(changed))

    assert list(h100.pools.order_by("rank").values_list("name", flat=True)) == [
        "h100-inference",
        "h100-spot",
        "h100-ondemand",
    ]
    assert AuditEvent.objects.filter(verb="capacity_set.rerank").count() == 1
    assert CapacitySet.objects.get(pk=h100.pk).generation > h100.generation
    assert "update pool h100-spot: rank 3 -> 2" in output
    assert output.splitlines()[-1] == "updated 2 pools, unchanged 22"
    assert apply(fleet_file(changed)).strip() == "nothing to change, unchanged 24"


@pytest.mark.django_db
def test_a_new_pool_can_take_a_rank_that_an_existing_pool_leaves(fleet_file):
    apply(fleet_file())
    changed = edited(
        FLEET,
        "capacity_set: h100-east, rank: 3, tenants",
        "capacity_set: h100-east, rank: 4, tenants",
    )
    changed += (
        "  - {name: h100-batch, kind: spot, cluster: east, capacity_set: h100-east, rank: 3}\n"
    )

    apply(fleet_file(changed))

    h100 = CapacitySet.objects.get(name="h100-east")
    assert list(h100.pools.order_by("rank").values_list("name", "rank")) == [
        ("h100-inference", 1),
        ("h100-ondemand", 2),
        ("h100-batch", 3),
        ("h100-spot", 4),
    ]
    assert apply(fleet_file(changed)).strip() == "nothing to change, unchanged 25"


@pytest.mark.django_db
def test_standalone_pools_are_re_ranked_too(fleet_file):
    apply(fleet_file())
    changed = edited(
        FLEET,
        "nvswitch, rank: 1}",
        "nvswitch, rank: 2}",
    )
    changed = edited(
        changed,
        "{name: a100-spot, kind: spot, cluster: east, " + A100 + ", rank: 2}",
        "{name: a100-spot, kind: spot, cluster: east, " + A100 + ", rank: 1}",
    )

    apply(fleet_file(changed))

    standalone = Pool.objects.filter(capacity_set=None).order_by("rank")
    assert list(standalone.values_list("name", flat=True)) == ["a100-spot", "a100-ondemand"]
    assert AuditEvent.objects.filter(verb="cluster.rerank_standalone").count() == 1


@pytest.mark.django_db
def test_a_changed_floor_goes_through_pool_set_floor(fleet_file):
    apply(fleet_file())
    h100 = CapacitySet.objects.get(name="h100-east")
    changed = edited(FLEET, "rank: 1, floor_gpus: 8", "rank: 1, floor_gpus: 16")

    output = apply(fleet_file(changed))

    assert Pool.objects.get(name="h100-inference").floor_gpus == 16
    event = AuditEvent.objects.get(verb="pool.set_floor")
    assert (event.before, event.after) == ({"floor_gpus": 8}, {"floor_gpus": 16})
    assert CapacitySet.objects.get(pk=h100.pk).generation == h100.generation + 1
    assert "update pool h100-inference: floor_gpus 8 -> 16" in output


@pytest.mark.django_db
def test_a_node_whose_set_changes_leaves_the_old_set_and_joins_the_new_one(fleet_file):
    two_sets = FLEET.replace(
        "capacity_sets:\n",
        "capacity_sets:\n"
        "  - {name: h100-east-b, cluster: east, gpu_model: H100-SXM5-80GB, fabric: nvswitch}\n",
    )
    apply(fleet_file(two_sets))
    moved = edited(
        two_sets,
        "gpus: 8\n        capacity_set: h100-east\n        partitions",
        "gpus: 8\n        capacity_set: h100-east-b\n        partitions",
    )

    output = apply(fleet_file(moved))

    assert Node.objects.get(hostname="h100-004").capacity_set.name == "h100-east-b"
    verbs = list(AuditEvent.objects.order_by("id").values_list("verb", flat=True))[-2:]
    assert verbs == ["capacity_set.remove_node", "capacity_set.add_node"]
    assert "update node east/h100-004: capacity set h100-east -> h100-east-b" in output


@pytest.mark.django_db
def test_a_node_left_out_of_a_set_becomes_standalone(fleet_file):
    apply(fleet_file())
    changed = edited(
        FLEET,
        "{hostname: l40s-002, gpu_model: L40S, fabric: pcie, gpus: 4, capacity_set: l40s-east}",
        "{hostname: l40s-002, gpu_model: L40S, fabric: pcie, gpus: 4}",
    )

    apply(fleet_file(changed))

    assert Node.objects.get(hostname="l40s-002").capacity_set is None


@pytest.mark.django_db
def test_a_state_change_goes_through_node_set_state(fleet_file):
    apply(fleet_file())
    changed = edited(
        FLEET,
        "{hostname: a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8}",
        "{hostname: a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8, "
        "state: cordoned}",
    )

    output = apply(fleet_file(changed))

    assert Node.objects.get(hostname="a100-001").state == Node.State.CORDONED
    assert AuditEvent.objects.filter(verb="node.cordon", object_label="a100-001").count() == 1
    assert "update node east/a100-001: state ready -> cordoned" in output


@pytest.mark.django_db
def test_a_node_without_a_state_keeps_the_state_an_operator_gave_it(fleet_file):
    path = fleet_file()
    apply(path)
    node = Node.objects.get(hostname="a100-001")
    Node.objects.filter(pk=node.pk).update(state=Node.State.CORDONED)

    assert apply(path).strip() == "nothing to change, unchanged 24"
    assert Node.objects.get(pk=node.pk).state == Node.State.CORDONED


@pytest.mark.django_db
def test_a_partition_table_change_goes_through_node_update_and_bumps_the_set(fleet_file):
    apply(fleet_file())
    h100 = CapacitySet.objects.get(name="h100-east")
    changed = edited(
        FLEET,
        "[[0, 1, 2, 3, 4, 5, 6, 7], [0, 2], [1, 3], [4, 6], [5, 7]]",
        "[[0, 1, 2, 3, 4, 5, 6, 7], [0, 1], [2, 3], [4, 5], [6, 7]]",
    )

    apply(fleet_file(changed))

    assert Node.objects.get(hostname="h100-004").partitions[1] == [0, 1]
    assert AuditEvent.objects.filter(verb="node.update", object_label="h100-004").count() == 1
    assert CapacitySet.objects.get(pk=h100.pk).generation == h100.generation + 1


@pytest.mark.django_db
def test_listed_gpus_are_kept_and_a_health_change_goes_through_gpu_set_health(fleet_file):
    listed = edited(
        FLEET,
        "{hostname: l40s-002, gpu_model: L40S, fabric: pcie, gpus: 4, capacity_set: l40s-east}",
        "{hostname: l40s-002, gpu_model: L40S, fabric: pcie, gpus: 4, capacity_set: l40s-east,\n"
        "         gpu_list: [{index: 1, uuid: GPU-0b9c0de2, pci_address: '0000:81:00.0'}]}",
    )
    apply(fleet_file(listed))
    card = Gpu.objects.get(node__hostname="l40s-002", index=1)
    assert (card.uuid, card.pci_address, card.health) == ("GPU-0b9c0de2", "0000:81:00.0", "ok")
    failed = listed.replace(
        "pci_address: '0000:81:00.0'}", "pci_address: '0000:81:00.0', health: failed}"
    )

    output = apply(fleet_file(failed))

    assert Gpu.objects.get(pk=card.pk).health == Gpu.Health.FAILED
    assert AuditEvent.objects.filter(verb="gpu.health").count() == 1
    assert "update node east/l40s-002: GPU 1 health ok -> failed" in output


@pytest.mark.django_db
def test_a_count_with_start_declares_numbered_nodes(fleet_file):
    text = """\
    clusters:
      - name: east
        nodes:
          - hostname: "gpu-r07-{:02d}"
            count: 4
            start: 9
            gpu_model: L4
            fabric: pcie
            gpus: 2
            bmc_address: "10.30.7.1{:02d}"
    """

    apply(fleet_file(text))

    assert list(Node.objects.order_by("hostname").values_list("hostname", "bmc_address")) == [
        ("gpu-r07-09", "10.30.7.109"),
        ("gpu-r07-10", "10.30.7.110"),
        ("gpu-r07-11", "10.30.7.111"),
        ("gpu-r07-12", "10.30.7.112"),
    ]


@pytest.mark.django_db
def test_apply_never_deletes_and_names_what_is_not_in_the_file(fleet_file):
    apply(fleet_file())
    smaller = edited(
        FLEET,
        "      - {hostname: a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8}\n",
        "",
    )
    smaller = edited(
        smaller, "  - {name: a100-spot, kind: spot, cluster: east, " + A100 + ", rank: 2}\n", ""
    )
    before = rows()

    output = apply(fleet_file(smaller))

    assert rows() == before
    assert "not in file (left as is): 1 node: east/a100-001" in output
    assert "not in file (left as is): 1 pool: a100-spot" in output


# --- refusals: every problem named, nothing applied ---------------------------------------------


@pytest.mark.django_db
def test_schema_problems_are_all_reported_at_once_with_file_item_and_reason(fleet_file):
    text = edited(
        FLEET,
        "      - {hostname: a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8}",
        "      - {hostname: a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 9}",
    )
    text = edited(
        text, "kind: spot, cluster: east, gpu_model", "kind: spotty, cluster: east, gpu_model"
    )
    text = edited(
        text,
        "  - {name: l40s-east, cluster: east, gpu_model: L40S, fabric: pcie, notice_seconds: 300}",
        "  - {name: l40s-east, cluster: east, gpu_model: L40S, fabric: pcie, notice_secs: 300}",
    )
    before = rows()

    message = refused(fleet_file(text))

    lines = message.splitlines()
    path = str(fleet_file(text))
    assert lines[0] == f"{path}: 3 problems, nothing applied:"
    assert lines[1:] == [
        f"{path}: clusters[0].nodes[4] (a100-001): gpus: must be 1..8, got 9",
        f"{path}: capacity_sets[1] (l40s-east): notice_secs: unknown key; did you mean "
        "notice_seconds?",
        f"{path}: pools[5] (a100-spot): kind: must be one of on_demand, spot, inference; "
        "got 'spotty'",
    ]
    assert rows() == before


@pytest.mark.django_db
def test_an_unknown_key_is_an_error_not_silently_ignored(fleet_file):
    text = edited(FLEET, "rank: 1, floor_gpus: 8", "rank: 1, floor: 8")

    message = refused(fleet_file(text))

    assert message.endswith(
        "pools[0] (h100-inference): floor: unknown key; did you mean floor_gpus?"
    )
    assert Pool.objects.count() == 0


@pytest.mark.django_db
def test_an_unknown_top_level_section_is_an_error(fleet_file):
    message = refused(fleet_file("tenant:\n  - {name: Acme AI, slug: acme}\n"))

    assert message.endswith("fleet.yaml: tenant: unknown key; did you mean tenants?")
    assert Tenant.objects.count() == 0


@pytest.mark.django_db
def test_malformed_yaml_is_one_line_naming_the_file_and_the_line(fleet_file):
    path = fleet_file("clusters:\n  - name: east\n    nodes: [\n  - hostname: h100-001\n")

    message = refused(path)

    assert message == (
        f"{path}: line 4, column 3: not valid YAML: expected the node content, but found '-'"
    )
    assert Cluster.objects.count() == 0


@pytest.mark.django_db
def test_a_key_given_twice_in_one_mapping_is_an_error(fleet_file):
    path = fleet_file("clusters:\n  - name: east\n    name: west\n")

    assert refused(path) == (
        f"{path}: line 3, column 5: not valid YAML: key 'name' is given twice in one mapping"
    )


@pytest.mark.django_db
def test_a_missing_file_is_named(tmp_path):
    path = tmp_path / "nowhere.yaml"

    assert refused(path) == f"{path}: cannot read the file: No such file or directory"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "node,reason",
    [
        (
            "{hostname: x-1, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8, "
            "capacity_set: h100-east}",
            "GPU model A100-SXM4-80GB is not the set's H100-SXM5-80GB",
        ),
        (
            "{hostname: x-1, gpu_model: H100-SXM5-80GB, fabric: pcie, gpus: 8, "
            "capacity_set: h100-east}",
            "fabric pcie is not the set's nvswitch",
        ),
        (
            "{hostname: x-1, gpu_model: L40S, fabric: pcie, gpus: 4, capacity_set: h100-west}",
            "cluster east is not the set's cluster west",
        ),
    ],
)
def test_a_node_declared_into_a_set_it_does_not_fit_is_refused(fleet_file, node, reason):
    text = FLEET.replace(
        "capacity_sets:\n",
        "capacity_sets:\n  - {name: h100-west, cluster: west, gpu_model: L40S, fabric: pcie}\n",
    ).replace("clusters:\n", "clusters:\n  - {name: west, nodes: []}\n")
    text = edited(
        text, "      - {hostname: a100-001", f"      - {node}\n      - {{hostname: a100-001"
    )

    message = refused(fleet_file(text))

    assert message.startswith(f"{fleet_file(text)}: clusters[1].nodes[4] (x-1): capacity_set: ")
    assert reason in message
    assert Node.objects.count() == 0 and Cluster.objects.count() == 0


@pytest.mark.django_db
def test_a_duplicate_rank_in_the_file_is_refused(fleet_file):
    text = edited(FLEET, "capacity_set: h100-east, rank: 2}", "capacity_set: h100-east, rank: 1}")

    message = refused(fleet_file(text))

    assert message.endswith(
        "pools[1] (h100-ondemand): rank: 1 is also the rank of pools[0] (h100-inference) among "
        "the pools of capacity set h100-east; ranks are unique there"
    )
    assert Pool.objects.count() == 0


@pytest.mark.django_db
def test_a_floor_above_the_sets_gpus_is_refused(fleet_file):
    apply(fleet_file())
    before = rows()
    text = edited(FLEET, "rank: 1, floor_gpus: 8", "rank: 1, floor_gpus: 40")

    message = refused(fleet_file(text))

    assert message.endswith(
        "pools[0] (h100-inference): floor_gpus: the floors of capacity set h100-east's pools add "
        "up to 40 GPUs (h100-inference 40), more than the set's 32 GPUs"
    )
    assert rows() == before


@pytest.mark.django_db
def test_a_rank_held_by_a_pool_not_in_the_file_is_refused(fleet_file):
    apply(fleet_file())
    text = edited(
        FLEET,
        "  - {name: a100-spot, kind: spot, cluster: east, " + A100 + ", rank: 2}\n",
        "  - {name: a100-batch, kind: spot, cluster: east, " + A100 + ", rank: 2}\n",
    )

    message = refused(fleet_file(text))

    assert message.endswith(
        "pools[5] (a100-batch): rank: 2 is held by a100-spot (one of the standalone pools of "
        "cluster east), which is not in this file; declare a100-spot in the file to re-rank it"
    )
    assert not Pool.objects.filter(name="a100-batch").exists()


@pytest.mark.django_db
def test_a_change_of_order_needs_ranks_one_to_n(fleet_file):
    apply(fleet_file())
    before = rows()
    text = edited(
        FLEET,
        "nvswitch, rank: 2}",
        "nvswitch, rank: 3}",
    )
    text = edited(
        text,
        "nvswitch, rank: 1}",
        "nvswitch, rank: 4}",
    )

    message = refused(fleet_file(text))

    assert message.endswith(
        "pools[4] (a100-ondemand): rank: changing ranks re-ranks the standalone pools of "
        "cluster east as 1..2; give them ranks 1..2 (now 3, 4)"
    )
    assert rows() == before


@pytest.mark.django_db
def test_a_capacity_sets_mode_cannot_be_set_from_a_file(fleet_file):
    text = edited(FLEET, "fabric: pcie, notice_seconds: 300}", "fabric: pcie, mode: enforce}")

    message = refused(fleet_file(text))

    assert (
        "capacity_sets[1] (l40s-east): mode: cannot be set from a fleet file: a new set starts "
        "in dry_run" in message
    )
    assert CapacitySet.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    "old,new,reason",
    [
        (
            "{hostname: a100-001, gpu_model: A100-SXM4-80GB,",
            "{hostname: a100-001, gpu_model: A100-SXM4-40GB,",
            "clusters[0].nodes[4] (a100-001): gpu_model: cannot change in place (node a100-001 has "
            "A100-SXM4-80GB, the file says A100-SXM4-40GB)",
        ),
        (
            "a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch,",
            "a100-001, gpu_model: A100-SXM4-80GB, fabric: pcie,",
            "clusters[0].nodes[4] (a100-001): fabric: cannot change in place",
        ),
        (
            "a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8",
            "a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 4",
            "clusters[0].nodes[4] (a100-001): gpus: cannot change in place (node a100-001 has 8, "
            "the file says 4)",
        ),
        (
            "{name: l40s-east, cluster: east, gpu_model: L40S, fabric: pcie,",
            "{name: l40s-east, cluster: east, gpu_model: L4, fabric: pcie,",
            "capacity_sets[1] (l40s-east): gpu_model: cannot change in place (set l40s-east has "
            "L40S, the file says L4)",
        ),
        (
            "{name: l40s-ondemand, kind: on_demand,",
            "{name: l40s-ondemand, kind: spot,",
            "pools[3] (l40s-ondemand): kind: cannot change in place (pool l40s-ondemand has "
            "on_demand, the file says spot)",
        ),
        (
            "{name: a100-spot, kind: spot, cluster: east, gpu_model: A100-SXM4-80GB,",
            "{name: a100-spot, kind: spot, cluster: east, gpu_model: A100-SXM4-40GB,",
            "pools[5] (a100-spot): gpu_model: cannot change in place (pool a100-spot has "
            "A100-SXM4-80GB, the file says A100-SXM4-40GB)",
        ),
        (
            "{name: a100-spot, kind: spot, cluster: east, " + A100 + ", rank: 2}",
            "{name: a100-spot, kind: spot, cluster: east, gpu_model: A100-SXM4-80GB, "
            "fabric: pcie, rank: 2}",
            "pools[5] (a100-spot): fabric: cannot change in place (pool a100-spot has nvswitch, "
            "the file says pcie)",
        ),
        (
            "{name: a100-spot, kind: spot, cluster: east, " + A100 + ", rank: 2}",
            "{name: a100-spot, kind: spot, cluster: east, capacity_set: l40s-east, rank: 2}",
            "pools[5] (a100-spot): capacity_set: cannot change in place (pool a100-spot has none, "
            "the file says l40s-east)",
        ),
    ],
)
def test_what_cannot_change_in_place_is_refused_and_nothing_is_applied(
    fleet_file, old, new, reason
):
    apply(fleet_file())
    before = rows()
    text = edited(FLEET, old, new)
    text = with_new_node(text)  # a valid change that must not happen either

    message = refused(fleet_file(text))

    assert reason in message
    assert rows() == before


@pytest.mark.django_db
def test_a_service_refusal_rolls_the_whole_apply_back(fleet_file):
    apply(fleet_file())
    Node.objects.filter(hostname="a100-001").update(state=Node.State.DOWN)
    before = rows()
    text = edited(
        FLEET,
        "{hostname: a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8}",
        "{hostname: a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8, state: ready}",
    )
    text = with_new_node(text)
    text = edited(
        text, "slug: globex", "slug: globex\n    members: [{username: gina, role: admin}]"
    )

    message = refused(fleet_file(text))

    assert message == (
        f"{fleet_file(text)}: clusters[0].nodes[4] (a100-001): node a100-001 is down; it cannot "
        "become ready"
    )
    assert rows() == before  # the new nodes, user and membership made before it are gone too
    assert not User.objects.filter(username="gina").exists()


@pytest.mark.django_db
def test_a_service_validation_error_names_the_item(fleet_file):
    apply(fleet_file())
    taken = Gpu.objects.filter(node__hostname="h100-001").first().uuid
    before = rows()
    text = edited(
        FLEET,
        "{hostname: a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8}",
        "{hostname: a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8}\n"
        f"      - {{hostname: a100-002, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8, "
        f"gpu_list: [{{index: 0, uuid: {taken}}}]}}",
    )

    message = refused(fleet_file(text))

    assert message == (
        f"{fleet_file(text)}: clusters[0].nodes[5] (a100-002): gpu_list: a GPU UUID is already "
        "registered"
    )
    assert rows() == before


@pytest.mark.django_db
def test_a_standalone_pool_must_name_the_gpus_it_rents(fleet_file):
    text = edited(FLEET, "cluster: east, " + A100 + ", rank: 2}", "cluster: east, rank: 2}")

    lines = refused(fleet_file(text)).splitlines()

    path = fleet_file(text)
    assert lines[1:] == [
        f"{path}: pools[5] (a100-spot): gpu_model: is required for a standalone pool: the GPU "
        "model of the cluster's standalone nodes it places on",
        f"{path}: pools[5] (a100-spot): fabric: is required for a standalone pool: the fabric "
        "(pcie or nvswitch) of the cluster's standalone nodes it places on",
    ]
    assert Pool.objects.count() == 0 and Cluster.objects.count() == 0


@pytest.mark.django_db
def test_a_standalone_pools_fabric_must_be_pcie_or_nvswitch(fleet_file):
    text = edited(FLEET, "fabric: nvswitch, rank: 2}", "fabric: nvlink, rank: 2}")

    message = refused(fleet_file(text))

    assert message.endswith(
        "pools[5] (a100-spot): fabric: must be one of pcie, nvswitch; got 'nvlink'"
    )
    assert Pool.objects.count() == 0


@pytest.mark.django_db
def test_a_pool_in_a_set_may_name_the_sets_gpus_but_no_others(fleet_file):
    same = edited(
        FLEET,
        "capacity_set: l40s-east, rank: 1}",
        "capacity_set: l40s-east, gpu_model: L40S, fabric: pcie, rank: 1}",
    )
    apply(fleet_file(same))
    assert Pool.objects.get(name="l40s-ondemand").gpu_model == "L40S"
    assert apply(fleet_file(same)).strip() == "nothing to change, unchanged 24"
    before = rows()
    other = edited(
        FLEET,
        "capacity_set: l40s-east, rank: 1}",
        "capacity_set: l40s-east, gpu_model: L4, fabric: nvswitch, rank: 1}",
    )

    lines = refused(fleet_file(other)).splitlines()

    path = fleet_file(other)
    assert lines[1:] == [
        f"{path}: pools[3] (l40s-ondemand): gpu_model: a pool of l40s-east rents its L40S, not "
        "L4; leave gpu_model out for a pool in a set",
        f"{path}: pools[3] (l40s-ondemand): fabric: a pool of l40s-east rents its pcie, not "
        "nvswitch; leave fabric out for a pool in a set",
    ]
    assert rows() == before


@pytest.mark.django_db
def test_references_to_unknown_sets_clusters_and_tenants_are_all_reported(fleet_file):
    text = edited(
        FLEET,
        "capacity_set: l40s-east}\n      - {hostname: l40s-002",
        "capacity_set: l40s-west}\n      - {hostname: l40s-002",
    )
    text = edited(
        text,
        "{name: a100-spot, kind: spot, cluster: east, " + A100 + ", rank: 2}",
        "{name: a100-spot, kind: spot, cluster: north, " + A100 + ", rank: 2, tenants: [initech]}",
    )

    lines = refused(fleet_file(text)).splitlines()

    assert lines[1:] == [
        f"{fleet_file(text)}: clusters[0].nodes[2] (l40s-001): capacity_set: no capacity set named "
        "l40s-west in the file or the database",
        f"{fleet_file(text)}: pools[5] (a100-spot): cluster: no cluster named north in the file "
        "or the database",
        f"{fleet_file(text)}: pools[5] (a100-spot): tenants: no tenant initech in the file or the "
        "database",
    ]
    assert Cluster.objects.count() == 0


# --- export -----------------------------------------------------------------------------------


def _empty_the_database() -> None:
    Pool.objects.all().delete()
    Node.objects.all().delete()
    CapacitySet.objects.all().delete()
    Cluster.objects.all().delete()
    Tenant.objects.all().delete()
    User.objects.all().delete()
    AuditEvent.objects.all().delete()


@pytest.mark.django_db
def test_export_round_trips_through_an_empty_database(fleet_file):
    varied = edited(
        FLEET,
        "{hostname: a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8}",
        "{hostname: a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8, state: "
        "cordoned, gpu_list: [{index: 3, health: failed}, {index: 5, uuid: GPU-5e1f}]}",
    ).replace(
        "    driver: simulated\n",
        "    driver: libvirt\n    driver_settings: {uri: "
        "'qemu+ssh://root@{node}/system', grace_seconds: 30}\n",
    )
    apply(fleet_file(varied))
    first = export()
    _empty_the_database()

    apply(fleet_file(first, name="exported.yaml"))

    assert export() == first
    events = AuditEvent.objects.count()
    assert apply(fleet_file(first, name="exported.yaml")).strip().startswith("nothing to change")
    assert AuditEvent.objects.count() == events


@pytest.mark.django_db
def test_applying_an_export_to_the_same_database_changes_nothing(fleet_file, fleet_east, operator):
    before = rows()

    output = apply(fleet_file(export(), name="exported.yaml"))

    assert rows() == before
    assert output.strip().startswith("nothing to change")


@pytest.mark.django_db
def test_export_writes_the_declared_values_and_never_a_password(fleet_file):
    apply(fleet_file())

    text = export()

    assert "password" not in text.replace("Passwords", "")
    assert "      - {username: alice, email: alice@acme.example, role: admin}" in text
    assert "        partitions: [[0, 1, 2, 3, 4, 5, 6, 7], [0, 2], [1, 3], [4, 6], [5, 7]]" in text
    assert "mode:" not in text.replace("gpu_model:", "")
    # Only standalone pools name the GPUs they rent; a set's pools rent the set's.
    assert (
        "  - name: a100-spot\n    kind: spot\n    cluster: east\n    gpu_model: A100-SXM4-80GB\n"
        "    fabric: nvswitch\n    rank: 2\n" in text
    )
    assert (
        "  - name: h100-spot\n    kind: spot\n    cluster: east\n    capacity_set: h100-east\n"
        "    rank: 3\n" in text
    )


@pytest.mark.django_db
def test_export_to_a_file(fleet_file, tmp_path):
    apply(fleet_file())
    target = tmp_path / "out.yaml"
    out = StringIO()

    call_command("fleet_export", "-o", str(target), stdout=out)

    assert target.read_text() == export()
    assert out.getvalue().strip() == f"wrote {target}"


@pytest.mark.django_db
def test_yaml_anchors_and_merge_keys_share_node_attributes(fleet_file):
    text = """\
    clusters:
      - name: east
        nodes:
          - &l4 {hostname: l4-001, gpu_model: L4, fabric: pcie, gpus: 2, labels: {rack: r31}}
          - {<<: *l4, hostname: l4-002}
    """

    apply(fleet_file(text))

    assert list(
        Node.objects.order_by("hostname").values_list("hostname", "gpu_model", "labels")
    ) == [
        ("l4-001", "L4", {"rack": "r31"}),
        ("l4-002", "L4", {"rack": "r31"}),
    ]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "node,reason",
    [
        (
            '{hostname: "n-{:03d}", gpu_model: L4, fabric: pcie, gpus: 2}',
            "hostname: 'n-{:03d}' is a pattern; give count (and start) with it",
        ),
        (
            "{hostname: n-1, count: 3, gpu_model: L4, fabric: pcie, gpus: 2}",
            "hostname: 'n-1' gives the 3 nodes the same name; put a number field such as {:03d} "
            "in it",
        ),
        (
            "{hostname: n-1, start: 3, gpu_model: L4, fabric: pcie, gpus: 2}",
            "start: goes with count; a single node has no number",
        ),
        (
            '{hostname: "n-{:03d}", count: 2, gpu_model: L4, fabric: pcie, gpus: 2, '
            "gpu_list: [{index: 0, uuid: GPU-1}]}",
            "gpu_list[0]: uuid: a UUID names one card; it cannot be given to 2 nodes",
        ),
        (
            "{hostname: n-1, gpu_model: L4, fabric: pcie, gpus: 2, gpu_list: [{index: 2}]}",
            "gpu_list[0]: index: must be 0..1, got 2",
        ),
        (
            "{hostname: n-1, gpu_model: L4, fabric: pcie, gpus: 2, labels: {row: 3}}",
            'labels: the value of row must be text; quote it: row: "3"',
        ),
        (
            "{hostname: n-1, gpu_model: L4, fabric: pcie, gpus: 2, partitions: [[0, 1]]}",
            "partitions: only NVSwitch nodes carry a partition table; this node is pcie",
        ),
        (
            "{hostname: n-1, gpu_model: H100, fabric: nvswitch, gpus: 8, partitions: [[0, 1, 2]]}",
            "partitions: partition 1 [0, 1, 2] has 3 GPUs",
        ),
        (
            "{hostname: n-1, gpu_model: 4090, fabric: pcie, gpus: 2}",
            'gpu_model: must be text, got 4090; quote it: gpu_model: "4090"',
        ),
        (
            "{hostname: n_1, gpu_model: L4, fabric: pcie, gpus: 2}",
            "hostname: 'n_1' must be a DNS hostname: labels of letters, digits and hyphens",
        ),
        (
            "{hostname: a/b, gpu_model: L4, fabric: pcie, gpus: 2}",
            "hostname: 'a/b' must be a DNS hostname",
        ),
        (
            "{hostname: '../x', gpu_model: L4, fabric: pcie, gpus: 2}",
            "hostname: '../x' must be a DNS hostname",
        ),
        (
            "{hostname: '<script>', gpu_model: L4, fabric: pcie, gpus: 2}",
            "hostname: '<script>' must be a DNS hostname",
        ),
        (
            "{hostname: '%00', gpu_model: L4, fabric: pcie, gpus: 2}",
            "hostname: '%00' must be a DNS hostname",
        ),
        (
            "{hostname: a..b, gpu_model: L4, fabric: pcie, gpus: 2}",
            "hostname: 'a..b' must be a DNS hostname",
        ),
    ],
)
def test_bad_node_entries_are_refused_with_the_reason(fleet_file, node, reason):
    path = fleet_file(f"clusters:\n  - name: east\n    nodes:\n      - {node}\n")

    message = refused(path)

    assert message.startswith(f"{path}: clusters[0].nodes[0] (")
    assert reason in message
    assert Node.objects.count() == 0


@pytest.mark.django_db
def test_a_user_declared_twice_must_agree_on_the_email(fleet_file):
    text = edited(
        FLEET, "slug: globex", "slug: globex\n    members: [{username: alice, email: a@x.example}]"
    )

    message = refused(fleet_file(text))

    assert message.endswith(
        "tenants[1].members[0] (alice): email: differs from the email given for the same user at "
        "tenants[0].members[0] (alice)"
    )


@pytest.mark.django_db
def test_a_cluster_driver_change_goes_through_cluster_update(fleet_file):
    apply(fleet_file())
    text = edited(
        FLEET,
        "    driver: simulated\n",
        "    driver: libvirt\n    driver_settings: {uri: 'qemu+ssh://root@{node}/system'}\n",
    )

    output = apply(fleet_file(text))

    cluster = Cluster.objects.get(name="east")
    assert (cluster.driver, cluster.driver_settings) == (
        "libvirt",
        {"uri": "qemu+ssh://root@{node}/system"},
    )
    assert AuditEvent.objects.filter(verb="cluster.update").count() == 1
    assert "update cluster east: driver simulated -> libvirt" in output


@pytest.mark.django_db
def test_a_changed_password_and_role_are_applied(fleet_file):
    apply(fleet_file())
    text = edited(
        FLEET, "role: admin, password: alice-pw-123", "role: member, password: alice-pw-456"
    )

    output = apply(fleet_file(text))

    assert authenticate(username="alice", password="alice-pw-456") is not None
    assert Membership.objects.get(user__username="alice").role == "member"
    assert "update user alice: password set from the file" in output
    assert "update membership acme/alice: role admin -> member" in output
