"""The Reservations section of a capacity set's page (operators: each reservation with what
it is now, Preview that changes nothing, Approve, errors in place, Remove) and the tenant
portal's reservations (a tenant's own, never who borrows them)."""

from django.urls import reverse

from gpucap.allocation import services as allocation
from gpucap.allocation.models import Reservation
from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.plans.models import Plan
from gpucap.rentals.models import VirtualMachine
from tests.rentals.vm_helpers import running_vm

HTMX = {"HX-Request": "true"}
SET = "h100-east"
SECTION = reverse("fleet:reservations-section", kwargs={"name": SET})
ADD = reverse("fleet:reservation-add", kwargs={"name": SET})
ALWAYS = {"tenant": "acme", "name": "acme-16", "gpus": "16", "block_gpus": "8", "when": "always"}


def _delete_url(row: Reservation) -> str:
    return reverse("fleet:reservation-delete", kwargs={"name": SET, "pk": row.pk})


def _globex_spot(fleet_east, other_tenant, node: str = "h100-001") -> VirtualMachine:
    pools = fleet_east["pools"]
    fleet.pool_set_tenants(pool=pools["h100-spot"], tenants=[other_tenant])
    return running_vm(
        other_tenant,
        pools["h100-spot"],
        fleet_east["nodes"][node],
        [0, 1, 2, 3],
        name="globex-batch",
        ip="10.63.2.1",
    )


def _reserve(h100, tenant, operator, **data) -> Reservation:
    written = {"name": "acme-8", "gpus": 8, "block_gpus": 8, "always": True, **data}
    return allocation.reservation_create(
        tenant=tenant, capacity_set=h100, data=written, actor=operator
    )


def test_the_set_page_loads_the_section_for_operators(operator_client, fleet_east):
    page = operator_client.get(reverse("fleet:capacity-set-detail", kwargs={"name": SET}))
    assert SECTION in page.content.decode()


def test_the_section_lists_a_reservation_with_its_borrowers(
    operator_client, h100, tenant, other_tenant, operator, fleet_east, django_assert_num_queries
):
    row = _reserve(h100, tenant, operator)
    vm = _globex_spot(fleet_east, other_tenant)
    VirtualMachine.objects.filter(pk=vm.pk).update(borrowed_from=row)
    # session, user, operator?; the set; reservations; held; borrowers; latest plan; tenants.
    with django_assert_num_queries(9):
        response = operator_client.get(SECTION, headers=HTMX)
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<section class="panel set-reservations"')  # the fragment
    assert "acme-8" in body and "always" in body and "in force" in body
    assert "0 / 8" in body
    assert "globex-batch" in body and "h100-001" in body


def test_tenant_members_may_not_open_the_section_or_write(
    member_client, h100, tenant, operator, fleet_east
):
    row = _reserve(h100, tenant, operator)
    assert member_client.get(SECTION).status_code == 403
    assert member_client.post(ADD, {**ALWAYS, "name": "mine"}).status_code == 403
    assert member_client.post(_delete_url(row)).status_code == 403
    assert list(Reservation.objects.values_list("name", flat=True)) == ["acme-8"]


def test_the_preview_names_who_would_get_notices_and_changes_nothing(
    operator_client, h100, other_tenant, fleet_east
):
    _globex_spot(fleet_east, other_tenant)
    before = (Plan.objects.count(), AuditEvent.objects.count())
    response = operator_client.post(ADD, ALWAYS, headers=HTMX)
    assert response.status_code == 200
    body = response.content.decode()
    assert "a preview: nothing is stored" in body
    assert "In force at once: 8 of its 16 GPUs kept free for acme now" in body
    assert "would get notices (120 s, the set's notice period) when acme claims it" in body
    assert "globex-batch" in body and "acme could claim all of it, with those notices." in body
    assert 'name="approve"' in body
    assert not Reservation.objects.exists()
    assert (Plan.objects.count(), AuditEvent.objects.count()) == before


def test_a_preview_on_a_free_set_says_no_vm_would_get_a_notice(operator_client, fleet_east):
    body = operator_client.post(ADD, ALWAYS, headers=HTMX).content.decode()
    assert "No VM would get a notice" in body


def test_approve_creates_the_reservation(operator_client, fleet_east):
    response = operator_client.post(ADD, {**ALWAYS, "approve": "1"}, headers=HTMX)
    assert response.status_code == 200
    assert response["HX-Trigger"] == "set-changed"
    assert "Reserved 16 GPUs of h100-east for acme (acme-16)." in response.content.decode()
    row = Reservation.objects.get()
    assert (row.tenant.slug, row.gpus, row.block_gpus, row.always) == ("acme", 16, 8, True)


def test_a_weekly_window_is_written_from_the_form(operator_client, fleet_east):
    window = {"when": "window", "days": ["0", "1"], "start": "08:00", "end": "20:00"}
    data = {**ALWAYS, **window, "time_zone": "Europe/Berlin", "approve": "1"}
    assert operator_client.post(ADD, data, headers=HTMX).status_code == 200
    row = Reservation.objects.get()
    assert (row.always, row.days, row.time_zone) == (False, [0, 1], "Europe/Berlin")
    body = operator_client.get(SECTION, headers=HTMX).content.decode()
    assert "Mon, Tue 08:00-20:00 Europe/Berlin" in body or "Europe/Berlin" in body


def test_without_javascript_approve_leads_back_to_the_set_page(operator_client, fleet_east):
    response = operator_client.post(ADD, {**ALWAYS, "approve": "1"})
    assert response.status_code == 302
    assert response["Location"] == reverse("fleet:capacity-set-detail", kwargs={"name": SET})


def _refused(operator_client, data: dict, field: str) -> str:
    response = operator_client.post(ADD, data, headers=HTMX)
    assert response.status_code == 400
    body = response.content.decode()
    assert f'id="reservation_{field}-error"' in body, body
    assert not Reservation.objects.exists()
    return body


def test_bad_input_is_shown_next_to_its_field_and_stores_nothing(operator_client, fleet_east):
    assert "1 or more, got 0" in _refused(operator_client, {**ALWAYS, "gpus": "0"}, "gpus")
    assert "1 or more, got -8" in _refused(
        operator_client, {**ALWAYS, "gpus": "-8", "approve": "1"}, "gpus"
    )
    assert "not a multiple of 8" in _refused(operator_client, {**ALWAYS, "gpus": "12"}, "gpus")
    assert "more than capacity set h100-east has: 16 GPUs" in _refused(
        operator_client, {**ALWAYS, "gpus": "24", "approve": "1"}, "gpus"
    )
    assert "give a weekly window" in _refused(operator_client, {**ALWAYS, "when": "window"}, "when")
    assert "Days it starts on" in _refused(
        operator_client, {**ALWAYS, "when": "window", "start": "08:00", "end": "20:00"}, "days"
    )
    assert "Select a valid choice" in _refused(
        operator_client, {**ALWAYS, "block_gpus": "3"}, "block_gpus"
    )


def test_an_overlapping_window_of_the_same_tenant_is_refused(
    operator_client, h100, tenant, operator, fleet_east
):
    _reserve(h100, tenant, operator, gpus=8)
    response = operator_client.post(
        ADD, {**ALWAYS, "name": "more", "gpus": "8", "approve": "1"}, headers=HTMX
    )
    assert response.status_code == 400
    body = response.content.decode()
    assert 'id="reservation_when-error"' in body and "a tenant has one reservation in force" in body
    assert Reservation.objects.count() == 1


def test_remove_deletes_the_reservation(operator_client, h100, tenant, operator, fleet_east):
    row = _reserve(h100, tenant, operator)
    response = operator_client.post(_delete_url(row), headers=HTMX)
    assert response.status_code == 200
    assert "Removed acme&#x27;s reservation acme-8" in response.content.decode()
    assert not Reservation.objects.exists()
    other = reverse("fleet:reservation-delete", kwargs={"name": "l40s-east", "pk": row.pk})
    assert operator_client.post(other, headers=HTMX).status_code == 404


def test_the_portal_shows_a_tenant_its_own_reservations_only(
    member_client, h100, tenant, other_tenant, operator, fleet_east
):
    mine = _reserve(h100, tenant, operator)
    vm = _globex_spot(fleet_east, other_tenant)
    VirtualMachine.objects.filter(pk=vm.pk).update(borrowed_from=mine)
    allocation.reservation_create(
        tenant=other_tenant,
        capacity_set=h100,
        data={"name": "globex-secret", "gpus": 8, "block_gpus": 8, "always": True},
        actor=operator,
    )
    page = member_client.get(reverse("tenant-detail", args=["acme"])).content.decode()
    start = page.index('id="portal-reservations"')
    panel = page[start : page.index("</section>", start)]
    assert "h100-east" in panel and "0 / 8" in panel and "always" in panel
    assert "globex-secret" not in page and "globex-batch" not in page
