"""The node page's BMC panel (console/node_bmc.html): the BMC's address, user, "password set",
"TLS not verified" when it is off, the inventory the BMC gave; Rediscover starts a discovery
of the node with its stored credentials (a worker reads it; the panel polls), then shows the
preview and Apply. Operators only."""

import json

import pytest
from django.urls import reverse

from gpucap.bmc.discovery import DiscoveryEntry, discovery_run
from gpucap.bmc.discovery_runs import Outcome, discovery_carry_out
from gpucap.bmc.models import DiscoveryRun
from gpucap.bmc.services import bmc_credential_set
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster, Node
from tests.bmc.emulators import StaticBmc, free_port, mockup_copy

HTMX = {"HX-Request": "true"}
PASSWORD = "s3cret-bmc-password"


@pytest.fixture
def node(db, gpu_server_bmc) -> Node:
    """The emulated GPU server, discovered once: a node with its credentials and inventory."""
    fleet.cluster_create(name="east", driver=Cluster.Driver.SIMULATED)
    entry = DiscoveryEntry(
        where="entries[0]",
        cluster="east",
        address=gpu_server_bmc.url,
        username="admin",
        password=PASSWORD,
        fabric="nvswitch",
        gpu_model="H100-SXM5-80GB",
    )
    discovery_run(entries=[entry], dry_run=False)
    return Node.objects.get(hostname="h100-001")


def page_url(node) -> str:
    return reverse("fleet:node-detail", args=[node.cluster.name, node.hostname])


def panel_url(node, name: str = "node-bmc", *args) -> str:
    return reverse(f"fleet:{name}", args=[node.cluster.name, node.hostname, *args])


@pytest.fixture
def post(operator_client, django_capture_on_commit_callbacks, sent_tasks):
    def request(url: str):
        with django_capture_on_commit_callbacks(execute=True):
            return operator_client.post(url, headers=HTMX)

    return request


def work(sent_tasks) -> list[Outcome]:
    outcomes = [discovery_carry_out(run_id=args[0]) for _, args in sent_tasks]
    sent_tasks.clear()
    return outcomes


def test_the_panel_shows_how_gpucap_reaches_the_bmc_and_the_inventory(node, operator_client):
    page = operator_client.get(page_url(node)).content.decode()

    panel = page.split('id="node-bmc"')[1].split("</section>")[0]
    assert f"<code>{node.bmc_address}</code>" in panel
    assert "<code>admin</code>" in panel
    assert "password set" in panel and PASSWORD not in page
    assert "certificate verified" in panel and "bad tls-off" not in panel
    assert "Contoso GS-8H100" in panel and "S8H1000421" in panel
    assert "2 \N{MULTIPLICATION SIGN} Intel(R) Xeon(R) Platinum 8480+" in panel
    assert "2048 GiB" in panel
    assert "8 \N{MULTIPLICATION SIGN} NVIDIA H100 80GB HBM3" in panel
    assert "3c:ec:ef:10:20:01" in panel and "400 Gb/s" in panel
    rows = panel.split('<tr class="bmc-gpu">')[1:]
    assert len(rows) == 8
    assert "GPU-7a1c5e02-9b2d-4c3e-8f40-000000000018" in rows[0] and "0000:18:00.0" in rows[0]
    assert "Failed" in rows[5] and "BMC: Critical" in rows[5]
    assert "Rediscover" in panel and "hx-trigger" not in panel  # nothing running: no polling


def test_tls_not_verified_is_shown_in_red(node, operator_client):
    bmc_credential_set(node=node, username="admin", password=None, verify_tls=False)

    page = operator_client.get(page_url(node)).content.decode()

    assert '<span class="bad tls-off">TLS not verified</span>' in page


def test_rediscover_previews_then_applies(node, post, sent_tasks, operator_client, tmp_path):
    changed = mockup_copy(tmp_path / "gpu-server")
    _card(changed, "GPU_SXM_6", "OK")  # the failed card swapped for a healthy one
    with StaticBmc(changed) as bmc:
        node = fleet.node_update(node=node, bmc_address=bmc.url)

        reading = post(panel_url(node, "node-bmc-rediscover"))

        assert reading.status_code == 200
        fragment = reading.content.decode()
        assert fragment.lstrip().startswith('<section class="panel node-bmc" id="node-bmc"')
        assert "Reading the BMC" in fragment
        assert f'hx-get="{panel_url(node)}" hx-trigger="every 2s"' in fragment
        run = DiscoveryRun.objects.get(node=node)
        assert sent_tasks == [("bmc.discover", [run.pk])]
        assert work(sent_tasks) == [Outcome.PREVIEWED]

        previewed = operator_client.get(panel_url(node), headers=HTMX).content.decode()
        assert "hx-trigger" not in previewed  # read: the polling stops
        assert (
            "would update node east/h100-001: GPU 5 health failed -&gt; ok (BMC: OK); "
            "inventory changed" in previewed
        )
        assert "Apply" in previewed

        applying = post(panel_url(node, "node-bmc-apply", run.pk)).content.decode()
        assert "Reading the BMC again" in applying and "every 2s" in applying
        assert work(sent_tasks) == [Outcome.APPLIED]

    applied = operator_client.get(panel_url(node), headers=HTMX).content.decode()
    assert "Applied" in applied and "updated 1 node, unchanged 0" in applied
    assert node.gpus.get(index=5).health == "ok"


def test_rediscover_twice_reads_once(node, post, sent_tasks):
    post(panel_url(node, "node-bmc-rediscover"))
    post(panel_url(node, "node-bmc-rediscover"))

    assert DiscoveryRun.objects.filter(node=node).count() == 1
    assert len(sent_tasks) == 1


def test_a_node_without_credentials_cannot_be_rediscovered(node, post, operator_client):
    node.bmc_credential.delete()

    page = operator_client.get(page_url(node)).content.decode()
    assert "Rediscover" not in page.split('id="node-bmc"')[1]
    refused = post(panel_url(node, "node-bmc-rediscover"))

    assert refused.status_code == 400
    assert "Not done: node h100-001 has no BMC credentials" in refused.content.decode()
    assert not DiscoveryRun.objects.exists()


def test_apply_is_refused_when_it_is_not_a_preview(node, post, sent_tasks):
    post(panel_url(node, "node-bmc-rediscover"))
    run = DiscoveryRun.objects.get()

    early = post(panel_url(node, "node-bmc-apply", run.pk))

    assert early.status_code == 409
    assert f"discovery {run.pk} is still reading the BMCs" in early.content.decode()
    assert DiscoveryRun.objects.get().state == "reading"


def test_another_nodes_run_is_not_applied_from_this_page(node, post, sent_tasks):
    other = fleet.node_create(
        cluster=node.cluster,
        hostname="h100-002",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
        gpu_count=8,
    )
    post(panel_url(node, "node-bmc-rediscover"))
    work(sent_tasks)
    run = DiscoveryRun.objects.get()

    assert post(panel_url(other, "node-bmc-apply", run.pk)).status_code == 404
    assert DiscoveryRun.objects.get().state == "previewed"


def test_tenants_get_no_panel(node, member_client):
    for url in (panel_url(node), panel_url(node, "node-bmc-rediscover")):
        answer = member_client.post(url) if "rediscover" in url else member_client.get(url)
        assert answer.status_code == 403
    assert not DiscoveryRun.objects.exists()


def _card(mockup, processor: str, health: str) -> None:
    doc = mockup / "Systems" / "1" / "Processors" / processor / "index.json"
    doc.write_text(json.dumps({**json.loads(doc.read_text()), "Status": {"Health": health}}))


def test_a_bmc_that_changed_before_apply_shows_the_fresh_preview(
    node, post, sent_tasks, operator_client, tmp_path
):
    changed = mockup_copy(tmp_path / "gpu-server")
    _card(changed, "GPU_SXM_6", "OK")
    with StaticBmc(changed) as bmc:
        node = fleet.node_update(node=node, bmc_address=bmc.url)
        post(panel_url(node, "node-bmc-rediscover"))
        work(sent_tasks)
        seen = DiscoveryRun.objects.get(node=node)
        _card(changed, "GPU_SXM_3", "Critical")  # before the operator applies

        post(panel_url(node, "node-bmc-apply", seen.pk))
        assert work(sent_tasks) == [Outcome.REFUSED]

    fresh = DiscoveryRun.objects.get(node=node, state="previewed")
    panel = operator_client.get(panel_url(node), headers=HTMX).content.decode()
    assert f"Not applied: the BMC said something else when discovery {seen.pk} was applied" in (
        panel
    )
    assert "GPU 2 health ok -&gt; failed (BMC: Critical); GPU 5 health failed -&gt; ok" in panel
    assert panel_url(node, "node-bmc-apply", fresh.pk) in panel
    assert node.gpus.get(index=5).health == "failed"  # nothing applied


def test_problems_are_shown_and_nothing_changes(node, post, sent_tasks, operator_client):
    dead = f"http://127.0.0.1:{free_port()}"
    node = fleet.node_update(node=node, bmc_address=dead)
    post(panel_url(node, "node-bmc-rediscover"))

    assert work(sent_tasks) == [Outcome.FAILED]

    panel = operator_client.get(panel_url(node), headers=HTMX).content.decode()
    assert "Nothing applied: 1 problem." in panel
    assert f"node h100-001: no answer from the BMC at {dead} (connection refused)" in panel
    assert "Apply" not in panel.split('class="discovery')[1]
