"""The VM pages: a tenant's VMs with the request form, every VM for operators, and one VM's
detail with stop / start / terminate. Tenants see only their own VMs; a refused request
changes nothing and says why next to the field it is about."""

import re

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from gpucap.audit.models import AuditEvent
from gpucap.rentals import services
from gpucap.rentals.models import VirtualMachine
from gpucap.tenancy.models import Membership
from tests.conftest import PASSWORD
from tests.rentals import conftest as rentals_fixtures
from tests.rentals.vm_helpers import (
    IMAGE,
    SSH_KEY,
    request_vm,
    running_vm,
    stopped_vm,
    world,
)

# The VM fixtures of tests/rentals/conftest.py, which pytest only offers below tests/rentals/.
pools = rentals_fixtures.pools
nodes = rentals_fixtures.nodes
vm_in = rentals_fixtures.vm_in

HTMX = {"HX-Request": "true"}
TIMES = "\N{MULTIPLICATION SIGN}"
State = VirtualMachine.State


@pytest.fixture
def globex_vm(other_tenant, pools, nodes) -> VirtualMachine:
    return running_vm(
        other_tenant, pools["l40s-ondemand"], nodes["l40s-002"], [3], name="secret", ip="10.1.1.1"
    )


def tenant_vms_url(slug: str = "acme") -> str:
    return reverse("rentals:tenant-vms", kwargs={"slug": slug})


def detail_url(vm: VirtualMachine) -> str:
    return reverse("rentals:vm-detail", kwargs={"pk": vm.pk})


def action_url(action: str, vm: VirtualMachine) -> str:
    return reverse(f"rentals:vm-{action}", kwargs={"pk": vm.pk})


def request_form(pool, **overrides) -> dict:
    return {
        "pool": pool.pk,
        "name": "train-01",
        "gpu_count": 1,
        "image": IMAGE,
        "ssh_public_key": SSH_KEY,
        **overrides,
    }


def field_error(page: str, field: str) -> str:
    """The error shown right under a form field."""
    match = re.search(rf'<p class="field-error" id="id_{field}-error">([^<]*)</p>', page)
    assert match, f"no error shown next to {field}"
    return match[1]


# --- who may see what -------------------------------------------------------------------------


def test_anonymous_visitor_is_sent_to_login(client, globex_vm):
    for url in (reverse("rentals:vm-list"), tenant_vms_url(), detail_url(globex_vm)):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"] == f"{reverse('login')}?next={url}"


def test_my_vms_takes_a_member_of_one_tenant_to_its_vms(member_client, pools):
    response = member_client.get(reverse("rentals:vm-list"))
    assert response.status_code == 302
    assert response["Location"] == tenant_vms_url("acme")


def test_a_member_of_several_tenants_picks_whose_vms(member_client, member, other_tenant):
    Membership.objects.create(user=member, tenant=other_tenant)
    page = member_client.get(reverse("rentals:vm-list")).content.decode()
    assert "Whose VMs?" in page
    assert f'href="{tenant_vms_url("acme")}"' in page
    assert f'href="{tenant_vms_url("globex")}"' in page


def test_nav_links_my_vms_for_members_and_vms_for_operators(member_client, operator_client, pools):
    tenant_page = member_client.get(tenant_vms_url()).content.decode()
    assert f'<a href="{reverse("rentals:vm-list")}" aria-current="page">My VMs</a>' in tenant_page
    operator_page = operator_client.get(reverse("rentals:vm-list")).content.decode()
    assert f'<a href="{reverse("rentals:vm-list")}" aria-current="page">VMs</a>' in operator_page


def test_tenant_landing_page_links_to_its_vms(member_client, pools):
    page = member_client.get(reverse("tenant-detail", kwargs={"slug": "acme"})).content.decode()
    assert f'href="{tenant_vms_url("acme")}">My VMs</a>' in page


def test_another_tenants_vm_list_is_a_404(member_client, globex_vm):
    response = member_client.get(tenant_vms_url("globex"))
    assert response.status_code == 404
    assert "secret" not in response.content.decode()


def test_another_tenants_vm_is_a_404_to_read_and_to_act_on(member_client, globex_vm):
    before = world()
    response = member_client.get(detail_url(globex_vm))
    assert response.status_code == 404
    assert "secret" not in response.content.decode()
    for action in ("stop", "start", "terminate"):
        response = member_client.post(action_url(action, globex_vm), headers=HTMX)
        assert response.status_code == 404, action
    assert world() == before


def test_a_tenants_list_excludes_other_tenants_vms(member_client, tenant, pools, globex_vm):
    request_vm(tenant, pools["a100-standalone"], name="mine")
    page = member_client.get(tenant_vms_url()).content.decode()
    assert ">mine</a>" in page
    assert "secret" not in page
    assert globex_vm.instance_id not in page


def test_operator_pages_of_vms_are_open_to_operators_only_for_all_vms(
    operator_client, member_client, tenant, pools, globex_vm
):
    mine = request_vm(tenant, pools["a100-standalone"], name="mine")
    page = operator_client.get(reverse("rentals:vm-list")).content.decode()
    assert ">mine</a>" in page and ">secret</a>" in page
    # A member asking for the operator list (even filtered to another tenant) lands on their own.
    response = member_client.get(reverse("rentals:vm-list") + "?tenant=globex")
    assert response["Location"] == tenant_vms_url("acme")
    assert operator_client.get(detail_url(mine)).status_code == 200


# --- a tenant's VMs ---------------------------------------------------------------------------


def test_my_vms_lists_state_pool_gpus_node_indices_and_ip(member_client, tenant, pools, nodes):
    running_vm(
        tenant, pools["a100-standalone"], nodes["a100-001"], [4, 5, 6, 7], name="big", ip="10.0.0.7"
    )
    pending = request_vm(tenant, pools["h100-spot"], name="waiting", gpu_count=2)
    page = member_client.get(tenant_vms_url()).content.decode()

    row = page[page.index('class="vm-row"') :]
    assert ">big</a>" in page and pending.instance_id in page
    assert '<span class="vm-state vm-state-running">Running</span>' in page
    assert '<span class="vm-state vm-state-pending">Pending</span>' in page
    assert f"4 {TIMES} A100-SXM4-80GB" in page
    assert 'a100-001 · GPUs <span class="gpu-indices">4,5,6,7</span>' in page
    assert "<code>10.0.0.7</code>" in page
    assert f"2 {TIMES} H100-SXM5-80GB" in page and "waiting for capacity" in page
    # Newest first.
    assert row.index(">waiting</a>") < row.index(">big</a>")


def test_the_table_polls_fast_while_a_vm_is_changing_and_slowly_otherwise(
    member_client, tenant, pools, nodes
):
    vm = request_vm(tenant, pools["a100-standalone"], name="soon")
    response = member_client.get(tenant_vms_url(), headers=HTMX)
    fragment = response.content.decode()
    # An HTMX poll gets only the table: no page around it, no form.
    assert fragment.lstrip().startswith('<section class="panel" id="vm-table"')
    assert "<html" not in fragment and "Request a VM" not in fragment
    assert 'hx-trigger="every 3s, vms-changed from:body"' in fragment

    services.vm_place(vm=vm, node=nodes["a100-001"], gpu_indices=[0])
    services.vm_mark_running(vm=vm, ip_address="10.0.0.9")
    fragment = member_client.get(tenant_vms_url(), headers=HTMX).content.decode()
    assert "vm-state-running" in fragment
    assert 'hx-trigger="every 30s, vms-changed from:body"' in fragment


def test_terminated_vms_are_hidden_until_asked_for(member_client, tenant, pools):
    gone = request_vm(tenant, pools["a100-standalone"], name="gone")
    services.vm_terminate(vm=gone)
    request_vm(tenant, pools["a100-standalone"], name="kept")
    page = member_client.get(tenant_vms_url()).content.decode()
    assert ">kept</a>" in page and ">gone</a>" not in page
    assert "Show terminated (1)" in page
    page = member_client.get(tenant_vms_url() + "?terminated=1").content.decode()
    assert ">gone</a>" in page and "vm-state-terminated" in page
    assert "Hide terminated" in page


def test_my_vms_runs_a_fixed_number_of_queries(
    member_client, tenant, pools, nodes, django_assert_num_queries
):
    running_vm(tenant, pools["a100-standalone"], nodes["a100-001"], [0], name="one", ip="10.0.0.1")
    # session, user; memberships, tenant; VMs, their GPUs, terminated count; pools; images.
    with django_assert_num_queries(9):
        member_client.get(tenant_vms_url())
    for index in range(1, 8):
        running_vm(
            tenant,
            pools["a100-standalone"],
            nodes["a100-001"],
            [index],
            name=f"vm{index}",
            ip=f"10.0.0.{index + 1}",
        )
    request_vm(tenant, pools["h100-spot"], name="waiting", gpu_count=8)
    # ... and why the pending one waits: its pool's line, the plans that place it.
    with django_assert_num_queries(11):
        response = member_client.get(tenant_vms_url())
    assert len(response.context["listing"].vms) == 9


def test_operator_looks_at_a_tenants_vms_read_only(operator_client, tenant, pools):
    request_vm(tenant, pools["a100-standalone"], name="mine")
    page = operator_client.get(tenant_vms_url()).content.decode()
    assert ">mine</a>" in page
    assert "Operator view · read-only" in page
    assert "Request a VM" not in page
    before = world()
    response = operator_client.post(tenant_vms_url(), request_form(pools["a100-standalone"]))
    assert response.status_code == 403
    assert world() == before


# --- requesting a VM --------------------------------------------------------------------------


def test_the_form_offers_only_pools_the_tenant_may_rent_in(member_client, pools):
    form = member_client.get(tenant_vms_url()).context["form"]
    offered = {pool.name for pool in form.fields["pool"].queryset}
    # Not h100-ondemand (not granted), not h100-inference (inference pools serve deployments).
    assert offered == {"h100-spot", "a100-standalone", "l40s-ondemand"}
    page = member_client.get(tenant_vms_url()).content.decode()
    assert "h100-ondemand" not in page
    assert ">a100-standalone · On-demand · A100-SXM4-80GB NVSwitch</option>" in page


def test_the_form_starts_on_an_image_meant_for_a_vm_not_a_replica_image(member_client, pools):
    """gpucap-model-server sorts first, but it is a replica image (it serves a port)."""
    form = member_client.get(tenant_vms_url()).context["form"]
    assert form.fields["image"].choices[0][0] == "gpucap-model-server"
    assert form["image"].value() == IMAGE
    page = member_client.get(tenant_vms_url()).content.decode()
    assert re.search(rf'<option value="{IMAGE}" selected>', page)


def test_a_member_requests_a_vm_and_it_waits_in_pending(member_client, member, tenant, pools):
    response = member_client.post(
        tenant_vms_url(), request_form(pools["a100-standalone"], gpu_count=4), headers=HTMX
    )
    assert response.status_code == 200
    vm = VirtualMachine.objects.get(tenant=tenant, name="train-01")
    assert (vm.state, vm.gpu_count, vm.pool, vm.created_by) == (
        State.PENDING,
        4,
        pools["a100-standalone"],
        member,
    )
    # The form answers in place, cleared, and tells the table to refresh now.
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<section class="panel" id="vm-request"')
    assert f'Requested <a href="{detail_url(vm)}">{vm.instance_id}</a> (train-01)' in fragment
    assert 'value="train-01"' not in fragment
    assert response["HX-Trigger"] == "vms-changed"
    assert AuditEvent.objects.filter(
        verb="vm.request", object_id=str(vm.pk), actor_label="mallory"
    ).exists()


def test_a_request_without_htmx_redirects_to_the_list(member_client, tenant, pools):
    response = member_client.post(tenant_vms_url(), request_form(pools["h100-spot"], gpu_count=8))
    assert response.status_code == 302
    assert response["Location"] == tenant_vms_url()
    assert VirtualMachine.objects.get(name="train-01").gpu_count == 8


@pytest.mark.parametrize(
    ("pool", "gpu_count", "reason"),
    [
        ("l40s-ondemand", 2, "PCIe sets allocate single cards, so every VM has exactly 1 GPU"),
        ("a100-standalone", 3, "NVSwitch sets allocate whole partitions of 1, 2, 4 or 8 GPUs"),
        ("h100-spot", 6, "6 GPUs is not an NVLink partition size"),
    ],
)
def test_a_gpu_count_the_fabric_cannot_give_is_refused_next_to_the_field(
    member_client, pools, pool, gpu_count, reason
):
    before = world()
    response = member_client.post(
        tenant_vms_url(), request_form(pools[pool], gpu_count=gpu_count), headers=HTMX
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert reason in field_error(page, "gpu_count")
    assert 'class="field field-invalid"' in page
    # What was typed stays in the form.
    assert 'value="train-01"' in page
    assert world() == before


def test_a_pool_the_tenant_may_not_use_is_refused_next_to_the_pool(member_client, pools):
    before = world()
    response = member_client.post(
        tenant_vms_url(), request_form(pools["h100-ondemand"]), headers=HTMX
    )
    assert response.status_code == 400
    assert field_error(response.content.decode(), "pool") == (
        "is not a pool your tenant may rent VMs in"
    )
    assert world() == before


def test_a_malformed_ssh_key_is_refused_next_to_the_key(member_client, pools):
    before = world()
    response = member_client.post(
        tenant_vms_url(),
        request_form(pools["a100-standalone"], ssh_public_key="hunter2"),
        headers=HTMX,
    )
    assert response.status_code == 400
    assert "must be one OpenSSH public key line" in field_error(
        response.content.decode(), "ssh_public_key"
    )
    assert world() == before


def test_a_name_already_in_use_and_a_missing_image_are_both_named(member_client, tenant, pools):
    request_vm(tenant, pools["a100-standalone"], name="train-01")
    before = world()
    response = member_client.post(
        tenant_vms_url(), request_form(pools["a100-standalone"], image=""), headers=HTMX
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert field_error(page, "image") == "This field is required."
    # The name is checked by the service once the shape is right.
    response = member_client.post(
        tenant_vms_url(), request_form(pools["a100-standalone"]), headers=HTMX
    )
    assert "already has a VM named" in field_error(response.content.decode(), "name")
    assert world() == before


def test_a_member_cannot_request_a_vm_for_another_tenant(member_client, pools):
    before = world()
    response = member_client.post(tenant_vms_url("globex"), request_form(pools["l40s-ondemand"]))
    assert response.status_code == 404
    assert world() == before


# --- one VM -----------------------------------------------------------------------------------


def test_vm_detail_shows_state_pool_node_gpus_ip_and_its_trail(member_client, tenant, pools, nodes):
    vm = running_vm(
        tenant, pools["a100-standalone"], nodes["a100-001"], [2, 3], name="pair", ip="10.0.0.23"
    )
    page = member_client.get(detail_url(vm)).content.decode()
    assert f'<h1>pair <span class="muted"><code>{vm.instance_id}</code>' in page
    assert '<span class="vm-state vm-state-running">Running</span>' in page
    assert "a100-standalone" in page and f"2 {TIMES} A100-SXM4-80GB" in page
    assert "a100-001" in page and "<code>10.0.0.23</code>" in page
    gpu_rows = re.findall(r'<tr><td class="num">(\d)</td><td><code>', page)
    assert gpu_rows == ["2", "3"]
    for verb in ("vm.request", "vm.provisioning", "vm.running"):
        assert f"<code>{verb}</code>" in page
    assert page.index("<code>vm.running</code>") < page.index("<code>vm.request</code>")


@pytest.mark.parametrize(
    ("state", "buttons"),
    [
        (State.PENDING, {"Terminate"}),
        (State.RUNNING, {"Stop", "Terminate"}),
        (State.STOPPED, {"Start", "Terminate"}),
        (State.FAILED, {"Start", "Terminate"}),
        (State.TERMINATED, set()),
    ],
)
def test_only_legal_actions_are_offered(member_client, vm_in, state, buttons):
    vm = vm_in(state, pool="a100-standalone", node="a100-001")
    page = member_client.get(detail_url(vm)).content.decode()
    offered = set(re.findall(r'<button type="submit" class="button[^"]*">(\w+)</button>', page))
    assert offered == buttons


def test_each_action_asks_for_confirmation_naming_the_vm_and_the_consequence(
    member_client, tenant, pools, nodes
):
    running = running_vm(
        tenant, pools["a100-standalone"], nodes["a100-001"], [0], name="web", ip="10.0.0.2"
    )
    page = member_client.get(detail_url(running)).content.decode()
    assert (
        f'hx-confirm="Stop {running.instance_id} (web)? The guest is shut down and its 1 GPU '
        "released; its disk is kept" in page
    )
    assert (
        f'hx-confirm="Terminate {running.instance_id} (web)? The VM and its disk are deleted for '
        "good once it has stopped. This cannot be undone." in page
    )
    stopped = stopped_vm(tenant, pools["a100-standalone"], nodes["a100-001"], [1], name="db")
    page = member_client.get(detail_url(stopped)).content.decode()
    assert (
        f'hx-confirm="Start {stopped.instance_id} (db)? It asks pool a100-standalone for 1 GPU '
        "again and waits in pending until they are free." in page
    )


def test_a_member_stops_their_running_vm(member_client, tenant, pools, nodes):
    vm = running_vm(
        tenant, pools["a100-standalone"], nodes["a100-001"], [0], name="web", ip="10.0.0.2"
    )
    response = member_client.post(action_url("stop", vm), headers=HTMX)
    assert response.status_code == 200
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<div id="vm-live"')
    assert '<span class="vm-state vm-state-stopping">Stopping</span>' in fragment
    assert ">Stop</button>" not in fragment
    vm.refresh_from_db()
    assert (vm.state, vm.stop_reason) == (State.STOPPING, VirtualMachine.StopReason.OWNER)
    assert AuditEvent.objects.filter(
        verb="vm.stopping", object_id=str(vm.pk), actor_label="mallory"
    ).exists()


def test_a_member_starts_a_stopped_vm_and_terminates_a_pending_one(
    member_client, tenant, pools, nodes
):
    vm = stopped_vm(tenant, pools["a100-standalone"], nodes["a100-001"], [0], name="db")
    assert member_client.post(action_url("start", vm), headers=HTMX).status_code == 200
    vm.refresh_from_db()
    assert vm.state == State.PENDING
    assert member_client.post(action_url("terminate", vm), headers=HTMX).status_code == 200
    vm.refresh_from_db()
    assert vm.state == State.TERMINATED


def test_an_action_without_htmx_redirects_to_the_vm(member_client, tenant, pools):
    vm = request_vm(tenant, pools["a100-standalone"], name="gone")
    response = member_client.post(action_url("terminate", vm))
    assert response.status_code == 302
    assert response["Location"] == detail_url(vm)


@pytest.mark.parametrize(
    ("state", "action", "reason"),
    [
        (State.STOPPED, "stop", "is stopped; it cannot become stopping"),
        (State.RUNNING, "start", "is running; it cannot become pending"),
        (State.PENDING, "stop", "is pending; it cannot become stopping"),
    ],
)
def test_an_illegal_transition_is_a_409_shown_in_place_and_changes_nothing(
    member_client, vm_in, state, action, reason
):
    vm = vm_in(state, pool="a100-standalone", node="a100-001")
    before = world()
    response = member_client.post(action_url(action, vm), headers=HTMX)
    assert response.status_code == 409
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<div id="vm-live"')
    assert (
        f'<div class="alert alert-error" role="alert">Not changed: {vm.instance_id} {reason}'
        in (fragment)
    )
    assert world() == before


def test_the_tenant_sees_operators_as_operator_and_operators_see_names(
    member_client, operator_client, operator, tenant, pools, nodes
):
    vm = running_vm(
        tenant, pools["a100-standalone"], nodes["a100-001"], [0], name="web", ip="10.0.0.2"
    )
    services.vm_stop(vm=vm, actor=operator)
    tenant_page = member_client.get(detail_url(vm)).content.decode()
    assert "<td>operator</td>" in tenant_page and "olivia" not in tenant_page
    operator_page = operator_client.get(detail_url(vm)).content.decode()
    assert "<td>olivia</td>" in operator_page


def test_vm_detail_polls_while_the_vm_changes(member_client, tenant, pools, nodes):
    vm = request_vm(tenant, pools["a100-standalone"], name="soon")
    fragment = member_client.get(detail_url(vm), headers=HTMX).content.decode()
    assert f'<div id="vm-live" hx-get="{detail_url(vm)}" hx-trigger="every 3s"' in fragment
    assert "<html" not in fragment
    services.vm_terminate(vm=vm)
    fragment = member_client.get(detail_url(vm), headers=HTMX).content.decode()
    assert 'hx-trigger="every 30s"' in fragment


# --- every VM (operators) ---------------------------------------------------------------------


@pytest.fixture
def mixed_vms(tenant, other_tenant, pools, nodes) -> dict[str, VirtualMachine]:
    return {
        "acme-running": running_vm(
            tenant,
            pools["a100-standalone"],
            nodes["a100-001"],
            [0, 1],
            name="a-run",
            ip="10.0.0.3",
        ),
        "acme-pending": request_vm(tenant, pools["h100-spot"], name="a-wait", gpu_count=8),
        "globex-running": running_vm(
            other_tenant,
            pools["l40s-ondemand"],
            nodes["l40s-001"],
            [2],
            name="g-run",
            ip="10.0.0.4",
        ),
        "globex-stopped": stopped_vm(
            other_tenant, pools["l40s-ondemand"], nodes["l40s-002"], [0], name="g-stop"
        ),
    }


def listed(response) -> set[str]:
    return {vm.name for vm in response.context["page"].object_list}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", {"a-run", "a-wait", "g-run", "g-stop"}),
        ("?tenant=globex", {"g-run", "g-stop"}),
        ("?pool=l40s-ondemand", {"g-run", "g-stop"}),
        ("?state=running", {"a-run", "g-run"}),
        ("?tenant=globex&state=stopped", {"g-stop"}),
    ],
)
def test_operator_filters_vms(operator_client, mixed_vms, query, expected):
    response = operator_client.get(reverse("rentals:vm-list") + query)
    assert listed(response) == expected


def test_operator_filters_vms_by_node(operator_client, mixed_vms, nodes):
    response = operator_client.get(f"{reverse('rentals:vm-list')}?node={nodes['l40s-001'].pk}")
    assert listed(response) == {"g-run"}
    page = response.content.decode()
    assert f'<option value="{nodes["l40s-001"].pk}" selected>east/l40s-001</option>' in page


def test_operator_list_hides_terminated_vms_unless_filtered_for(operator_client, mixed_vms):
    services.vm_terminate(vm=mixed_vms["acme-pending"])
    assert "a-wait" not in listed(operator_client.get(reverse("rentals:vm-list")))
    response = operator_client.get(reverse("rentals:vm-list") + "?state=terminated")
    assert listed(response) == {"a-wait"}


def test_an_htmx_filter_returns_only_the_table(operator_client, mixed_vms):
    response = operator_client.get(reverse("rentals:vm-list") + "?tenant=acme", headers=HTMX)
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<div id="vm-table"')
    assert "<html" not in fragment and 'class="filters"' not in fragment
    assert ">a-run</a>" in fragment and "g-run" not in fragment
    # The poll keeps the filter.
    assert f'hx-get="{reverse("rentals:vm-list")}?tenant=acme&amp;page=1"' in fragment


def test_an_unknown_filter_value_is_reported_and_ignored(operator_client, mixed_vms):
    response = operator_client.get(reverse("rentals:vm-list") + "?tenant=nobody&state=running")
    assert listed(response) == {"a-run", "g-run"}
    assert "Ignored a filter:" in response.content.decode()


def test_operator_list_shows_tenant_and_links_nodes(operator_client, mixed_vms):
    page = operator_client.get(reverse("rentals:vm-list")).content.decode()
    assert ">Globex Research</a>" in page and ">Acme AI</a>" in page
    node_url = reverse("fleet:node-detail", kwargs={"cluster": "east", "hostname": "a100-001"})
    assert f'<a href="{node_url}">a100-001</a> · GPUs <span class="gpu-indices">0,1</span>' in page
    # A stopped VM's last address is not shown as if it were reachable.
    assert "<code>10.0.0.4</code>" in page and "10.9.9.9" not in page


def test_operator_list_is_paginated(operator_client, tenant, pools):
    for number in range(55):
        request_vm(tenant, pools["h100-spot"], name=f"batch-{number:02d}")
    first = operator_client.get(reverse("rentals:vm-list") + "?pool=h100-spot")
    assert len(first.context["page"].object_list) == 50
    assert "batch-54" in listed(first)
    page = first.content.decode()
    assert "Page 1 of 2" in page and "?pool=h100-spot&amp;page=2" in page
    second = operator_client.get(reverse("rentals:vm-list") + "?pool=h100-spot&page=2")
    assert listed(second) == {f"batch-{number:02d}" for number in range(5)}


def test_operator_list_runs_a_fixed_number_of_queries(
    operator_client, mixed_vms, tenant, pools, nodes, django_assert_num_queries
):
    # session, user, operator group; filter options (tenants, pools, nodes); count, VMs, GPUs;
    # why the pending VM waits (its pool's line, the plans that place it).
    with django_assert_num_queries(11):
        operator_client.get(reverse("rentals:vm-list"))
    for index in range(2, 8):
        running_vm(
            tenant,
            pools["a100-standalone"],
            nodes["a100-001"],
            [index],
            name=f"more-{index}",
            ip=f"10.0.1.{index}",
        )
    with django_assert_num_queries(11):
        response = operator_client.get(reverse("rentals:vm-list"))
    assert response.context["page"].paginator.count == 10


def test_an_operator_looks_at_a_tenants_vm_read_only(operator_client, operator, mixed_vms):
    """#16: the operators' view could stop, start and terminate tenants' VMs. They reclaim
    with a notice instead; the tenant's own buttons are not theirs."""
    vm = mixed_vms["globex-running"]
    page = operator_client.get(detail_url(vm)).content.decode()
    assert "Audit log of every VM" in page
    assert "Reclaim</button>" in page
    for action in ("stop", "start", "terminate"):
        assert action_url(action, vm) not in page
    before = world()
    for action in ("stop", "start", "terminate"):
        response = operator_client.post(action_url(action, vm), headers=HTMX)
        assert response.status_code == 403
        assert "read-only" in response.content.decode()
    assert world() == before
    vm.refresh_from_db()
    assert vm.state == State.RUNNING


def test_a_member_who_left_the_tenant_loses_its_vms(client, tenant, pools):
    vm = request_vm(tenant, pools["a100-standalone"], name="mine")
    leaver = User.objects.create_user("lee", password=PASSWORD)
    Membership.objects.create(user=leaver, tenant=tenant)
    client.force_login(leaver)
    assert client.get(detail_url(vm)).status_code == 200
    Membership.objects.filter(user=leaver).delete()
    assert client.get(detail_url(vm)).status_code == 404


# --- the image select ---------------------------------------------------------------------------


def test_the_request_form_offers_the_catalogues_enabled_images(member_client, tenant, pools):
    from gpucap.fleet import services as fleet

    fleet.image_create(
        cluster=pools["a100-standalone"].cluster,
        name="retired",
        base_image="/img/retired.qcow2",
        enabled=False,
    )
    page = member_client.get(tenant_vms_url()).content.decode()
    select = re.search(r'<select name="image"[^>]*>(.*?)</select>', page, re.S)
    assert select, "the image is chosen from a list"
    options = re.findall(r'<option value="([^"]*)"', select[1])
    assert options == ["gpucap-model-server", "ubuntu-24.04-cuda-12.6"]
    assert "(log in as ubuntu)" in select[1]


def test_an_image_not_in_the_catalogue_is_refused_next_to_the_field(member_client, tenant, pools):
    page = member_client.post(
        tenant_vms_url(), request_form(pools["a100-standalone"], image="windows-11"), headers=HTMX
    ).content.decode()
    assert field_error(page, "image") == "is not an image offered for your pools"
    assert not VirtualMachine.objects.exists()


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("name", "train\u202e-01", "bidirectional"),
        ("name", "train\x1b-01", "control character U+001B"),
        ("ssh_public_key", SSH_KEY + "\x07", "control character U+0007"),
    ],
)
def test_text_no_field_may_hold_is_refused_next_to_the_field(
    member_client, pools, field, value, reason
):
    response = member_client.post(
        tenant_vms_url(), request_form(pools["h100-spot"], **{field: value}), headers=HTMX
    )
    assert response.status_code == 400
    assert reason in field_error(response.content.decode(), field)
    assert not VirtualMachine.objects.exists()
