"""The operator's fleet pages: overview grid, clusters, capacity sets, node detail with
cordon/uncordon."""

import pytest
from django.test import Client
from django.urls import reverse

from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet, Gpu, Node

HTMX = {"HX-Request": "true"}
GRID_SQUARE = 'class="gpu gpu-{}" title='  # a square in a tile (legend squares have no title)


def node_url(name: str, hostname: str, cluster: str = "east") -> str:
    return reverse(name, kwargs={"cluster": cluster, "hostname": hostname})


def add_nodes(cluster, capacity_set, count: int, *, prefix: str = "extra") -> None:
    for number in range(count):
        node = fleet.node_create(
            cluster=cluster,
            hostname=f"{prefix}-{number:03d}",
            gpu_model=capacity_set.gpu_model,
            fabric=capacity_set.fabric,
            gpu_count=8 if capacity_set.fabric == "nvswitch" else 4,
        )
        fleet.node_join_set(node=node, capacity_set=capacity_set)


OPERATOR_PAGES = [
    ("fleet:overview", {}),
    ("fleet:capacity-set-list", {}),
    ("fleet:capacity-set-detail", {"name": "h100-east"}),
    ("fleet:node-detail", {"cluster": "east", "hostname": "h100-001"}),
    ("fleet:cluster-list", {}),
    ("fleet:cluster-detail", {"name": "east"}),
]


# --- who may see what -------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "kwargs"), OPERATOR_PAGES)
def test_anonymous_visitor_is_sent_to_login(client, fleet_east, name, kwargs):
    url = reverse(name, kwargs=kwargs)
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next={url}"


@pytest.mark.parametrize(("name", "kwargs"), OPERATOR_PAGES)
def test_tenant_member_is_refused_operator_pages(member_client, fleet_east, name, kwargs):
    response = member_client.get(reverse(name, kwargs=kwargs))
    assert response.status_code == 403
    assert "for operators" in response.content.decode()
    assert "h100-001" not in response.content.decode()


def test_operator_nav_shows_operator_sections_and_role(operator_client, fleet_east):
    page = operator_client.get(reverse("fleet:overview")).content.decode()
    for label in ("Fleet", "Capacity sets", "Audit log", "API docs"):
        assert f">{label}</a>" in page
    assert ">Admin</a>" not in page  # Django admin would tell a non-superuser "no permission"
    assert "olivia" in page
    assert ">operator</span>" in page


def test_a_superuser_operator_also_gets_the_admin(operator, client, fleet_east):
    operator.is_superuser = True
    operator.save(update_fields=["is_superuser"])
    client.force_login(operator)

    assert ">Admin</a>" in client.get(reverse("fleet:overview")).content.decode()


# --- fleet overview ---------------------------------------------------------------------------


def test_overview_shows_every_node_grouped_by_cluster_then_set(operator_client, fleet_east):
    response = operator_client.get(reverse("fleet:overview"))
    page = response.content.decode()
    assert response.status_code == 200
    for hostname in ("h100-001", "h100-002", "l40s-001", "l40s-002", "a100-001"):
        assert hostname in page
    # Sets by name, the cluster's standalone nodes last.
    assert page.index("h100-001") < page.index("l40s-001") < page.index("a100-001")
    assert (
        page.index(">h100-east</a>") < page.index(">l40s-east</a>") < page.index("standalone nodes")
    )
    assert page.count(GRID_SQUARE.format("free")) == 8 + 8 + 4 + 4 + 8
    assert f'href="{node_url("fleet:node-detail", "h100-001")}"' in page


def test_overview_totals_count_nodes_gpus_failures_and_nodes_not_ready(operator_client, fleet_east):
    nodes = fleet_east["nodes"]
    fleet.gpu_set_health(gpu=nodes["l40s-001"].gpus.get(index=2), health=Gpu.Health.FAILED)
    fleet.node_cordon(node=nodes["h100-002"])

    overview = operator_client.get(reverse("fleet:overview")).context["overview"]
    totals = overview.totals
    assert (totals.nodes, totals.gpus, totals.failed_gpus, totals.nodes_not_ready) == (5, 32, 1, 1)
    assert totals.ready_gpus == 32 - 1 - 8


def test_overview_colours_failed_gpus_and_cordoned_nodes(operator_client, fleet_east):
    nodes = fleet_east["nodes"]
    fleet.gpu_set_health(gpu=nodes["l40s-001"].gpus.get(index=2), health=Gpu.Health.FAILED)
    fleet.node_cordon(node=nodes["h100-002"])

    page = operator_client.get(reverse("fleet:overview")).content.decode()
    assert page.count(GRID_SQUARE.format("failed")) == 1
    assert page.count(GRID_SQUARE.format("cordoned")) == 8
    assert page.count(GRID_SQUARE.format("free")) == 32 - 1 - 8
    assert 'class="tile tile-cordoned"' in page


def test_filter_by_state_shows_only_the_cordoned_node(operator_client, fleet_east):
    fleet.node_cordon(node=fleet_east["nodes"]["h100-002"])

    page = operator_client.get(reverse("fleet:overview"), {"state": "cordoned"}).content.decode()
    assert "h100-002" in page
    for hostname in ("h100-001", "l40s-001", "l40s-002", "a100-001"):
        assert hostname not in page


@pytest.mark.parametrize(
    ("filters", "shown"),
    [
        ({"capacity_set": "l40s-east"}, {"l40s-001", "l40s-002"}),
        ({"capacity_set": "standalone"}, {"a100-001"}),
        ({"gpu_model": "H100-SXM5-80GB"}, {"h100-001", "h100-002"}),
        (
            {"cluster": "east", "state": "ready"},
            {"h100-001", "h100-002", "l40s-001", "l40s-002", "a100-001"},
        ),
    ],
)
def test_filters_narrow_the_grid(operator_client, fleet_east, filters, shown):
    overview = operator_client.get(reverse("fleet:overview"), filters).context["overview"]
    hostnames = {tile.node.hostname for group in overview.groups for tile in group.tiles}
    assert hostnames == shown


def test_filter_naming_an_unknown_cluster_says_so(operator_client, fleet_east):
    page = operator_client.get(reverse("fleet:overview"), {"cluster": "west"}).content.decode()
    assert "Ignored a filter" in page
    assert "west is not one of the available choices" in page


def test_filter_with_no_match_says_nothing_matches(operator_client, fleet_east):
    page = operator_client.get(reverse("fleet:overview"), {"state": "down"}).content.decode()
    assert "No nodes match these filters." in page


def test_filter_form_swaps_the_grid_and_keeps_the_url(operator_client, fleet_east):
    page = operator_client.get(reverse("fleet:overview")).content.decode()
    assert 'hx-target="#fleet-grid"' in page
    assert 'hx-push-url="true"' in page


def test_htmx_filter_request_returns_only_the_grid_fragment(operator_client, fleet_east):
    fleet.node_cordon(node=fleet_east["nodes"]["h100-002"])
    response = operator_client.get(reverse("fleet:overview"), {"state": "cordoned"}, headers=HTMX)
    page = response.content.decode()
    assert response.status_code == 200
    assert page.lstrip().startswith('<div id="fleet-grid">')
    assert "<html" not in page
    assert "Capacity sets</a>" not in page  # no navigation
    assert "h100-002" in page
    assert "h100-001" not in page
    assert "HX-Request" in response["Vary"]


def test_htmx_history_restore_gets_the_whole_page(operator_client, fleet_east):
    # After Back, htmx may re-fetch a pushed filter URL: it needs the page, not the fragment.
    response = operator_client.get(
        reverse("fleet:overview"),
        {"state": "ready"},
        headers={**HTMX, "HX-History-Restore-Request": "true"},
    )
    assert "<html" in response.content.decode()


def test_overview_query_count_does_not_grow_with_the_fleet(
    operator_client, fleet_east, django_assert_num_queries
):
    # session, user, operator group; filter options (clusters, sets, models); nodes; GPUs.
    with django_assert_num_queries(8):
        operator_client.get(reverse("fleet:overview"))
    add_nodes(fleet_east["cluster"], fleet_east["sets"]["h100-east"], 20)
    with django_assert_num_queries(8):
        response = operator_client.get(reverse("fleet:overview"))
    assert response.context["overview"].totals.nodes == 25


# --- capacity sets ----------------------------------------------------------------------------


def test_capacity_set_list_shows_sets_modes_totals_and_ranked_pools(operator_client, fleet_east):
    fleet.gpu_set_health(
        gpu=fleet_east["nodes"]["h100-001"].gpus.get(index=0), health=Gpu.Health.FAILED
    )
    CapacitySet.objects.filter(name="l40s-east").update(mode=CapacitySet.Mode.ENFORCE)

    response = operator_client.get(reverse("fleet:capacity-set-list"))
    page = response.content.decode()
    assert "h100-east" in page and "l40s-east" in page
    assert "Dry-run" in page and "Enforcing" in page
    assert page.index("h100-inference") < page.index("h100-ondemand") < page.index("h100-spot")
    assert "a100-standalone" in page  # standalone pools get their own table
    row = page[page.index("<strong>a100-standalone</strong>") :]
    row = row[: row.index("</tr>")]
    assert "<td>A100-SXM4-80GB</td>" in row and "<td>NVSwitch</td>" in row  # what it rents
    h100 = next(s for s in response.context["capacity_sets"] if s.name == "h100-east")
    assert (h100.node_count, h100.gpu_total, h100.ready_gpus, h100.failed_gpus) == (2, 16, 15, 1)


def test_capacity_set_list_query_count_does_not_grow(
    operator_client, fleet_east, django_assert_num_queries
):
    with django_assert_num_queries(7):
        operator_client.get(reverse("fleet:capacity-set-list"))
    cluster = fleet_east["cluster"]
    extra = fleet.capacity_set_create(cluster=cluster, name="h200", gpu_model="H200", fabric="pcie")
    add_nodes(cluster, extra, 3)
    fleet.pool_create(name="h200-spot", kind="spot", cluster=cluster, capacity_set=extra, rank=1)
    with django_assert_num_queries(7):
        operator_client.get(reverse("fleet:capacity-set-list"))


def test_capacity_set_page_shows_header_pools_in_rank_order_and_nodes(operator_client, fleet_east):
    page = operator_client.get(
        reverse("fleet:capacity-set-detail", kwargs={"name": "h100-east"})
    ).content.decode()
    assert "<h1>h100-east" in page
    assert "Dry-run" in page
    for fact in ("east", "H100-SXM5-80GB", "NVSwitch", "120 s"):
        assert fact in page
    assert page.index("h100-inference") < page.index("h100-ondemand") < page.index("h100-spot")
    assert f'<a href="{reverse("tenant-detail", kwargs={"slug": "acme"})}">Acme AI</a>' in page
    assert "Globex Research" not in page
    assert "h100-001" in page and "h100-002" in page
    assert "l40s-001" not in page and "a100-001" not in page
    assert page.count(GRID_SQUARE.format("free")) == 16


def test_capacity_set_page_shows_enforcing_badge(operator_client, fleet_east):
    CapacitySet.objects.filter(name="h100-east").update(mode=CapacitySet.Mode.ENFORCE)
    page = operator_client.get(
        reverse("fleet:capacity-set-detail", kwargs={"name": "h100-east"})
    ).content.decode()
    assert "Enforcing" in page
    assert "Dry-run" not in page


def test_capacity_set_page_totals_count_ready_and_failed(operator_client, fleet_east):
    nodes = fleet_east["nodes"]
    fleet.gpu_set_health(gpu=nodes["h100-001"].gpus.get(index=3), health=Gpu.Health.FAILED)
    fleet.node_cordon(node=nodes["h100-002"])
    response = operator_client.get(
        reverse("fleet:capacity-set-detail", kwargs={"name": "h100-east"})
    )
    totals = response.context["overview"].totals
    assert (totals.nodes, totals.gpus, totals.ready_gpus, totals.failed_gpus) == (2, 16, 7, 1)


def test_unknown_capacity_set_is_404(operator_client, fleet_east):
    response = operator_client.get(reverse("fleet:capacity-set-detail", kwargs={"name": "nope"}))
    assert response.status_code == 404


def test_capacity_set_page_is_always_the_whole_page_and_its_poll_the_regions(
    operator_client, fleet_east
):
    url = reverse("fleet:capacity-set-detail", kwargs={"name": "h100-east"})
    page = operator_client.get(url, headers=HTMX).content.decode()
    assert "<html" in page and "h100-spot" in page, "an HTMX navigation gets the page too"
    live = reverse("fleet:capacity-set-live", kwargs={"name": "h100-east"})
    regions = operator_client.get(live, headers=HTMX).content.decode()
    assert "<html" not in regions
    assert '<div id="set-live" class="set-nodes" hx-swap-oob="true">' in regions
    assert "h100-spot" in regions


def test_capacity_set_page_query_count_does_not_grow(
    operator_client, fleet_east, django_assert_num_queries
):
    url = reverse("fleet:capacity-set-detail", kwargs={"name": "h100-east"})
    # session, user, operator group; set; pools; pool tenants; nodes; GPUs; the arbiter's part:
    # plan history, held GPUs, pending GPUs (no plan yet); the schedule's pools, deployments,
    # entries and overrides.
    with django_assert_num_queries(15):
        operator_client.get(url)
    add_nodes(fleet_east["cluster"], fleet_east["sets"]["h100-east"], 10)
    fleet.pool_create(
        name="h100-batch",
        kind="spot",
        cluster=fleet_east["cluster"],
        capacity_set=fleet_east["sets"]["h100-east"],
        rank=4,
    )
    with django_assert_num_queries(15):
        response = operator_client.get(url)
    assert len(response.context["overview"].tiles) == 12


# --- node detail ------------------------------------------------------------------------------


def test_node_page_shows_attributes_gpus_and_default_partition_table(operator_client, fleet_east):
    node = fleet_east["nodes"]["h100-001"]
    page = operator_client.get(node_url("fleet:node-detail", "h100-001")).content.decode()
    assert "<h1>h100-001</h1>" in page
    for gpu in node.gpus.all():
        assert gpu.uuid in page
        assert gpu.pci_address in page
    assert "default table" in page
    table = operator_client.get(node_url("fleet:node-detail", "h100-001")).context[
        "partition_table"
    ]
    assert [(row.size, len(row.blocks)) for row in table.rows] == [(8, 1), (4, 2), (2, 4), (1, 8)]
    assert table.rows[2].blocks == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_node_page_shows_the_nodes_own_partition_table(operator_client, fleet_east):
    response = operator_client.get(node_url("fleet:node-detail", "h100-002"))
    page = response.content.decode()
    assert "node's own table" in page
    assert "default table" not in page
    pairs = response.context["partition_table"].rows[2]
    assert pairs.size == 2
    assert pairs.blocks == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert '<span class="block">0,2</span>' in page


def test_pcie_node_page_says_it_has_no_partitions(operator_client, fleet_east):
    page = operator_client.get(node_url("fleet:node-detail", "l40s-001")).content.decode()
    assert "PCIe node: single cards, no NVLink partitions." in page


def test_node_page_shows_failed_gpu_and_labels(operator_client, fleet_east):
    node = fleet_east["nodes"]["a100-001"]
    fleet.node_update(node=node, labels={"rack": "r12"}, bmc_address="10.0.0.9")
    fleet.gpu_set_health(gpu=node.gpus.get(index=5), health=Gpu.Health.FAILED)
    page = operator_client.get(node_url("fleet:node-detail", "a100-001")).content.decode()
    assert '<span class="bad">Failed</span>' in page
    assert "rack" in page and "r12" in page
    assert "10.0.0.9" in page


def test_unknown_node_is_404(operator_client, fleet_east):
    assert operator_client.get(node_url("fleet:node-detail", "h100-999")).status_code == 404


def test_cordon_button_confirms_naming_the_node_and_the_consequence(operator_client, fleet_east):
    page = operator_client.get(node_url("fleet:node-detail", "h100-001")).content.decode()
    assert (
        'hx-confirm="Cordon h100-001? No new VMs will be placed on it; running VMs keep running."'
        in page
    )
    assert f'hx-post="{node_url("fleet:node-cordon", "h100-001")}"' in page
    assert "Uncordon</button>" not in page  # a ready node can only be cordoned


def test_cordon_via_htmx_changes_state_answers_the_fragment_and_audits(
    operator_client, operator, fleet_east
):
    response = operator_client.post(node_url("fleet:node-cordon", "h100-001"), headers=HTMX)
    page = response.content.decode()
    assert response.status_code == 200
    assert Node.objects.get(hostname="h100-001").state == Node.State.CORDONED
    assert page.lstrip().startswith('<div id="node-live">')
    assert "<html" not in page
    assert '<span class="state-badge state-cordoned">Cordoned</span>' in page
    assert "Uncordon</button>" in page
    event = AuditEvent.objects.get(verb="node.cordon", object_label="h100-001")
    assert event.actor == operator
    assert (event.before, event.after) == ({"state": "ready"}, {"state": "cordoned"})
    assert "node.cordon" in page  # the recent changes in the fragment show it


def test_uncordon_returns_node_to_ready_and_audits(operator_client, operator, fleet_east):
    fleet.node_cordon(node=fleet_east["nodes"]["l40s-002"])
    response = operator_client.post(node_url("fleet:node-uncordon", "l40s-002"), headers=HTMX)
    assert response.status_code == 200
    assert Node.objects.get(hostname="l40s-002").state == Node.State.READY
    assert AuditEvent.objects.filter(verb="node.uncordon", actor=operator).count() == 1


def test_cordon_without_htmx_redirects_back_to_the_node(operator_client, fleet_east):
    response = operator_client.post(node_url("fleet:node-cordon", "h100-001"))
    assert response.status_code == 302
    assert response["Location"] == node_url("fleet:node-detail", "h100-001")
    assert Node.objects.get(hostname="h100-001").state == Node.State.CORDONED


def test_uncordon_of_a_down_node_is_refused_with_a_reason_and_changes_nothing(
    operator_client, fleet_east
):
    fleet.node_set_state(node=fleet_east["nodes"]["h100-001"], state=Node.State.DOWN)
    events_before = AuditEvent.objects.count()

    response = operator_client.post(node_url("fleet:node-uncordon", "h100-001"), headers=HTMX)
    page = response.content.decode()
    assert response.status_code == 409
    assert "Not changed: node h100-001 is down; it cannot become ready" in page
    assert Node.objects.get(hostname="h100-001").state == Node.State.DOWN
    assert AuditEvent.objects.count() == events_before


def test_refused_change_without_htmx_shows_the_whole_page_with_the_reason(
    operator_client, fleet_east
):
    fleet.node_set_state(node=fleet_east["nodes"]["h100-001"], state=Node.State.DOWN)
    response = operator_client.post(node_url("fleet:node-uncordon", "h100-001"))
    assert response.status_code == 409
    assert "<html" in response.content.decode()
    assert "it cannot become ready" in response.content.decode()


def test_cordon_without_csrf_token_is_refused(operator, fleet_east):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    response = client.post(node_url("fleet:node-cordon", "h100-001"), headers=HTMX)
    assert response.status_code == 403
    assert Node.objects.get(hostname="h100-001").state == Node.State.READY
    assert not AuditEvent.objects.filter(verb="node.cordon").exists()


def test_tenant_member_cannot_cordon(member_client, fleet_east):
    response = member_client.post(node_url("fleet:node-cordon", "h100-001"), headers=HTMX)
    assert response.status_code == 403
    assert Node.objects.get(hostname="h100-001").state == Node.State.READY


def test_cordon_refuses_get(operator_client, fleet_east):
    response = operator_client.get(node_url("fleet:node-cordon", "h100-001"))
    assert response.status_code == 405
    assert Node.objects.get(hostname="h100-001").state == Node.State.READY


# --- clusters ----------------------------------------------------------------------------------


@pytest.fixture
def rig(db):
    """A libvirt cluster whose VMs get no GPUs (as CI's), beside a production one."""
    rig = fleet.cluster_create(
        name="ci-rig",
        driver="libvirt",
        driver_settings={"uri": "qemu:///system", "gpu_passthrough": False},
    )
    fleet.node_create(
        cluster=rig,
        hostname="rig-001",
        gpu_model="RIG-GPU",
        fabric="pcie",
        gpu_count=2,
        guest_bridge="gpubr0",
        guest_subnet="10.213.0.0/24",
    )
    production = fleet.cluster_create(
        name="west", driver="libvirt", driver_settings={"uri": "qemu+ssh://root@{node}/system"}
    )
    return {"rig": rig, "production": production}


def test_a_cluster_without_gpu_passthrough_is_marked_a_test_rig_on_its_page(operator_client, rig):
    response = operator_client.get(reverse("fleet:cluster-detail", kwargs={"name": "ci-rig"}))
    html = response.content.decode()

    assert response.status_code == 200
    assert 'id="test-rig"' in html
    assert "Test rig: its VMs get no GPUs." in html
    assert "<dt>gpu_passthrough</dt><dd><code>false</code></dd>" in html
    assert "<code>10.213.0.0/24</code> on <code>gpubr0</code>" in html
    assert "rig-001" in html


def test_a_production_cluster_is_not_marked(operator_client, rig):
    response = operator_client.get(reverse("fleet:cluster-detail", kwargs={"name": "west"}))

    assert response.status_code == 200
    assert 'id="test-rig"' not in response.content.decode()
    assert "qemu+ssh://root@{node}/system" in response.content.decode()


def test_the_cluster_list_says_which_clusters_give_guests_no_gpus(operator_client, rig, fleet_east):
    html = operator_client.get(reverse("fleet:cluster-list")).content.decode()
    rows = {row.split("</strong>")[0].rsplit(">", 1)[-1]: row for row in html.split("<tr>")[2:]}

    assert "Test rig: none" in rows["ci-rig"]
    assert "Test rig: none" in rows["east"]  # the simulated driver boots no real guests
    assert "Passed through" in rows["west"]


def test_a_test_rigs_node_page_says_its_vms_get_no_gpus(operator_client, rig):
    response = operator_client.get(node_url("fleet:node-detail", "rig-001", cluster="ci-rig"))

    assert "Cluster ci-rig is a test rig: VMs on this node get no GPUs" in response.content.decode()


def test_an_unknown_cluster_is_404(operator_client, fleet_east):
    response = operator_client.get(reverse("fleet:cluster-detail", kwargs={"name": "nowhere"}))

    assert response.status_code == 404
