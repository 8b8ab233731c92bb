"""Dedicated nodes through the API: POST /api/nodes/{id}/dedicate/ previews (dry_run) or applies,
/release/ gives the node back; operators only. A tenant reads its own dedicated nodes on
/api/tenants/{id}/dedicated-nodes/ and nobody else's."""

import pytest

from gpucap.fleet import services as fleet
from gpucap.fleet.models import Node
from gpucap.notices import dedications
from gpucap.notices.models import InterruptionNotice
from tests.rentals.vm_helpers import running_vm, world


@pytest.fixture
def busy(fleet_east, tenant, other_tenant):
    """h100-001 with globex's spot VM and globex's on-demand VM, and acme's own spot VM."""
    pools, node = fleet_east["pools"], fleet_east["nodes"]["h100-001"]
    for pool in ("h100-spot", "h100-ondemand"):
        fleet.pool_set_tenants(pool=pools[pool], tenants=[tenant, other_tenant])
    return {
        "node": node,
        "spot": running_vm(
            other_tenant, pools["h100-spot"], node, [0, 1], name="g-spot", ip="10.9.0.1"
        ),
        "on_demand": running_vm(
            other_tenant, pools["h100-ondemand"], node, [2, 3], name="g-od", ip="10.9.0.2"
        ),
        "own": running_vm(tenant, pools["h100-spot"], node, [4, 5], name="a-own", ip="10.9.0.3"),
    }


def dedicate(api, node, body):
    return api.post(f"/api/nodes/{node.pk}/dedicate/", body, format="json")


def test_a_dry_run_answers_who_gets_notices_and_who_holds_the_node_up(operator_api, busy, tenant):
    before = world()

    response = dedicate(operator_api, busy["node"], {"tenant": tenant.pk, "dry_run": True})

    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["dry_run"] is True and body["complete"] is False
    assert (body["hostname"], body["tenant_slug"]) == ("h100-001", "acme")
    assert [(n["vm_name"], n["tenant"], n["pool_kind"]) for n in body["notices"]] == [
        ("g-spot", "globex", "spot")
    ]
    assert [(h["vm_name"], h["waiting_for"]) for h in body["holders"]] == [("g-od", "on_demand")]
    assert world() == before
    # Without dry_run a request is a preview too: nothing is given away by omission.
    assert dedicate(operator_api, busy["node"], {"tenant": tenant.pk}).json()["dry_run"] is True
    assert world() == before


def test_applying_twice_notifies_once_and_the_node_shows_its_tenant(operator_api, busy, tenant):
    first = dedicate(operator_api, busy["node"], {"tenant": tenant.pk, "dry_run": False})
    second = dedicate(operator_api, busy["node"], {"tenant": tenant.pk, "dry_run": False})

    assert first.status_code == second.status_code == 200
    assert [n["vm_name"] for n in first.json()["notices"]] == ["g-spot"]
    assert second.json()["notices"] == [] and second.json()["dry_run"] is False
    assert InterruptionNotice.objects.filter(vm=busy["spot"]).count() == 1
    node = operator_api.get(f"/api/nodes/{busy['node'].pk}/").json()
    assert (node["dedicated_tenant"], node["dedicated_tenant_slug"]) == (tenant.pk, "acme")
    listed = operator_api.get(f"/api/nodes/?dedicated_tenant={tenant.pk}").json()["results"]
    assert [n["hostname"] for n in listed] == ["h100-001"]


def test_release_answers_the_shared_node(operator_api, busy, tenant, operator):
    dedications.node_dedicate(node=busy["node"], tenant=tenant, actor=operator)

    response = operator_api.post(f"/api/nodes/{busy['node'].pk}/release/")

    assert response.status_code == 200, response.json()
    assert response.json() == {
        "node": busy["node"].pk,
        "hostname": "h100-001",
        "dedicated_tenant": None,
    }
    assert Node.objects.get(pk=busy["node"].pk).dedicated_tenant is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tenant": 999999, "dry_run": False}, "tenant"),
        ({"dry_run": False}, "tenant"),
        ({"tenant": "acme", "dry_run": False}, "tenant"),
        ({"tenant": None, "dry_run": False}, "tenant"),
        ("TENANT", "dry_run"),
        ({"tenant": "TENANT", "dry_run": "yes"}, "dry_run"),
        ({"tenant": "TENANT", "dry_run": False, "state": "ready"}, "state"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_changes_nothing(
    operator_api, busy, tenant, body, field
):
    if body == "TENANT":
        body = {"tenant": tenant.pk, "dry_run": 1}
    elif body.get("tenant") == "TENANT":
        body = {**body, "tenant": tenant.pk}
    before = world()

    response = dedicate(operator_api, busy["node"], body)

    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]["fields"], response.json()
    assert world() == before
    assert Node.objects.get(pk=busy["node"].pk).dedicated_tenant is None


def test_an_unknown_tenant_is_named_in_words(operator_api, busy):
    response = dedicate(operator_api, busy["node"], {"tenant": 999999, "dry_run": True})

    assert "no tenant has id 999999" in str(response.json()["error"]["fields"]["tenant"])


def test_a_node_dedicated_to_another_tenant_is_a_409_naming_it(
    operator_api, busy, tenant, other_tenant, operator
):
    dedications.node_dedicate(node=busy["node"], tenant=other_tenant, actor=operator)
    before = world()

    for dry_run in (True, False):
        response = dedicate(operator_api, busy["node"], {"tenant": tenant.pk, "dry_run": dry_run})
        assert response.status_code == 409
        error = response.json()["error"]
        assert error["code"] == "node_dedicated"
        assert "Globex Research (globex)" in error["message"]
    assert world() == before


def test_releasing_a_shared_node_is_a_409(operator_api, busy):
    before = world()

    response = operator_api.post(f"/api/nodes/{busy['node'].pk}/release/")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "node_not_dedicated"
    assert "not dedicated" in response.json()["error"]["message"]
    assert world() == before


def test_an_unknown_node_is_404(operator_api, tenant):
    assert dedicate(operator_api, Node(pk=999999), {"tenant": tenant.pk}).status_code == 404
    assert operator_api.post("/api/nodes/999999/release/").status_code == 404


def test_a_tenant_cannot_dedicate_or_release(member_api, busy, tenant, operator):
    before = world()

    response = dedicate(member_api, busy["node"], {"tenant": tenant.pk, "dry_run": False})
    assert response.status_code == 403
    assert world() == before
    dedications.node_dedicate(node=busy["node"], tenant=tenant, actor=operator)
    assert member_api.post(f"/api/nodes/{busy['node'].pk}/release/").status_code == 403
    assert Node.objects.get(pk=busy["node"].pk).dedicated_tenant == tenant


def test_a_tenant_sees_only_its_own_dedicated_nodes(
    member_api, other_member_api, busy, fleet_east, tenant, other_tenant, operator
):
    dedications.node_dedicate(node=busy["node"], tenant=tenant, actor=operator)
    dedications.node_dedicate(
        node=fleet_east["nodes"]["h100-002"], tenant=other_tenant, actor=operator
    )

    mine = member_api.get(f"/api/tenants/{tenant.pk}/dedicated-nodes/")

    assert mine.status_code == 200
    [node] = mine.json()
    assert (node["hostname"], node["gpu_model"], node["gpu_count"]) == (
        "h100-001",
        "H100-SXM5-80GB",
        8,
    )
    assert [vm["name"] for vm in node["vms"]] == ["a-own"]
    # globex's VMs still leaving are counted, never named.
    assert node["others_leaving"] == 2 and node["free_gpus"] == 2
    assert "g-spot" not in mine.content.decode() and "g-od" not in mine.content.decode()
    theirs = member_api.get(f"/api/tenants/{other_tenant.pk}/dedicated-nodes/")
    assert theirs.status_code == 404
    assert [
        n["hostname"]
        for n in other_member_api.get(f"/api/tenants/{other_tenant.pk}/dedicated-nodes/").json()
    ] == ["h100-002"]
    # Nodes themselves are the operators'.
    assert member_api.get(f"/api/nodes/{busy['node'].pk}/").status_code in (403, 404)


def test_patching_a_node_does_not_dedicate_it_and_says_how(operator_api, busy, tenant):
    response = operator_api.patch(
        f"/api/nodes/{busy['node'].pk}/", {"dedicated_tenant": tenant.pk}, format="json"
    )

    assert response.status_code == 400
    assert "/dedicate/" in str(response.json()["error"]["fields"]["dedicated_tenant"])
    assert Node.objects.get(pk=busy["node"].pk).dedicated_tenant is None
