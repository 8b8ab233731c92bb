"""The notices page and the notice shown on a VM's pages: operators see every open notice with a
live countdown and the ones completed in the last day; a tenant member sees only their own
tenant's; HTMX polls get the tables alone; the lists run a fixed number of queries."""

from datetime import UTC, timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.fleet import models as fleet_models
from gpucap.fleet import services as fleet
from gpucap.notices.models import InterruptionNotice
from gpucap.notices.services import notice_acknowledge, notice_issue
from gpucap.rentals import services as rentals
from tests.rentals.vm_helpers import grant_pools, running_vm

HTMX = {"HX-Request": "true"}
LIST = "/notices/"


@pytest.fixture
def pools(fleet_east, tenant, other_tenant) -> dict:
    return grant_pools(fleet_east, tenant, other_tenant)


def notified(tenant, pool, node, gpu: int, *, name: str, reason: str = "reclaim", actor=None):
    vm = running_vm(tenant, pool, node, [gpu], name=name, ip=f"10.7.0.{gpu + 1}")
    return notice_issue(vm=vm, reason=reason, actor=actor, message=f"{reason} of {name}")


@pytest.fixture
def notices(pools, fleet_east, tenant, other_tenant, operator) -> dict:
    """acme: an open reclaim notice (spot) and a drain notice the guest acknowledged (done);
    globex: an open reclaim notice (on-demand)."""
    nodes = fleet_east["nodes"]
    acme_open = notified(
        tenant, pools["h100-spot"], nodes["h100-001"], 0, name="acme-train", actor=operator
    )
    acme_done = notified(
        tenant, pools["a100-standalone"], nodes["a100-001"], 0, name="acme-done", reason="drain"
    )
    notice_acknowledge(vm=acme_done.vm)
    rentals.vm_mark_stopped(vm=acme_done.vm)
    globex_open = notified(
        other_tenant, pools["l40s-ondemand"], nodes["l40s-001"], 0, name="globex-serve"
    )
    return {"acme_open": acme_open, "acme_done": acme_done, "globex_open": globex_open}


def iso(moment) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_operator_sees_every_open_notice_with_its_countdown(operator_client, notices):
    response = operator_client.get(LIST)
    page = response.content.decode()
    assert response.status_code == 200
    assert [n.vm.name for n in response.context["open_notices"]] == ["acme-train", "globex-serve"]
    for key in ("acme_open", "globex_open"):
        notice = notices[key]
        assert f'data-deadline="{iso(notice.deadline)}"' in page
        assert notice.vm.tenant.name in page
    assert "reclaim of acme-train" in page
    assert "by olivia" in page  # who issued it
    assert 'hx-trigger="every 5s"' in page
    assert '<a href="/notices/" aria-current="page">Notices</a>' in page


def test_completed_notices_show_their_outcome_in_a_table_of_their_own(operator_client, notices):
    done = InterruptionNotice.objects.get(pk=notices["acme_done"].pk)
    assert done.completed_at is not None
    response = operator_client.get(LIST)
    assert [n.pk for n in response.context["completed"]] == [done.pk]
    assert "acme-done" not in [n.vm.name for n in response.context["open_notices"]]
    completed = response.content.decode().split('id="completed-notices"')[1]
    assert "Released early by the guest" in completed
    assert "data-deadline" not in completed  # a finished notice has no countdown


def test_completed_notices_older_than_a_day_drop_off(operator_client, notices):
    InterruptionNotice.objects.filter(pk=notices["acme_done"].pk).update(
        completed_at=timezone.now() - timedelta(hours=25)
    )
    response = operator_client.get(LIST)
    assert response.context["completed"] == []
    assert "No notices completed in the last 24 hours." in response.content.decode()


def test_a_member_sees_only_their_tenants_notices(member_client, other_member_client, notices):
    mine = member_client.get(LIST)
    assert [n.vm.name for n in mine.context["open_notices"]] == ["acme-train"]
    assert [n.vm.name for n in mine.context["completed"]] == ["acme-done"]
    assert "globex-serve" not in mine.content.decode()
    assert "<th>Tenant</th>" not in mine.content.decode()

    theirs = other_member_client.get(LIST)
    assert [n.vm.name for n in theirs.context["open_notices"]] == ["globex-serve"]
    assert theirs.context["completed"] == []
    assert "acme" not in theirs.content.decode()


def test_filters_narrow_by_reason_and_status(operator_client, notices):
    drains = operator_client.get(LIST, {"reason": "drain"})
    assert drains.context["open_notices"] == []
    assert [n.vm.name for n in drains.context["completed"]] == ["acme-done"]
    assert "No open notices match these filters." in drains.content.decode()

    open_only = operator_client.get(LIST, {"status": "open"})
    assert len(open_only.context["open_notices"]) == 2
    assert open_only.context["completed"] is None
    assert 'id="completed-notices"' not in open_only.content.decode()

    completed_only = operator_client.get(LIST, {"status": "completed"})
    assert completed_only.context["open_notices"] is None
    assert 'id="open-notices"' not in completed_only.content.decode()


def test_a_bad_filter_is_named_and_ignored(operator_client, notices):
    response = operator_client.get(LIST, {"reason": "meteor"})
    page = response.content.decode()
    assert response.status_code == 200
    assert "Ignored a filter" in page
    assert "reason: Select a valid choice. meteor is not one of the available choices." in page
    assert len(response.context["open_notices"]) == 2


def test_an_htmx_poll_gets_only_the_tables(operator_client, notices):
    response = operator_client.get(LIST, {"reason": "reclaim"}, headers=HTMX)
    body = response.content.decode().strip()
    assert response.status_code == 200
    assert body.startswith('<div id="notice-tables"')
    assert "<html" not in body and 'class="filters"' not in body
    # The poll keeps the filter it was made with.
    assert 'hx-get="/notices/?reason=reclaim"' in body
    assert "acme-train" in body and "acme-done" not in body


def test_the_page_asks_for_a_sign_in(client, db):
    response = client.get(LIST)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def more_notices(pools, fleet_east, tenant, operator) -> None:
    nodes = fleet_east["nodes"]
    for gpu in range(1, 6):
        notified(tenant, pools["h100-spot"], nodes["h100-002"], gpu, name=f"more-{gpu}")
    for gpu in range(1, 4):
        done = notified(tenant, pools["a100-standalone"], nodes["a100-001"], gpu, name=f"d{gpu}")
        notice_acknowledge(vm=done.vm)
        rentals.vm_mark_stopped(vm=done.vm)


def test_operator_list_runs_a_fixed_number_of_queries(
    operator_client, notices, pools, fleet_east, tenant, operator, django_assert_num_queries
):
    # session, user, operator group; open notices; completed notices.
    with django_assert_num_queries(5):
        operator_client.get(LIST)
    more_notices(pools, fleet_east, tenant, operator)
    with django_assert_num_queries(5):
        response = operator_client.get(LIST)
    assert (len(response.context["open_notices"]), len(response.context["completed"])) == (7, 4)


def test_member_list_runs_a_fixed_number_of_queries(
    member_client, notices, pools, fleet_east, tenant, operator, django_assert_num_queries
):
    # session, user, memberships; open notices; completed notices.
    with django_assert_num_queries(5):
        member_client.get(LIST)
    more_notices(pools, fleet_east, tenant, operator)
    with django_assert_num_queries(5):
        response = member_client.get(LIST)
    assert (len(response.context["open_notices"]), len(response.context["completed"])) == (6, 4)


def test_the_vm_page_shows_its_open_notice_with_a_countdown(member_client, notices):
    notice = notices["acme_open"]
    page = member_client.get(reverse("rentals:vm-detail", args=[notice.vm.pk])).content.decode()
    assert "Interruption notice (reclaim):" in page
    assert "reclaim of acme-train" in page
    assert f'data-deadline="{iso(notice.deadline)}"' in page
    assert "resumes when capacity returns" in page  # a spot VM


def test_a_vm_without_an_open_notice_shows_none(member_client, notices):
    vm = notices["acme_done"].vm
    page = member_client.get(reverse("rentals:vm-detail", args=[vm.pk])).content.decode()
    assert 'id="vm-notice"' not in page
    assert "data-deadline" not in page


def test_my_vms_shows_the_countdown_of_a_notified_vm(member_client, tenant, notices):
    notice = notices["acme_open"]
    response = member_client.get(reverse("rentals:tenant-vms", args=[tenant.slug]))
    row = response.content.decode().split(f'id="vm-{notice.vm.pk}"')[1].split("</tr>")[0]
    assert "reclaim notice" in row
    assert f'data-deadline="{iso(notice.deadline)}"' in row
    done_row = response.content.decode().split(f'id="vm-{notices["acme_done"].vm.pk}"')[1]
    assert "data-deadline" not in done_row.split("</tr>")[0]


# --- reclaim and drain buttons ----------------------------------------------------------------


def node_url(node, action: str = "") -> str:
    name = "fleet:node-detail" if not action else f"fleet:node-{action}"
    return reverse(name, args=[node.cluster.name, node.hostname])


@pytest.fixture
def drain_world(pools, fleet_east, tenant, other_tenant):
    """On h100-001: a running spot VM (acme) and a running on-demand VM (globex)."""
    fleet.pool_set_tenants(pool=pools["h100-ondemand"], tenants=[other_tenant])
    node = fleet_east["nodes"]["h100-001"]
    spot = running_vm(tenant, pools["h100-spot"], node, [0], name="spot-job", ip="10.8.0.1")
    on_demand = running_vm(
        other_tenant, pools["h100-ondemand"], node, [1], name="steady", ip="10.8.0.2"
    )
    return {"node": node, "spot": spot, "on_demand": on_demand}


def test_operator_reclaims_a_rental_through_the_vm_page(operator_client, drain_world):
    vm = drain_world["spot"]
    page = operator_client.get(reverse("rentals:vm-detail", args=[vm.pk])).content.decode()
    assert (
        f'hx-confirm="Reclaim {vm.instance_id} (spot-job) of tenant Acme AI? It gets a reclaim '
        "notice and is stopped at the deadline, 120 s from now, releasing its 1 GPU; as a spot VM "
        'it keeps its disk and resumes when capacity returns."'
    ) in page

    response = operator_client.post(reverse("rentals:vm-reclaim", args=[vm.pk]), headers=HTMX)
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<div id="vm-live"')
    assert "Interruption notice (reclaim):" in body and "reclaimed by olivia" in body
    notice = InterruptionNotice.objects.get(vm=vm, completed_at=None)
    assert notice.reason == "reclaim"
    vm.refresh_from_db()
    assert vm.state == "notified"
    assert AuditEvent.objects.filter(verb="notice.reclaim", object_id=str(vm.pk)).exists()
    assert f'action="/vms/{vm.pk}/reclaim/"' not in body  # no second Reclaim button


def test_reclaiming_a_vm_that_is_not_running_is_refused_in_place(operator_client, drain_world):
    vm = drain_world["spot"]
    rentals.vm_stop(vm=vm)
    response = operator_client.post(reverse("rentals:vm-reclaim", args=[vm.pk]), headers=HTMX)
    assert response.status_code == 409
    assert "Not changed:" in response.content.decode()
    assert "only a running VM can get a notice" in response.content.decode()
    assert not InterruptionNotice.objects.exists()


def test_members_cannot_reclaim_and_see_no_button(member_client, drain_world):
    vm = drain_world["spot"]
    page = member_client.get(reverse("rentals:vm-detail", args=[vm.pk])).content.decode()
    assert "Reclaim" not in page
    response = member_client.post(reverse("rentals:vm-reclaim", args=[vm.pk]), headers=HTMX)
    assert response.status_code == 403
    vm.refresh_from_db()
    assert vm.state == "running"
    assert not InterruptionNotice.objects.exists()


def test_a_reclaim_without_a_csrf_token_is_refused(operator, drain_world):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    vm = drain_world["spot"]
    response = client.post(reverse("rentals:vm-reclaim", args=[vm.pk]))
    assert response.status_code == 403
    assert not InterruptionNotice.objects.exists()
    drain = client.post(node_url(drain_world["node"], "drain"))
    assert drain.status_code == 403
    drain_world["node"].refresh_from_db()
    assert drain_world["node"].state == "ready"


def test_draining_a_node_warns_spot_and_lists_on_demand_as_holding_it_up(
    operator_client, drain_world
):
    node = drain_world["node"]
    page = operator_client.get(node_url(node)).content.decode()
    assert (
        'hx-confirm="Drain h100-001? Its spot VMs and inference replicas get 120 s notices; '
        'on-demand VMs keep running and hold the drain."'
    ) in page

    response = operator_client.post(node_url(node, "drain"), headers=HTMX)
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<div id="node-live"')
    node.refresh_from_db()
    assert node.state == "draining"
    spot, on_demand = drain_world["spot"], drain_world["on_demand"]
    assert InterruptionNotice.objects.get(vm=spot, completed_at=None).reason == "drain"
    assert not InterruptionNotice.objects.filter(vm=on_demand).exists()
    on_demand.refresh_from_db()
    assert on_demand.state == "running"

    held_up = body.split('id="held-up-by"')[1]
    assert "Held up by" in body and "steady" in held_up and "spot-job" in held_up
    assert "on-demand: a drain never stops it" in held_up
    assert "notified: stops at its deadline" in held_up and "data-deadline" in held_up
    assert 'hx-trigger="every 5s"' in body  # a draining node keeps refreshing
    assert "Drain</button>" not in body


def test_an_empty_node_drains_straight_to_cordoned(operator_client, fleet_east):
    node = fleet_east["nodes"]["h100-002"]
    response = operator_client.post(node_url(node, "drain"))
    assert response.status_code == 302
    node.refresh_from_db()
    assert node.state == "cordoned"
    verbs = AuditEvent.objects.filter(object_id=str(node.pk), object_type="node")
    assert {"node.drain", "node.cordon"} <= set(verbs.values_list("verb", flat=True))


def test_draining_a_down_node_is_refused_in_place(operator_client, fleet_east):
    node = fleet_east["nodes"]["h100-002"]
    fleet.node_set_state(node=node, state="down")
    response = operator_client.post(node_url(node, "drain"), headers=HTMX)
    assert response.status_code == 409
    assert "Not changed: node h100-002 is down" in response.content.decode()
    node.refresh_from_db()
    assert node.state == "down"


def test_draining_a_set_drains_every_node_and_shows_who_holds_it(operator_client, drain_world):
    url = reverse("fleet:capacity-set-detail", args=["h100-east"])
    page = operator_client.get(url).content.decode()
    assert (
        'hx-confirm="Drain capacity set h100-east (2 nodes)? Its spot VMs and inference replicas '
        'get 120 s notices; on-demand VMs keep running and hold the drain."'
    ) in page

    response = operator_client.post(
        reverse("fleet:capacity-set-drain", args=["h100-east"]), headers=HTMX
    )
    assert response.status_code == 200 and response["HX-Trigger"] == "set-changed"
    live = reverse("fleet:capacity-set-live", args=["h100-east"])
    body = operator_client.get(live, headers=HTMX).content.decode()  # the poll it triggers
    states = dict(
        fleet_models.Node.objects.filter(capacity_set__name="h100-east").values_list(
            "hostname", "state"
        )
    )
    assert states == {"h100-001": "draining", "h100-002": "cordoned"}
    held_up = body.split('id="held-up-by"')[1]
    assert "h100-001" in held_up and "steady" in held_up
    assert "Drain set</button>" not in body
    assert AuditEvent.objects.filter(verb="capacity_set.drain").count() == 1


def test_members_cannot_drain(member_client, drain_world):
    response = member_client.post(node_url(drain_world["node"], "drain"))
    assert response.status_code == 403
    response = member_client.post(reverse("fleet:capacity-set-drain", args=["h100-east"]))
    assert response.status_code == 403
    drain_world["node"].refresh_from_db()
    assert drain_world["node"].state == "ready"
    assert not InterruptionNotice.objects.exists()
