"""The arbiter on the capacity set page (DESIGN.md sections 8 and 11): the dry-run preview naming
its victims and why, Approve (once, and refused with what changed when stale), the mode switch,
plan history and plan pages, the what-if form, the live part's polling, who may see any of it,
and a query count that does not grow with the set."""

import pytest
from django.test import Client
from django.urls import reverse

from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet
from gpucap.notices import drains
from gpucap.notices.models import InterruptionNotice
from gpucap.plans import selectors, services
from gpucap.plans.models import Plan
from gpucap.rentals import services as rentals
from tests.rentals.vm_helpers import request_vm, running_vm, world

HTMX = {"HX-Request": "true"}
SET = "h100-east"
SET_PAGE = reverse("fleet:capacity-set-detail", kwargs={"name": SET})
GRID_SQUARE = 'class="gpu gpu-{}" title='  # a GPU square of the node grid


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def tick(capacity_set) -> Plan:
    return services.capacity_set_tick(capacity_set_id=capacity_set.pk).plan


def approve_url(plan: Plan) -> str:
    return reverse("plans:approve", kwargs={"name": SET, "plan_id": plan.pk})


def plan_url(plan: Plan) -> str:
    return reverse("plans:detail", kwargs={"name": SET, "plan_id": plan.pk})


LIVE = reverse("fleet:capacity-set-live", kwargs={"name": SET})
MODE = reverse("plans:mode", kwargs={"name": SET})
WHAT_IF = reverse("plans:what-if", kwargs={"name": SET})


@pytest.fixture
def proposal(h100, full_set, on_demand_request) -> Plan:
    """globex's 8-GPU on-demand request in the full set, and the dry-run plan for it."""
    on_demand_request()
    return tick(h100)


def victims(full_set):
    return full_set[2:]  # spot-3 and spot-4 on h100-002: the most recently started


# --- the preview ---------------------------------------------------------------------------------


def test_operator_sees_the_preview_naming_victims_and_reasons(operator_client, proposal, full_set):
    response = operator_client.get(SET_PAGE)
    page = response.content.decode()
    assert response.status_code == 200
    assert f'id="plan-{proposal.pk}"' in page and ">Proposed</span>" in page
    rows = page.split('class="preemption-row"')[1:]
    assert len(rows) == 2
    for row, victim, gpus in zip(
        rows, victims(full_set), ("0, 1, 2, 3", "4, 5, 6, 7"), strict=True
    ):
        assert f">{victim.name}</a>" in row and victim.instance_id in row
        for fact in ("Acme AI", "h100-spot", ">h100-002</a>", gpus, "minutes"):
            assert fact in row
        assert "reclaimed for" in row and "pool h100-ondemand, rank 2" in row
        assert ">train-1</a>" in row  # the VM it makes room for
    placement = page.split('class="placement-row"')[1]
    assert "train-1" in placement and "Globex Research" in placement
    assert "0, 1, 2, 3, 4, 5, 6, 7" in placement
    assert (
        f'hx-confirm="Approve plan {proposal.pk}? 2 VMs get 120 s notices (8 GPUs); '
        '1 demand is placed"'
    ) in page
    assert (
        'hx-confirm="Enable enforcement on h100-east? From now on every plan is applied as it is '
        'made; the current plan notifies 2 VMs."'
    ) in page
    # Bars: spot holds all 16 GPUs now and 8 after the plan; on-demand asks for 8.
    spot = page.split('id="bar-h100-spot"')[1].split('class="bar-row')[0]
    assert "16 GPUs held, 0 pending, 8 after the plan" in spot
    assert "0 GPUs held, 8 pending, 8 after the plan" in page.split('id="bar-h100-ondemand"')[1]
    assert 'class="floor-mark" style="left: 25.0%"' in page  # inference floor: 4 of 16 GPUs
    assert "Pools before and after" in page and "under its floor of 4" in page
    assert not InterruptionNotice.objects.exists()


def test_unsatisfied_demands_are_listed_with_their_reasons(
    operator_client, h100, full_set, fleet_east, tenant
):
    # A spot VM cannot take anything from the full set: its pool is the lowest.
    request_vm(tenant, fleet_east["pools"]["h100-spot"], name="more-spot", gpu_count=8)
    plan = tick(h100)
    page = operator_client.get(SET_PAGE).content.decode()
    assert plan.unsatisfied == 1
    row = page.split('class="unsatisfied-row"')[1]
    assert "more-spot" in row and "Acme AI" in row and "h100-spot" in row
    assert plan.actions.get(kind="unsatisfied").reason in row
    assert "Approve plan" not in page  # nothing to apply


def test_a_set_without_plans_says_so(operator_client, h100):
    page = operator_client.get(SET_PAGE).content.decode()
    assert "No plan yet" in page
    assert "Approve plan" not in page
    assert "no plan waits for approval now" in page


# --- Approve -------------------------------------------------------------------------------------


def live(client: Client, since: str = "") -> str:
    """The set page's poll, as the page sends it."""
    response = client.get(f"{LIVE}?since={since}", headers=HTMX)
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def test_approve_applies_the_plan_and_the_page_refreshes_at_once(
    operator_client, operator, proposal, full_set
):
    response = operator_client.post(approve_url(proposal), headers=HTMX)

    assert response.status_code == 200
    assert 'role="alert"' not in response.content.decode(), "nothing went wrong: nothing to say"
    assert response["HX-Trigger"] == "set-changed", "the page's poll runs at once"
    proposal.refresh_from_db()
    assert proposal.status == Plan.Status.APPLIED and proposal.approved_by == operator
    notices = InterruptionNotice.objects.filter(plan=proposal)
    assert sorted(notices.values_list("vm__name", flat=True)) == ["spot-3", "spot-4"]
    assert AuditEvent.objects.filter(verb="plan.approve", actor=operator).count() == 1

    body = live(operator_client)
    assert "2 of 2 notices sent (2 still counting down)" in body
    assert "1 waiting for its victims to stop" in body
    assert ">Applied</span>" in body and body.count("notice sent</span>") == 2
    assert body.count("data-deadline=") == 2, "each notice counts down on the page"
    assert f"Approve plan {proposal.pk}" not in body


def test_approve_without_htmx_redirects_to_the_set_page(operator_client, proposal):
    response = operator_client.post(approve_url(proposal))
    assert response.status_code == 302 and response["Location"] == SET_PAGE
    assert InterruptionNotice.objects.filter(plan=proposal).count() == 2


def test_a_stale_approve_is_refused_with_what_changed_and_the_fresh_plan(
    operator_client, proposal, on_demand_request
):
    on_demand_request(name="train-2")  # the set changes after the operator looked
    before = world()

    response = operator_client.post(approve_url(proposal), headers=HTMX)

    body = response.content.decode()
    assert response.status_code == 409
    assert body.lstrip().startswith('<div class="alert alert-error plan-alert" role="alert">')
    assert response["HX-Trigger"] == "set-changed"
    fresh = Plan.objects.get(status=Plan.Status.PROPOSED)
    assert fresh.pk != proposal.pk
    assert f"Not approved: plan {proposal.pk} was made from generation" in body
    assert f"review plan {fresh.pk} instead" in body
    assert "<h3>What changed</h3>" in body
    for line in services.plan_changes(proposal, fresh):
        assert line[0].upper() + line[1:] in body
    page = live(operator_client)  # the poll the answer triggers shows the fresh plan
    assert f'id="plan-{fresh.pk}"' in page
    assert f'hx-post="{approve_url(fresh)}"' in page  # the fresh plan's own Approve button
    assert not InterruptionNotice.objects.exists()
    assert world()["vms"] == before["vms"] and world()["allocations"] == before["allocations"]


def test_a_stale_approve_on_the_plan_page_shows_the_fresh_plan_there(
    operator_client, proposal, on_demand_request
):
    on_demand_request(name="train-2")
    response = operator_client.post(
        approve_url(proposal), headers={**HTMX, "HX-Target": "plan-detail"}
    )
    body = response.content.decode()
    fresh = Plan.objects.get(status=Plan.Status.PROPOSED)
    assert response.status_code == 409
    assert body.lstrip().startswith('<div id="plan-detail">')
    assert "What changed" in body and f'id="plan-{fresh.pk}"' in body
    assert response["HX-Push-Url"] == plan_url(fresh)


def test_approving_twice_is_refused(operator_client, proposal):
    assert operator_client.post(approve_url(proposal), headers=HTMX).status_code == 200
    notices = InterruptionNotice.objects.count()

    response = operator_client.post(approve_url(proposal), headers=HTMX)

    body = response.content.decode()
    assert response.status_code == 409
    assert f"Not approved: plan {proposal.pk} was applied at" in body
    assert "(approved by olivia)" in body
    assert InterruptionNotice.objects.count() == notices == 2


def test_approve_of_another_sets_plan_is_404(operator_client, proposal, fleet_east):
    url = reverse("plans:approve", kwargs={"name": "l40s-east", "plan_id": proposal.pk})
    assert operator_client.post(url, headers=HTMX).status_code == 404
    assert not InterruptionNotice.objects.exists()


# --- the mode switch -----------------------------------------------------------------------------


def test_enable_enforcement_and_back_to_dry_run_change_the_mode_and_are_audited(
    operator_client, operator, proposal, h100
):
    response = operator_client.post(MODE, {"mode": "enforce"}, headers=HTMX)

    assert response.status_code == 200 and response["HX-Trigger"] == "set-changed"
    h100.refresh_from_db()
    assert h100.mode == CapacitySet.Mode.ENFORCE
    body = live(operator_client)
    assert ">Switch to dry-run</button>" in body and "Enable enforcement</button>" not in body
    assert (
        'hx-confirm="Switch h100-east to dry-run? New plans will only be shown; notices already '
        'sent keep their deadlines."'
    ) in body
    # The header's badge follows.
    assert "Enforcing" in body.split('id="set-head"')[1].split("</h1>")[0]
    assert f"Approve plan {proposal.pk}" not in body  # enforcement applies it, not a click
    event = AuditEvent.objects.get(verb="capacity_set.mode", actor=operator)
    assert (event.before, event.after) == ({"mode": "dry_run"}, {"mode": "enforce"})

    response = operator_client.post(MODE, {"mode": "dry_run"}, headers=HTMX)

    assert response.status_code == 200
    h100.refresh_from_db()
    assert h100.mode == CapacitySet.Mode.DRY_RUN
    assert "Enable enforcement</button>" in live(operator_client)
    assert AuditEvent.objects.filter(verb="capacity_set.mode", actor=operator).count() == 2


def test_mode_switch_without_htmx_redirects(operator_client, h100):
    response = operator_client.post(MODE, {"mode": "enforce"})
    assert response.status_code == 302 and response["Location"] == SET_PAGE


def test_an_unknown_mode_is_a_400_naming_it_and_changes_nothing(operator_client, h100):
    events = AuditEvent.objects.count()
    response = operator_client.post(MODE, {"mode": "yolo"}, headers=HTMX)
    assert response.status_code == 400
    assert "Not changed: must be one of dry_run, enforce, got &#x27;yolo&#x27;" in (
        response.content.decode()
    )
    h100.refresh_from_db()
    assert h100.mode == CapacitySet.Mode.DRY_RUN
    assert AuditEvent.objects.count() == events


# --- history and plan pages ----------------------------------------------------------------------


def test_history_lists_every_plan_with_a_link_to_its_page(
    operator_client, operator, proposal, on_demand_request, h100
):
    on_demand_request(name="train-2")
    latest = tick(h100)
    operator_client.post(approve_url(latest), headers=HTMX)

    page = operator_client.get(SET_PAGE).content.decode()
    history = page.split('id="plan-history"')[1]
    for plan in (latest, proposal):
        row = history.split(f'id="history-{plan.pk}"')[1].split("</tr>")[0]
        assert f'href="{plan_url(plan)}"' in row
    latest_row = history.split(f'id="history-{latest.pk}"')[1].split("</tr>")[0]
    assert ">Applied</span>" in latest_row and "olivia" in latest_row
    assert "4 <span" in latest_row and "(16 GPUs)" in latest_row  # notices, GPUs
    old_row = history.split(f'id="history-{proposal.pk}"')[1].split("</tr>")[0]
    assert ">Superseded</span>" in old_row and "Periodic" in old_row
    assert history.index(f"history-{latest.pk}") < history.index(f"history-{proposal.pk}")


def test_plan_page_is_read_only_unless_it_is_the_current_proposal(
    operator_client, proposal, on_demand_request, h100
):
    on_demand_request(name="train-2")
    current = tick(h100)

    old = operator_client.get(plan_url(proposal)).content.decode()
    assert f"<h1>Plan {proposal.pk} of h100-east</h1>" in old
    assert ">Superseded</span>" in old and "spot-3" in old
    assert "<form" not in old.split('id="plan-detail"')[1]
    assert "A stored plan, read-only." in old

    page = operator_client.get(plan_url(current)).content.decode()
    assert f'hx-post="{approve_url(current)}"' in page
    assert 'hx-target="#plan-detail"' in page

    response = operator_client.post(
        approve_url(current), headers={**HTMX, "HX-Target": "plan-detail"}
    )
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<div id="plan-detail">')
    assert "4 of 4 notices sent" in body


def test_a_plan_of_another_set_is_404(operator_client, proposal, fleet_east):
    url = reverse("plans:detail", kwargs={"name": "l40s-east", "plan_id": proposal.pk})
    assert operator_client.get(url).status_code == 404


# --- the live part -------------------------------------------------------------------------------


def test_the_whole_page_polls_as_one_and_gets_204_until_something_changes(
    operator_client, proposal, on_demand_request, h100
):
    page = operator_client.get(SET_PAGE).content.decode()
    poller = page.split('<div id="set-poll"')[1].split(">")[0]
    poll = poller.split('hx-get="')[1].split('"')[0]
    assert poll.startswith(f"{LIVE}?since=")
    assert 'hx-trigger="every 5s, set-changed from:body"' in poller
    assert 'hx-include="#chart-days"' in poller, "the chart comes back with the span chosen"

    unchanged = operator_client.get(f"{poll}&days=7", headers=HTMX)
    assert unchanged.status_code == 204 and unchanged.content == b""

    on_demand_request(name="train-2")
    fresh = tick(h100)  # the worker makes a new plan

    response = operator_client.get(f"{poll}&days=7", headers=HTMX)
    body = response.content.decode()
    assert response.status_code == 200 and "<html" not in body
    assert f'id="plan-{fresh.pk}"' in body
    # Every region comes back and replaces itself: header, arbiter, plans, nodes, chart, poll.
    for region in ("set-head", "plan-live", "set-plans", "set-live", "set-allocation", "set-poll"):
        root = body.split(f'id="{region}"')[1].split(">")[0]
        assert 'hx-swap-oob="true"' in root, region
    assert f'Generation</dt><dd class="set-generation">{fresh.generation}</dd>' in body
    new_key = body.split(f"{LIVE}?since=")[1].split('"')[0]
    assert operator_client.get(f"{LIVE}?since={new_key}", headers=HTMX).status_code == 204


def test_the_poll_brings_the_chart_back_with_the_span_the_operator_chose(operator_client, proposal):
    body = operator_client.get(f"{LIVE}?since=&days=30", headers=HTMX).content.decode()
    chart = body.split('id="set-allocation"')[1]
    assert 'id="chart-days" name="days" value="30"' in chart
    assert 'aria-current="true">30 days</a>' in chart


def test_the_poll_url_opened_without_htmx_leads_to_the_page(operator_client, proposal):
    response = operator_client.get(LIVE)
    assert response.status_code == 302 and response["Location"] == SET_PAGE


def test_an_applied_plan_stays_pinned_with_its_countdowns_until_it_is_done(
    operator_client, operator, proposal, on_demand_request, h100
):
    services.plan_approve(plan=proposal, actor=operator)
    on_demand_request(name="train-2")
    fresh = tick(h100)
    assert fresh.pk != proposal.pk

    page = operator_client.get(SET_PAGE).content.decode()
    pinned = page.split(f'id="plan-{proposal.pk}"')[1].split("</section>")[0]
    assert f'In flight: <a href="{plan_url(proposal)}">plan {proposal.pk}</a>' in pinned
    assert pinned.count("data-deadline=") == 2 and "1 waiting for its victims to stop" in pinned
    assert f'Latest plan: <a href="{plan_url(fresh)}">plan {fresh.pk}</a>' in page
    assert page.index(f'id="plan-{proposal.pk}"') < page.index(f'id="plan-{fresh.pk}"')

    # The victims stop at their deadlines, the placement is made and its VM boots and runs.
    for notice in InterruptionNotice.objects.filter(plan=proposal).select_related("vm"):
        vm = rentals.vm_stop_for_notice(vm=notice.vm, message="deadline")
        rentals.vm_mark_stopped(vm=vm)
    tick(h100)
    page = operator_client.get(SET_PAGE).content.decode()
    pinned = page.split(f'id="plan-{proposal.pk}"')[1].split("</section>")[0]
    assert "1 booting" in pinned and "placed, booting" in pinned, "still watched while it boots"
    train = proposal.actions.get(kind="placement").vm
    rentals.vm_mark_running(vm=train, ip_address="10.9.0.1")

    page = operator_client.get(SET_PAGE).content.decode()
    assert f'id="plan-{proposal.pk}"' not in page, "done: only the history keeps it"
    assert f'id="history-{proposal.pk}"' in page


def test_a_set_with_nothing_to_do_says_so_and_counts_the_replans_it_folded(
    operator_client, operator, h100, full_set
):
    services.capacity_set_set_mode(capacity_set=h100, mode="enforce", actor=operator)
    idle = tick(h100)
    node = h100.nodes.get(hostname="h100-001")
    for _ in range(4):
        fleet.node_cordon(node=node, actor=operator)
        fleet.node_uncordon(node=node, actor=operator)
        assert tick(h100) == idle

    page = operator_client.get(SET_PAGE).content.decode()
    latest = page.split(f'id="plan-{idle.pk}"')[1].split("</section>")[0]
    assert ">Nothing to do</span>" in latest and ">Proposed</span>" not in latest
    assert "Found again</dt>" in latest and "4 times, last" in latest
    history = page.split('id="plan-history"')[1]
    assert "The last 1 plan, and 4 identical replans with nothing to do folded into them" in history
    assert history.count('class="history-row"') == 1 and ">Applied</span>" not in history
    assert "\u00d75</span>" in history  # times 5: the plan and its 4 replans


# --- what-if -------------------------------------------------------------------------------------


def test_what_if_shows_the_vms_that_would_be_reclaimed_and_stores_nothing(
    operator_client, h100, full_set, fleet_east
):
    before = world()
    pool = fleet_east["pools"]["h100-ondemand"]

    response = operator_client.get(
        WHAT_IF, {"pool": pool.pk, "gpus": 8, "block_gpus": 4}, headers=HTMX
    )

    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<section class="panel" id="what-if">')
    assert "<html" not in body
    assert "Served." in body and "reclaiming 8 GPUs from 2 VMs" in body
    rows = body.split('class="reclaimed-row"')[1:]
    assert len(rows) == 2
    for victim in victims(full_set):
        row = next(row for row in rows if f">{victim.name}</a>" in row)
        assert victim.instance_id in row
        assert "Acme AI" in row and "h100-spot" in row and "h100-002" in row
        assert "<code>" + victim.instance_id in row and 'title="what-if-' in row
    assert "Where the blocks would go" in body
    assert "Pools before and after" in body
    assert not Plan.objects.exists()
    assert world() == before


def test_what_if_that_cannot_be_served_says_why(operator_client, h100, full_set, fleet_east):
    # The lowest-ranked pool may preempt nobody: nothing frees 8 GPUs for it.
    pool = fleet_east["pools"]["h100-spot"]
    response = operator_client.post(
        WHAT_IF, {"pool": pool.pk, "gpus": 8, "block_gpus": 8}, headers=HTMX
    )
    body = response.content.decode()
    assert response.status_code == 200
    assert "Not served." in body and "reclaimed-row" not in body
    assert not Plan.objects.exists()


def test_the_what_if_form_offers_the_sets_pools_and_block_sizes(operator_client, fleet_east):
    page = operator_client.get(SET_PAGE).content.decode()
    form = page.split('id="what-if"')[1]
    for name in ("h100-inference", "h100-ondemand", "h100-spot"):
        assert name in form
    assert "l40s-ondemand" not in form
    block = form.split('name="block_gpus"')[1].split("</select>")[0]
    assert [size for size in ("1", "2", "4", "8") if f'value="{size}"' in block] == [
        "1",
        "2",
        "4",
        "8",
    ]

    pcie = operator_client.get(reverse("plans:what-if", kwargs={"name": "l40s-east"}))
    block = pcie.content.decode().split('name="block_gpus"')[1].split("</select>")[0]
    assert 'value="1"' in block and 'value="2"' not in block


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"gpus": 6, "block_gpus": 4}, "gpus", "not a whole number of 4-GPU blocks"),
        ({"gpus": 0, "block_gpus": 1}, "gpus", "at least 1"),
        ({"gpus": 64, "block_gpus": 8}, "gpus", "the set has 16 GPUs in all"),
        ({"gpus": "lots", "block_gpus": 8}, "gpus", "must be a whole number of GPUs"),
        ({"gpus": 6, "block_gpus": 3}, "block_gpus", "must be one of 1, 2, 4, 8 on nvswitch"),
        ({"gpus": 8, "block_gpus": 8, "pool": "l40s"}, "pool", "choose a pool of capacity set"),
    ],
)
def test_what_if_bad_input_is_a_400_naming_the_field_and_stores_nothing(
    operator_client, h100, full_set, fleet_east, data, field, words
):
    data = {"pool": fleet_east["pools"]["h100-ondemand"].pk, **data}
    if data["pool"] == "l40s":
        data["pool"] = fleet_east["pools"]["l40s-ondemand"].pk
    before = world()

    response = operator_client.get(WHAT_IF, data, headers=HTMX)

    body = response.content.decode()
    assert response.status_code == 400
    error = body.split(f'id="id_{field}-error"')[1].split("</p>")[0]
    assert words in error
    assert "field-invalid" in body and "what-if-result" not in body
    assert not Plan.objects.exists()
    assert world() == before


# --- who may see what ----------------------------------------------------------------------------


def plan_urls(plan: Plan) -> list[tuple[str, str]]:
    return [
        ("get", SET_PAGE),
        ("get", LIVE),
        ("get", plan_url(plan)),
        ("get", WHAT_IF),
        ("post", WHAT_IF),
        ("post", approve_url(plan)),
        ("post", MODE),
    ]


@pytest.mark.parametrize("who", ["member", "other_member"])
def test_tenant_members_get_403_for_every_plan_url(request, proposal, h100, who):
    client = client_for(request.getfixturevalue(who))
    for method, url in plan_urls(proposal):
        response = getattr(client, method)(url, {"mode": "enforce"} if url == MODE else {})
        assert response.status_code == 403, (method, url)
        assert "spot-3" not in response.content.decode()
    proposal.refresh_from_db()
    h100.refresh_from_db()
    assert proposal.status == Plan.Status.PROPOSED and h100.mode == CapacitySet.Mode.DRY_RUN
    assert not InterruptionNotice.objects.exists()


def test_anonymous_visitors_are_sent_to_login(client, proposal):
    for method, url in plan_urls(proposal):
        response = getattr(client, method)(url)
        assert response.status_code == 302, (method, url)
        assert response["Location"].startswith(f"{reverse('login')}?next=")
    assert not InterruptionNotice.objects.exists()


# --- speed ---------------------------------------------------------------------------------------


def add_nodes(fleet_east, count: int) -> list:
    cluster, capacity_set = fleet_east["cluster"], fleet_east["sets"][SET]
    nodes = []
    for number in range(count):
        node = fleet.node_create(
            cluster=cluster,
            hostname=f"h100-x{number:03d}",
            gpu_model=capacity_set.gpu_model,
            fabric=capacity_set.fabric,
            gpu_count=8,
        )
        nodes.append(fleet.node_join_set(node=node, capacity_set=capacity_set))
    return nodes


# session, user, operator group; set; pools; pool tenants; nodes; GPUs (rows, or counts for a
# large set); draining nodes' VMs and their open notices; plan history; the latest plan's first
# lines and its progress; held GPUs; pending GPUs (the chart loads on its own); the schedule's
# pools, deployments, entries and overrides (the timeline loads on its own).
SET_PAGE_QUERIES = 19


def test_set_page_query_count_does_not_grow_with_nodes_vms_and_plans(
    operator_client,
    operator,
    h100,
    full_set,
    on_demand_request,
    fleet_east,
    tenant,
    django_assert_num_queries,
):
    on_demand_request()
    drains.node_drain(node=fleet_east["nodes"]["h100-001"], actor=operator)  # held by spot-1, 2
    tick(h100)
    with django_assert_num_queries(SET_PAGE_QUERIES):
        response = operator_client.get(SET_PAGE)
    assert len(response.context["held_up"]) == 1
    page = response.content.decode()  # the grid is drawn, each GPU coloured by who holds it
    assert page.count(GRID_SQUARE.format("leaving")) == 8, "spot-1, 2 under drain notices"
    assert page.count(GRID_SQUARE.format("spot")) == 8

    # Seventy more nodes (over the grid's limit), VMs on them, two more draining, more demand.
    extra = add_nodes(fleet_east, 70)
    spot = fleet_east["pools"]["h100-spot"]
    for number, node in enumerate(extra[:6]):
        running_vm(tenant, spot, node, [0, 1, 2, 3], name=f"more-{number}", ip=f"10.60.0.{number}")
    for node in extra[:2]:
        drains.node_drain(node=node, actor=operator)
    on_demand_request(name="train-2")
    on_demand_request(name="train-3", gpu_count=4)
    plan = tick(h100)
    assert plan.demands == 3

    with django_assert_num_queries(SET_PAGE_QUERIES):
        response = operator_client.get(SET_PAGE)

    page = response.content.decode()
    assert len(response.context["held_up"]) == 3
    overview = response.context["overview"]
    assert overview.tiles == [] and (overview.totals.nodes, overview.totals.gpus) == (72, 576)
    # Held: spot-3, 4 and four more spot VMs; leaving: spot-1, 2 and the two more on draining
    # nodes; the draining nodes' other GPUs; free: the rest.
    assert overview.totals.by_status == {"spot": 24, "leaving": 16, "draining": 8, "free": 528}
    assert GRID_SQUARE.format("free") not in page  # a summary instead of 576 squares
    assert f'href="/fleet/?capacity_set={SET}"' in page
    states = {row.state: row for row in response.context["node_states"]}
    assert (states["ready"].nodes, states["ready"].gpus) == (69, 69 * 8)
    assert (states["draining"].nodes, states["draining"].gpus) == (3, 24)
    assert f'href="/fleet/?capacity_set={SET}&amp;state=draining"' in page


def test_the_poll_runs_a_fixed_number_of_queries_whatever_the_sets_size(
    operator_client, operator, tenant, h100, proposal, fleet_east, django_assert_num_queries
):
    """Polled every 5 s by every open set page: its cost must not grow with the fleet. Counted
    with a plan in flight (its notices and placements) and a newer latest plan."""
    services.plan_approve(plan=proposal, actor=operator)
    request_vm(tenant, fleet_east["pools"]["h100-spot"], name="late", gpu_count=4)
    tick(h100)
    # session, user, operator group; set; pools; pool tenants; nodes; GPUs; plan history; the
    # latest plan's lines and progress; the plan in flight's lines, progress and notices; held;
    # pending; the chart's pools and GPUs held per step.
    with django_assert_num_queries(POLL_QUERIES):
        body = live(operator_client)
    assert "In flight: " in body
    key = body.split(f"{LIVE}?since=")[1].split('"')[0]
    with django_assert_num_queries(POLL_QUERIES - 2):  # nothing new: the chart is not drawn
        assert operator_client.get(f"{LIVE}?since={key}", headers=HTMX).status_code == 204
    add_nodes(fleet_east, 70)
    tick(h100)
    with django_assert_num_queries(POLL_QUERIES):
        assert "In flight: " in live(operator_client)


POLL_QUERIES = 18


def test_a_long_plan_shows_its_first_lines_and_links_to_the_rest(
    operator_client, proposal, monkeypatch
):
    monkeypatch.setattr(selectors, "PREVIEW_LINES", 1)

    page = operator_client.get(SET_PAGE).content.decode()
    assert page.count('class="preemption-row"') == 1
    assert "and 1 more VM with notices" in page
    assert f'<a href="{plan_url(proposal)}">see all of plan {proposal.pk}</a>' in page

    detail = operator_client.get(plan_url(proposal)).content.decode()
    assert detail.count('class="preemption-row"') == 2 and "more VM" not in detail
