"""The cluster page's "Discover machines" panel (console/cluster_discovery.html): rows of BMCs
start a discovery through the API's service (a worker reads them; the panel polls), then its
preview and Apply, or the problems naming each node or address; the cluster's recent
discoveries, the API's and the nodes' Rediscovers included. Bad input is answered next to its
field, row by row, and stores nothing. Operators only."""

import pytest
from django.urls import reverse

from gpucap.bmc import discovery_runs
from gpucap.bmc.discovery_runs import Outcome, discovery_carry_out
from gpucap.bmc.models import BmcCredential, DiscoveryRun
from gpucap.bmc.passwords import password_open
from gpucap.bmc.services import bmc_credential_set
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster, Node
from tests.bmc.emulators import free_port

HTMX = {"HX-Request": "true"}
PASSWORD = "s3cret-bmc-password"


@pytest.fixture
def east(db) -> Cluster:
    return fleet.cluster_create(name="east", driver=Cluster.Driver.SIMULATED)


@pytest.fixture
def post(operator_client, django_capture_on_commit_callbacks, sent_tasks):
    def request(url: str, data: dict | None = None, **headers):
        with django_capture_on_commit_callbacks(execute=True):
            return operator_client.post(url, data or {}, headers={**HTMX, **headers})

    return request


def work(sent_tasks) -> list[Outcome]:
    outcomes = [discovery_carry_out(run_id=args[0]) for _, args in sent_tasks]
    sent_tasks.clear()
    return outcomes


def url(name: str, *args) -> str:
    return reverse(f"fleet:{name}", args=["east", *args])


def row(index: int, **fields) -> dict:
    values = {
        "address": "",
        "username": "admin",
        "password": PASSWORD,
        "verify_tls": "on",
        "hostname": "",
        "gpu_model": "H100-SXM5-80GB",
        "fabric": "nvswitch",
        "system_id": "",
    }
    values.update(fields)
    return {f"bmc-{index}-{key}": value for key, value in values.items() if value is not None}


def blank(index: int) -> dict:
    return {f"bmc-{index}-{key}": "" for key in ("address", "username", "password", "hostname")}


def test_the_cluster_page_has_the_panel_with_one_row(east, operator_client):
    page = operator_client.get(reverse("fleet:cluster-detail", args=["east"])).content.decode()

    panel = page.split('id="cluster-discovery"')[1]
    assert "<h2>Discover machines</h2>" in panel
    assert panel.count('<fieldset class="discovery-row"') == 1
    assert 'name="bmc-0-password"' in panel and "never shown back" in panel
    assert f'hx-get="{url("cluster-discover-row")}?index=1"' in panel
    assert "None yet: discoveries started here, through the API" in panel


def test_another_row_comes_with_the_button_for_the_next(east, operator_client):
    answer = operator_client.get(url("cluster-discover-row") + "?index=3", headers=HTMX)

    fragment = answer.content.decode()
    assert answer.status_code == 200
    assert '<fieldset class="discovery-row" id="bmc-3">' in fragment
    assert 'name="bmc-3-address"' in fragment
    assert 'id="discovery-add-row" hx-swap-oob="true"' in fragment
    assert f"{url('cluster-discover-row')}?index=4" in fragment
    for index in ("", "x", "0", "-1", "99999"):
        bad = operator_client.get(f"{url('cluster-discover-row')}?index={index}", headers=HTMX)
        assert bad.status_code == 400


def test_a_discovery_is_read_previewed_and_applied(
    east, post, sent_tasks, operator_client, gpu_server_bmc
):
    started = post(url("cluster-discover"), {**blank(0), **row(1, address=gpu_server_bmc.url)})

    assert started.status_code == 200
    fragment = started.content.decode()
    assert fragment.lstrip().startswith('<section class="panel cluster-discovery"')
    run = DiscoveryRun.objects.get()
    assert run.entries == [
        {
            "cluster": "east",
            "address": gpu_server_bmc.url,
            "username": "admin",
            "verify_tls": True,
            "hostname": "",
            "gpu_model": "H100-SXM5-80GB",
            "fabric": "nvswitch",
            "system_id": "",
        }
    ]
    assert "Reading 1 BMC…" in fragment
    assert f'hx-get="{url("cluster-discovery", run.pk)}" hx-trigger="every 2s"' in fragment
    assert PASSWORD not in fragment
    assert sent_tasks == [("bmc.discover", [run.pk])]
    assert work(sent_tasks) == [Outcome.PREVIEWED]

    previewed = operator_client.get(url("cluster-discovery", run.pk), headers=HTMX)
    fragment = previewed.content.decode()
    assert fragment.lstrip().startswith('<div id="cluster-discoveries"')
    assert "hx-trigger" not in fragment  # read: the polling stops
    assert "would create node east/h100-001: 8 x H100-SXM5-80GB nvswitch" in fragment
    assert "dry run, nothing written: would create 1 node" in fragment
    assert 'hx-confirm="Apply these changes to east?' in fragment
    assert not Node.objects.exists()

    applying = post(url("cluster-discovery-apply", run.pk)).content.decode()
    assert "Reading the BMCs again" in applying and "every 2s" in applying
    assert work(sent_tasks) == [Outcome.APPLIED]

    applied = operator_client.get(url("cluster-discovery", run.pk), headers=HTMX).content.decode()
    assert "Applied" in applied and "created 1 node" in applied
    node = Node.objects.get(hostname="h100-001")
    assert node.gpus.count() == 8 and node.gpus.get(index=5).health == "failed"
    credential = BmcCredential.objects.get(node=node)
    assert password_open(credential.password_sealed, node="h100-001") == PASSWORD
    assert DiscoveryRun.objects.get().passwords_sealed == []


def test_problems_name_each_address_and_nothing_can_be_applied(
    east, post, sent_tasks, operator_client, gpu_server_bmc
):
    dead = f"http://127.0.0.1:{free_port()}"
    post(
        url("cluster-discover"),
        {**row(0, address=gpu_server_bmc.url), **row(1, address=dead, hostname="h100-002")},
    )
    run = DiscoveryRun.objects.get()
    assert len(run.entries) == 2

    assert work(sent_tasks) == [Outcome.FAILED]

    shown = operator_client.get(url("cluster-discovery", run.pk), headers=HTMX).content.decode()
    assert "Nothing applied: 1 problem." in shown
    assert f"node h100-002: no answer from the BMC at {dead} (connection refused)" in shown
    assert url("cluster-discovery-apply", run.pk) not in shown
    assert not Node.objects.exists()


@pytest.mark.parametrize(
    ("fields", "field", "reason"),
    [
        ({"address": ""}, "address", "BMC address: is required"),
        ({"address": "ftp://10.0.0.5"}, "address", "BMC address: speaks ftp://"),
        ({"address": "10.0.0.5 x"}, "address", "BMC address: must not contain spaces"),
        ({"username": ""}, "username", "User: is required"),
        ({"password": ""}, "password", "Password: is required"),
        ({"hostname": "Not A Host"}, "hostname", "Hostname: "),
        ({"fabric": "infiniband"}, "fabric", "Fabric: Select a valid choice."),
        ({"system_id": "System 1!"}, "system_id", "System id: must be a Redfish id"),
        ({"gpu_model": "g" * 65}, "gpu_model", "GPU model: Ensure this value has at most 64"),
    ],
)
def test_bad_input_is_answered_next_to_its_field_in_its_row_and_stores_nothing(
    east, post, sent_tasks, fields, field, reason
):
    data = {**row(0, address="https://10.0.0.5"), **blank(1), **row(3, **fields)}
    if "address" not in fields:
        data["bmc-3-address"] = "https://10.0.0.6"

    answer = post(url("cluster-discover"), data)

    assert answer.status_code == 400
    fragment = answer.content.decode()
    bad_row = fragment.split('<fieldset class="discovery-row" id="bmc-3">')[1].split("</fieldset>")[
        0
    ]
    invalid = bad_row.split(f'class="field field-{field}')[1].split("</div>")[0]
    assert "field-invalid" in invalid.split('"')[0]
    assert f'<p class="field-error" id="id_bmc-3-{field}-error">{reason}' in invalid
    first = fragment.split('<fieldset class="discovery-row" id="bmc-0">')[1].split("</fieldset>")[0]
    assert "field-error" not in first
    assert 'id="bmc-1"' not in fragment  # the empty row is left out
    assert "type them again" in fragment and PASSWORD not in fragment
    assert not DiscoveryRun.objects.exists() and sent_tasks == []


def test_an_empty_form_says_what_the_first_row_needs(east, post):
    answer = post(url("cluster-discover"), blank(0))

    assert answer.status_code == 400
    fragment = answer.content.decode()
    for label in ("BMC address", "User", "Password"):
        assert f"{label}: is required" in fragment
    assert not DiscoveryRun.objects.exists()


def test_more_rows_than_a_discovery_takes_are_refused(east, post, settings, monkeypatch):
    monkeypatch.setattr("gpucap.console.discovery_panel.MAX_ENTRIES", 2)
    data = {}
    for index in range(3):
        data.update(row(index, address=f"https://10.0.0.{index + 1}"))

    answer = post(url("cluster-discover"), data)

    assert answer.status_code == 400
    assert "Not started: at most 2 BMCs at once, got 3" in answer.content.decode()
    assert not DiscoveryRun.objects.exists()


def test_the_recent_discoveries_are_the_clusters_whoever_started_them(
    east, post, sent_tasks, operator_api, operator_client, django_assert_num_queries
):
    fleet.cluster_create(name="west", driver=Cluster.Driver.SIMULATED)
    api_entry = {
        "cluster": "east",
        "address": "https://10.0.0.7",
        "username": "admin",
        "password": PASSWORD,
        "fabric": "pcie",
    }
    assert (
        operator_api.post(
            "/api/bmc/discoveries/", {"entries": [api_entry]}, format="json"
        ).status_code
        == 202
    )
    west = discovery_runs.discovery_request(
        entries=[{**api_entry, "cluster": "west", "address": "https://10.9.9.9"}]
    )
    node = fleet.node_create(
        cluster=east,
        hostname="h100-009",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
        gpu_count=8,
        bmc_address="https://10.0.0.9",
    )
    bmc_credential_set(node=node, username="admin", password=PASSWORD)
    rediscover = discovery_runs.node_rediscover(node=node)
    post(url("cluster-discover"), row(0, address="https://10.0.0.8"))

    page = operator_client.get(reverse("fleet:cluster-detail", args=["east"])).content.decode()

    listed = page.split('<table class="table table-stack discovery-list">')[1].split("</table>")[0]
    assert listed.count('<tr class="discovery-listed') == 3
    assert "https://10.0.0.7" in listed and "https://10.0.0.8" in listed
    assert "node h100-009 (Rediscover)" in listed
    assert "10.9.9.9" not in listed and url("cluster-discovery", west.pk) not in page
    assert url("cluster-discovery", rediscover.pk) in listed
    # The newest, still being read, is shown and polled.
    newest = DiscoveryRun.objects.order_by("-pk").first()
    assert f'hx-get="{url("cluster-discovery", newest.pk)}" hx-trigger="every 2s"' in page
    # The session, its user and their group, the cluster, the run, the cluster's runs.
    with django_assert_num_queries(6):
        operator_client.get(url("cluster-discovery", newest.pk), headers=HTMX)


def test_another_clusters_discovery_is_not_found_here(east, post, sent_tasks):
    fleet.cluster_create(name="west", driver=Cluster.Driver.SIMULATED)
    west = discovery_runs.discovery_request(
        entries=[
            {
                "cluster": "west",
                "address": "https://10.9.9.9",
                "username": "admin",
                "password": PASSWORD,
            }
        ]
    )
    DiscoveryRun.objects.filter(pk=west.pk).update(state="previewed", digest="0" * 64)

    assert post(url("cluster-discovery-apply", west.pk)).status_code == 404
    assert DiscoveryRun.objects.get(pk=west.pk).state == "previewed"


def test_applying_a_discovery_still_being_read_is_a_409_saying_so(east, post, sent_tasks):
    post(url("cluster-discover"), row(0, address="https://10.0.0.5"))
    run = DiscoveryRun.objects.get()

    answer = post(url("cluster-discovery-apply", run.pk))

    assert answer.status_code == 409
    assert f"Not applied: discovery {run.pk} is still reading the BMCs" in answer.content.decode()
    assert DiscoveryRun.objects.get().state == "reading"


def test_without_htmx_the_run_has_a_page_of_its_own(
    east, operator_client, django_capture_on_commit_callbacks, sent_tasks
):
    with django_capture_on_commit_callbacks(execute=True):
        started = operator_client.post(url("cluster-discover"), row(0, address="https://10.0.0.5"))
    run = DiscoveryRun.objects.get()
    assert started.status_code == 302
    assert started["Location"] == url("cluster-discovery", run.pk)

    page = operator_client.get(started["Location"]).content.decode()
    assert "<title>" in page and f"Discovery {run.pk}" in page and "Reading 1 BMC" in page

    refused = operator_client.post(url("cluster-discover"), row(0, address=""))
    assert refused.status_code == 400 and "<title>" in refused.content.decode()


def test_tenants_and_visitors_cannot_discover(east, member_client, client, sent_tasks):
    data = row(0, address="https://10.0.0.5")
    for who in (member_client, client):
        assert who.post(url("cluster-discover"), data).status_code in (302, 403)
        assert who.get(url("cluster-discover-row") + "?index=1").status_code in (302, 403)
    assert member_client.post(url("cluster-discover"), data).status_code == 403
    assert not DiscoveryRun.objects.exists()
