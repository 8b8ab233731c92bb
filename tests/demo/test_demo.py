"""``manage.py demo`` loads gpucap/demo/fleet.yaml: the fleet the README promises, logins that
work, and a second run that changes nothing."""

from io import StringIO

import pytest
from django.contrib.auth import authenticate
from django.core.management import call_command
from django.db.models import Sum

from gpucap.audit.models import AuditEvent
from gpucap.fleet.models import CapacitySet, Gpu, Node, Pool
from gpucap.roles import is_operator
from gpucap.tenancy.models import Membership, Tenant

NON_ADJACENT_PAIRS = [[0, 2], [1, 3], [4, 6], [5, 7]]


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def demo(*args) -> str:
    out = StringIO()
    call_command("demo", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def loaded(db, monkeypatch) -> str:
    monkeypatch.delenv("PORT", raising=False)
    return demo()


def test_the_h100_set_has_16_nvswitch_nodes_of_8_gpus_some_with_non_adjacent_pairs(loaded):
    h100 = CapacitySet.objects.get(name="h100-east")
    nodes = list(h100.nodes.all())

    assert (h100.gpu_model, h100.fabric, h100.cluster.name) == (
        "H100-SXM5-80GB",
        "nvswitch",
        "east",
    )
    assert len(nodes) == 16
    assert {node.gpu_count for node in nodes} == {8}
    non_adjacent = [
        n for n in nodes if n.partitions and all(p in n.partitions for p in NON_ADJACENT_PAIRS)
    ]
    assert len(non_adjacent) == 4
    assert non_adjacent[0].partitions[:3] == [[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3], [4, 5, 6, 7]]


def test_the_l40s_set_has_8_pcie_nodes_of_4_gpus(loaded):
    l40s = CapacitySet.objects.get(name="l40s-east")

    assert (l40s.gpu_model, l40s.fabric) == ("L40S", "pcie")
    assert l40s.nodes.count() == 8
    assert set(l40s.nodes.values_list("gpu_count", flat=True)) == {4}


def test_standalone_nodes_and_a_second_cluster_are_there(loaded):
    standalone = Node.objects.filter(capacity_set=None)

    assert standalone.count() >= 3
    assert set(standalone.values_list("cluster__name", flat=True)) == {"east"}
    assert CapacitySet.objects.get(name="h200-west").nodes.count() == 4


def test_the_overview_has_states_to_show(loaded):
    states = set(Node.objects.values_list("state", flat=True))

    assert {Node.State.READY, Node.State.CORDONED, Node.State.DOWN} <= states
    assert Gpu.objects.filter(health=Gpu.Health.FAILED, node__hostname="h100-012").count() == 1


def test_every_set_starts_in_dry_run(loaded):
    assert set(CapacitySet.objects.values_list("mode", flat=True)) == {CapacitySet.Mode.DRY_RUN}


def test_pools_of_all_three_kinds_are_ranked_with_floors_that_fit(loaded):
    h100 = CapacitySet.objects.get(name="h100-east")

    assert list(h100.pools.order_by("rank").values_list("name", "kind", "rank", "floor_gpus")) == [
        ("h100-inference", "inference", 1, 16),
        ("h100-ondemand", "on_demand", 2, 0),
        ("h100-spot", "spot", 3, 0),
    ]
    assert list(
        CapacitySet.objects.get(name="l40s-east")
        .pools.order_by("rank")
        .values_list("name", flat=True)
    ) == ["l40s-ondemand", "l40s-spot"]
    standalone = Pool.objects.filter(capacity_set=None, cluster__name="east").order_by("rank")
    assert list(standalone.values_list("name", "rank", "gpu_model", "fabric")) == [
        ("a100-ondemand", 1, "A100-SXM4-80GB", "nvswitch"),
        ("a100-spot", 2, "A100-SXM4-80GB", "nvswitch"),
        ("l4-ondemand", 3, "L4", "pcie"),
    ]
    # Every standalone pool rents GPUs that some standalone node of its cluster has.
    for pool in standalone:
        assert Node.objects.filter(
            cluster=pool.cluster, capacity_set=None, gpu_model=pool.gpu_model, fabric=pool.fabric
        ).exists()
    # A set's pools rent the set's GPUs.
    for pool in Pool.objects.exclude(capacity_set=None).select_related("capacity_set"):
        assert (pool.gpu_model, pool.fabric) == (
            pool.capacity_set.gpu_model,
            pool.capacity_set.fabric,
        )
    for capacity_set in CapacitySet.objects.all():
        floors = capacity_set.pools.aggregate(total=Sum("floor_gpus"))["total"]
        gpus = capacity_set.nodes.aggregate(total=Sum("gpu_count"))["total"]
        assert floors <= gpus


def test_two_tenants_each_have_an_admin_and_a_member(loaded):
    assert list(Tenant.objects.order_by("slug").values_list("slug", "name")) == [
        ("acme", "Acme AI"),
        ("globex", "Globex Research"),
    ]
    for slug in ("acme", "globex"):
        roles = sorted(Membership.objects.filter(tenant__slug=slug).values_list("role", flat=True))
        assert roles == ["admin", "member"]
    assert Pool.objects.get(name="l40s-ondemand").tenants.get().slug == "globex"


def test_the_printed_logins_work(loaded):
    assert "Open http://127.0.0.1:8000/" in loaded
    assert "  operator         ops / ops-demo-password" in loaded
    assert is_operator(authenticate(username="ops", password="ops-demo-password"))
    for username in ("alice", "adam", "grace", "gus"):
        password = f"{username}-demo-password"
        assert f"{username} / {password}" in loaded
        user = authenticate(username=username, password=password)
        assert user is not None and not is_operator(user)


def test_running_the_demo_twice_changes_nothing(loaded):
    events = AuditEvent.objects.count()
    generations = list(CapacitySet.objects.order_by("name").values_list("generation", flat=True))

    again = demo()

    assert "nothing to change, unchanged 66" in again  # 59 rows, 5 images, 2 schedule entries
    assert AuditEvent.objects.count() == events
    assert (
        list(CapacitySet.objects.order_by("name").values_list("generation", flat=True))
        == generations
    )
    assert "ops / ops-demo-password" in again


def test_the_url_follows_port_or_url(db, monkeypatch):
    monkeypatch.setenv("PORT", "8123")
    assert "Open http://127.0.0.1:8123/" in demo()
    assert "Open http://gpu.example:9000/" in demo("--url", "http://gpu.example:9000/")


def test_the_demo_workload_gives_the_h100_set_something_to_decide(loaded):
    from gpucap.plans.services import capacity_set_tick
    from gpucap.rentals.models import VirtualMachine

    h100 = CapacitySet.objects.get(name="h100-east")
    assert "requests waiting for the arbiter's plan" in loaded
    assert VirtualMachine.objects.filter(state="provisioning").count() == 29

    plan = capacity_set_tick(capacity_set_id=h100.pk).plan

    assert plan.mode == "dry_run" and plan.status == "proposed"
    assert (plan.placements, plan.preemptions, plan.unsatisfied) == (2, 2, 1)
    placed = {a.vm.name: a.node.hostname for a in plan.actions.filter(kind="placement")}
    assert placed["llm-pretrain-b"] == "h100-016", "the free node first"
    victims = plan.actions.filter(kind="preemption").select_related("vm__pool", "node")
    assert {(a.vm.pool.name, len(a.gpus)) for a in victims} == {("h100-spot", 4)}
    assert len({a.node.hostname for a in victims}) == 1, "two spot VMs sharing one node"
    assert plan.actions.get(kind="unsatisfied").vm.name == "globex-batch"
    assert not plan.complete, "the README says the first plan is incomplete"
    waiting = VirtualMachine.objects.filter(state="pending").order_by("pk")
    assert [(vm.name, vm.pool.kind, vm.gpu_count) for vm in waiting] == [
        ("llm-pretrain-b", "on_demand", 8),
        ("eval-sweep", "on_demand", 8),
        ("globex-batch", "spot", 4),
    ], "the README names the three requests waiting"
    assert "demo workload: VMs exist already" in demo()


def test_the_demo_has_two_weeks_of_past_usage_for_both_tenants(loaded):
    from datetime import timedelta

    from django.utils import timezone

    from gpucap.usage import selectors
    from gpucap.usage.models import UsageInterval

    now = timezone.now()
    assert "demo usage history: 80 past VMs" in loaded
    past = UsageInterval.objects.filter(ended_at__lt=now)
    assert set(past.values_list("tenant__slug", flat=True)) == {"acme", "globex"}
    assert set(past.values_list("pool_kind", flat=True)) == {"on_demand", "spot"}
    assert past.filter(started_at__lt=now - timedelta(days=7)).exists()
    hours = selectors.gpu_hours_by_pool_kind(
        tenant_id=None, since=now - timedelta(days=15), until=now
    )
    assert hours["spot"] > 0 and hours["on_demand"] > 0
    count = past.count()
    assert "older usage exists already" in demo()
    assert UsageInterval.objects.filter(ended_at__lt=now).count() == count
