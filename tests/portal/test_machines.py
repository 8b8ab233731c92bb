"""A tenant's Machines page: its machines rented whole, with their power, the power buttons
(off and reset asked to confirm), the last power action, and ending a rental; operators look in
read-only; another tenant's machine is a 404, also under one's own tenant's path; the BMC's
address and credentials are never on it."""

import pytest
from django.urls import reverse

from gpucap.bmc.models import BareMetalPowerAction, BareMetalRental, Provisioning
from gpucap.fleet import services as fleet
from tests.bmc.bare_metal_helpers import catalogue_image, dedicated, rent
from tests.bmc.conftest import TEST_KEY

HTMX = {"HX-Request": "true"}
BMC = type("Bmc", (), {"url": "https://10.77.0.5", "username": "bmc-admin", "password": "pw-bmc"})


def page_url(slug: str = "acme") -> str:
    return reverse("tenant-machines", kwargs={"slug": slug})


def power_url(rental, slug: str = "acme") -> str:
    return reverse("tenant-machine-power", kwargs={"slug": slug, "pk": rental.pk})


def reimage_url(rental, slug: str = "acme") -> str:
    return reverse("tenant-machine-reimage", kwargs={"slug": slug, "pk": rental.pk})


def end_url(rental, slug: str = "acme") -> str:
    return reverse("tenant-machine-end", kwargs={"slug": slug, "pk": rental.pk})


@pytest.fixture(autouse=True)
def bmc_keys(settings):
    settings.BMC_CREDENTIAL_KEYS = [TEST_KEY]


@pytest.fixture
def rental(fleet_east, tenant, operator):
    node = dedicated(fleet_east["nodes"]["a100-001"], tenant, bmc=BMC, operator=operator)
    image = catalogue_image(fleet_east["cluster"])
    return rent(node, tenant, image=image, actor=operator)


def _no_bmc(text: str) -> None:
    for word in ("10.77.0.5", "bmc-admin", "pw-bmc"):
        assert word not in text


def test_a_member_sees_its_machine_with_its_power_and_the_buttons(member_client, rental):
    BareMetalRental.objects.filter(pk=rental.pk).update(power_state="on")

    response = member_client.get(page_url())

    page = response.content.decode()
    assert response.status_code == 200
    assert 'id="machine-' in page and "a100-001" in page and "8 &times; A100-SXM4-80GB" in page
    assert "Power on</span>" in page
    assert "ubuntu-24.04-server" in page
    assert 'hx-confirm="Power a100-001 off?' in page
    assert 'hx-confirm="Reset a100-001?' in page
    assert 'hx-confirm="End the rental of a100-001?' in page
    _no_bmc(page)


def test_the_portal_links_to_the_machines_and_says_the_node_is_rented(member_client, rental):
    page = member_client.get(reverse("tenant-detail", kwargs={"slug": "acme"})).content.decode()

    assert f'href="{page_url()}"' in page
    assert "rented whole as bare metal" in page


def test_a_power_button_answers_with_the_live_part_and_the_action_queued(member_client, rental):
    response = member_client.post(power_url(rental), {"action": "off"}, headers=HTMX)

    page = response.content.decode()
    assert response.status_code == 200
    assert page.lstrip().startswith('<div id="machines-live"')
    assert 'data-state="queued"' in page and "waiting for gpucap" in page
    assert "every 3s" in page  # it polls fast while the action is under way
    assert " disabled>Power off" in page
    assert BareMetalPowerAction.objects.get().action == "off"


@pytest.mark.parametrize(
    ("data", "status", "words"),
    [
        ({"action": "suspend"}, 400, "Not changed: &#x27;suspend&#x27; is not one of: on, off"),
        ({}, 400, "Not changed: &#x27;&#x27; is not one of: on, off, reset"),
    ],
)
def test_a_refused_action_says_why_next_to_the_machine(member_client, rental, data, status, words):
    response = member_client.post(power_url(rental), data, headers=HTMX)

    assert response.status_code == status
    assert words in response.content.decode()
    assert not BareMetalPowerAction.objects.exists()


def test_a_second_action_while_one_is_under_way_is_a_409(member_client, rental):
    member_client.post(power_url(rental), {"action": "reset"}, headers=HTMX)
    response = member_client.post(power_url(rental), {"action": "on"}, headers=HTMX)

    assert response.status_code == 409
    assert "Not changed: reset asked at" in response.content.decode()
    assert BareMetalPowerAction.objects.count() == 1


def test_ending_the_rental_moves_it_to_the_ended_ones(member_client, rental):
    response = member_client.post(end_url(rental), headers=HTMX)

    page = response.content.decode()
    assert response.status_code == 200
    assert 'id="machines-ended"' in page and f'id="machine-{rental.pk}"' not in page
    assert not BareMetalRental.objects.get(pk=rental.pk).active


def test_another_tenant_s_machine_is_not_found(other_member_client, rental, other_tenant):
    assert other_member_client.get(page_url()).status_code == 404
    for slug in ("acme", "globex"):
        for url in (power_url(rental, slug), reimage_url(rental, slug), end_url(rental, slug)):
            response = other_member_client.post(url, {"action": "off"})
            assert response.status_code == 404, url
    assert other_member_client.get(page_url("globex")).status_code == 200
    assert not BareMetalPowerAction.objects.exists()
    assert BareMetalRental.objects.get(pk=rental.pk).active


def test_operators_look_in_read_only(operator_client, rental):
    page = operator_client.get(page_url()).content.decode()

    assert "Operator view · read-only" in page and "a100-001" in page
    assert "Power off</button>" not in page and "End rental" not in page
    assert operator_client.post(power_url(rental), {"action": "off"}).status_code == 403
    assert not BareMetalPowerAction.objects.exists()


def test_the_page_runs_a_fixed_number_of_queries(
    member_client, rental, fleet_east, tenant, operator, django_assert_num_queries
):
    # session, user, tenant ids, tenant; rentals under way, their power actions and re-images,
    # the catalogue; the ended ones.
    with django_assert_num_queries(9):
        member_client.get(page_url())
    for hostname in ("l40s-001", "l40s-002"):
        node = dedicated(fleet_east["nodes"][hostname], tenant, operator=operator)
        rent(node, tenant)
    west = fleet.cluster_create(name="west")
    catalogue_image(west, name="elsewhere")
    with django_assert_num_queries(9):
        response = member_client.get(page_url(), headers=HTMX)
    assert response.content.decode().count('class="panel machine"') == 3


def test_the_reimage_form_offers_the_catalogue_and_shows_the_run(member_client, rental):
    page = member_client.get(page_url()).content.decode()
    assert f'<option value="{rental.image_id}" selected>ubuntu-24.04-server</option>' in page
    assert 'hx-confirm="Re-image a100-001 from the image you picked?' in page

    response = member_client.post(reimage_url(rental), {"image": rental.image_id}, headers=HTMX)

    page = response.content.decode()
    assert response.status_code == 200
    assert 'data-state="inserting"' in page
    assert "putting the image in the machine&#x27;s virtual drive" in page
    assert " disabled>Re-image" in page and "every 3s" in page
    assert "images.example" not in page
    _no_bmc(page)
    run = Provisioning.objects.get()
    assert (run.bare_metal_rental_id, run.requested_by.username) == (rental.pk, "mallory")


@pytest.mark.parametrize("image", ["", "nine", "99999"])
def test_an_image_not_of_the_catalogue_is_refused_next_to_the_machine(member_client, rental, image):
    response = member_client.post(reimage_url(rental), {"image": image}, headers=HTMX)

    assert response.status_code == 400
    assert "Not changed: pick an image of the catalogue" in response.content.decode()
    assert not Provisioning.objects.exists()
