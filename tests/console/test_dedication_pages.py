"""The node page's dedication panel: pick a tenant, Preview (who gets notices, who holds the node
up), Apply, Release; each answered with the panel alone for HTMX; bad input re-rendered in place
with a 400 and nothing changed. The fleet grid, the set page and the portal mark dedicated
nodes."""

import pytest

from gpucap.fleet import services as fleet
from gpucap.fleet.models import Node
from gpucap.notices import dedications
from gpucap.notices.models import InterruptionNotice
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from tests.rentals.vm_helpers import running_vm, world

HTMX = {"HX-Request": "true"}


@pytest.fixture
def busy(fleet_east, tenant, other_tenant):
    """h100-001 with globex's spot VM and on-demand VM, and acme's own spot VM."""
    pools, node = fleet_east["pools"], fleet_east["nodes"]["h100-001"]
    for pool in ("h100-spot", "h100-ondemand"):
        fleet.pool_set_tenants(pool=pools[pool], tenants=[tenant, other_tenant])
    running_vm(other_tenant, pools["h100-spot"], node, [0, 1], name="g-spot", ip="10.9.0.1")
    running_vm(other_tenant, pools["h100-ondemand"], node, [2, 3], name="g-od", ip="10.9.0.2")
    running_vm(tenant, pools["h100-spot"], node, [4, 5], name="a-own", ip="10.9.0.3")
    return node


def url(action: str = "") -> str:
    return f"/fleet/nodes/east/h100-001/{action + '/' if action else ''}"


def dedicated_tenant(node: Node):
    return Node.objects.get(pk=node.pk).dedicated_tenant


def test_the_node_page_offers_the_dedication_form(operator_client, busy):
    page = operator_client.get(url()).content.decode()

    assert 'id="node-dedication"' in page
    assert 'name="tenant"' in page and "Acme AI" in page and "Globex Research" in page
    assert ">Preview</button>" in page


def test_preview_shows_notices_and_holders_in_the_panel_alone_and_changes_nothing(
    operator_client, busy
):
    before = world()

    response = operator_client.post(url("dedicate"), {"tenant": "acme"}, headers=HTMX)

    assert response.status_code == 200
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<section class="panel" id="node-dedication"')
    assert "<html" not in fragment and 'id="node-live"' not in fragment
    notices = fragment.split('class="table dedication-notices"')[1].split("</table>")[0]
    assert ">g-spot</a>" in notices and "g-od" not in notices and "a-own" not in notices
    holders = fragment.split('class="table blockers"')[1].split("</table>")[0]
    assert ">g-od</a>" in holders and "a drain never stops it" in holders
    assert 'name="apply"' in fragment and 'value="acme"' in fragment
    assert "get notices" in fragment  # the Apply button's confirmation
    assert world() == before
    assert dedicated_tenant(busy) is None


def test_apply_dedicates_and_notifies_once(operator_client, busy, tenant):
    first = operator_client.post(url("dedicate"), {"tenant": "acme", "apply": "1"}, headers=HTMX)
    second = operator_client.post(url("dedicate"), {"tenant": "acme", "apply": "1"}, headers=HTMX)

    assert first.status_code == second.status_code == 200
    assert "1 notice sent" in first.content.decode()
    assert "no notice sent" in second.content.decode()
    assert InterruptionNotice.objects.count() == 1
    assert dedicated_tenant(busy) == tenant
    fragment = second.content.decode()
    assert "Dedicated to" in fragment and "being dedicated" in fragment
    holders = fragment.split('class="table blockers"')[1].split("</table>")[0]
    assert ">g-spot</a>" in holders and ">g-od</a>" in holders and "a-own" not in holders
    assert ">Release</button>" in fragment


def test_without_htmx_apply_redirects_to_the_node_page(operator_client, busy, tenant):
    response = operator_client.post(url("dedicate"), {"tenant": "acme", "apply": "1"})

    assert response.status_code == 302 and response.url == url()
    page = operator_client.get(url()).content.decode()
    assert "Dedicated to" in page and "Acme AI" in page


@pytest.mark.parametrize("tenant_value", ["", "nobody"])
def test_bad_input_is_shown_in_place_with_a_400(operator_client, busy, tenant_value):
    before = world()

    response = operator_client.post(
        url("dedicate"), {"tenant": tenant_value, "apply": "1"}, headers=HTMX
    )

    assert response.status_code == 400
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<section class="panel" id="node-dedication"')
    assert 'class="field-error"' in fragment
    assert world() == before


def test_a_node_dedicated_to_another_tenant_is_a_409_naming_it(
    operator_client, busy, other_tenant, operator
):
    dedications.node_dedicate(node=busy, tenant=other_tenant, actor=operator)
    # The page shows the release button then; a stale form posted anyway:
    response = operator_client.post(url("dedicate"), {"tenant": "acme"}, headers=HTMX)

    assert response.status_code == 409
    assert "dedicated to tenant Globex Research" in response.content.decode()
    assert dedicated_tenant(busy) == other_tenant


def test_release_returns_the_node_and_a_shared_node_is_a_409(
    operator_client, busy, tenant, operator
):
    refused = operator_client.post(url("release"), headers=HTMX)
    assert refused.status_code == 409 and "not dedicated" in refused.content.decode()

    dedications.node_dedicate(node=busy, tenant=tenant, actor=operator)
    response = operator_client.post(url("release"), headers=HTMX)

    assert response.status_code == 200
    assert (
        "Released" in response.content.decode() and ">Preview</button>" in response.content.decode()
    )
    assert dedicated_tenant(busy) is None


def test_members_cannot_dedicate(member_client, busy):
    response = member_client.post(url("dedicate"), {"tenant": "acme", "apply": "1"}, headers=HTMX)

    assert response.status_code in (403, 404)
    assert dedicated_tenant(busy) is None


def test_the_grid_and_the_set_page_mark_dedicated_nodes(operator_client, busy, tenant, operator):
    dedications.node_dedicate(node=busy, tenant=tenant, actor=operator)

    for page in ("/fleet/", "/fleet/sets/h100-east/"):
        html = operator_client.get(page).content.decode()
        tile = html.split('href="/fleet/nodes/east/h100-001/"')[0].rsplit("<a ", 1)[1]
        assert "tile-dedicated" in tile, page
        assert "for acme" in html, page


def test_the_portal_shows_the_tenant_its_dedicated_nodes_only(
    member_client, other_member_client, busy, tenant, operator
):
    dedications.node_dedicate(node=busy, tenant=tenant, actor=operator)

    mine = member_client.get("/tenants/acme/").content.decode()
    section = mine.split('id="portal-dedicated"')[1].split("</section>")[0]
    assert "h100-001" in section and "H100-SXM5-80GB" in section and ">a-own</a>" in section
    assert "g-spot" not in section and "g-od" not in section
    assert "2 VMs of other tenants still leaving" in section
    theirs = other_member_client.get("/tenants/globex/").content.decode()
    assert 'id="portal-dedicated"' not in theirs


def test_without_htmx_a_preview_is_the_whole_page_with_the_preview(operator_client, busy):
    response = operator_client.post(url("dedicate"), {"tenant": "acme"})

    assert response.status_code == 200
    page = response.content.decode()
    assert "<html" in page and 'id="node-live"' in page
    assert "Dedicating h100-001 to Acme AI" in page
    assert dedicated_tenant(busy) is None


def test_a_node_being_dedicated_polls_its_panel_until_the_others_leave(
    operator_client, busy, tenant, operator
):
    dedications.node_dedicate(node=busy, tenant=tenant, actor=operator)

    fragment = operator_client.get(url() + "?part=dedication", headers=HTMX).content.decode()

    assert fragment.lstrip().startswith('<section class="panel" id="node-dedication"')
    assert 'hx-trigger="every 5s"' in fragment and "being dedicated" in fragment
    # The notified spot VM reaches its deadline; the on-demand VM's owner stops it.
    for vm in VirtualMachine.objects.exclude(tenant=tenant):
        if vm.state == VirtualMachine.State.NOTIFIED:
            vm = rentals.vm_stop_for_notice(vm=vm, message="deadline")
        else:
            vm = rentals.vm_stop(vm=vm)
        rentals.vm_mark_stopped(vm=vm)
    done = operator_client.get(url() + "?part=dedication", headers=HTMX).content.decode()
    assert "being dedicated" not in done and 'hx-trigger="every 5s"' not in done
    assert "Dedicated to" in done
