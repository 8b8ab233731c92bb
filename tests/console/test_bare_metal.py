"""The operators' side of bare-metal rentals: the node page's Bare metal section (rent a node
dedicated to a tenant whole, see its power and the BMC's own words when an action failed, end
it) and the cluster page's Bare-metal images section (the catalogue: add, offer or withdraw,
remove). Refusals re-render the section with the reason and change nothing; tenants are
refused."""

import pytest
from django.urls import reverse

from gpucap.bmc.models import BareMetalImage, BareMetalPowerAction, BareMetalRental
from gpucap.fleet.models import Node
from tests.bmc.bare_metal_helpers import catalogue_image, dedicated, rent

HTMX = {"HX-Request": "true"}


def node_url(name: str, node: Node) -> str:
    return reverse(f"fleet:{name}", kwargs={"cluster": "east", "hostname": node.hostname})


def images_url(name: str = "bare-metal-images", **kwargs) -> str:
    return reverse(f"fleet:{name}", kwargs={"name": "east", **kwargs})


@pytest.fixture
def a100(fleet_east, tenant, operator) -> Node:
    return dedicated(fleet_east["nodes"]["a100-001"], tenant, operator=operator)


@pytest.fixture
def image(fleet_east):
    return catalogue_image(fleet_east["cluster"])


def test_the_node_page_loads_its_bare_metal_section(operator_client, a100):
    page = operator_client.get(node_url("node-detail", a100)).content.decode()

    assert f'hx-get="{node_url("node-bare-metal", a100)}" hx-trigger="load"' in page


def test_an_operator_rents_a_dedicated_node_whole_and_ends_the_rental(operator_client, a100, image):
    section = operator_client.get(node_url("node-bare-metal", a100), headers=HTMX)
    assert "Rent to Acme AI" in section.content.decode()

    rented = operator_client.post(
        node_url("node-bare-metal-rent", a100), {"image": image.pk}, headers=HTMX
    )

    page = rented.content.decode()
    assert rented.status_code == 200
    assert page.lstrip().startswith('<section class="panel" id="node-bare-metal">')
    assert "Rented whole to" in page and "ubuntu-24.04-server" in page
    rental = BareMetalRental.objects.get()
    assert (rental.node, rental.image, rental.active) == (a100, image, True)
    assert Node.objects.get(pk=a100.pk).state == Node.State.CORDONED

    ended = operator_client.post(node_url("node-bare-metal-end", a100), headers=HTMX)

    assert ended.status_code == 200 and "Not rented." in ended.content.decode()
    assert not BareMetalRental.objects.get().active


def test_the_section_shows_the_bmc_s_own_words_when_an_action_failed(operator_client, a100):
    rental = rent(a100, a100.dedicated_tenant)
    BareMetalPowerAction.objects.create(
        rental=rental,
        action="off",
        state="failed",
        message="gpucap could not log in to the machine's management controller",
        bmc_error="node a100-001: the BMC at https://10.0.0.5 refused the user name (HTTP 401)",
        requested_at=rental.started_at,
        finished_at=rental.started_at,
    )

    page = operator_client.get(node_url("node-bare-metal", a100), headers=HTMX).content.decode()

    assert "BMC: node a100-001: the BMC at https://10.0.0.5 refused" in page


def test_a_refused_rental_says_why_and_changes_nothing(operator_client, fleet_east, a100):
    shared = fleet_east["nodes"]["l40s-001"]
    response = operator_client.post(node_url("node-bare-metal-rent", shared), {}, headers=HTMX)
    assert response.status_code == 409
    assert "Not changed: node l40s-001 is shared" in response.content.decode()

    rent(a100, a100.dedicated_tenant)
    response = operator_client.post(node_url("node-bare-metal-rent", a100), {}, headers=HTMX)
    assert response.status_code == 409
    assert "is rented already" in response.content.decode()
    assert BareMetalRental.objects.count() == 1


def test_tenants_are_refused_the_operators_sections(member_client, a100, image):
    for url in (node_url("node-bare-metal", a100), images_url()):
        assert member_client.get(url).status_code == 403
    assert member_client.post(node_url("node-bare-metal-rent", a100), {}).status_code == 403
    assert member_client.post(images_url("bare-metal-image-delete", pk=image.pk)).status_code == 403
    assert not BareMetalRental.objects.exists() and BareMetalImage.objects.exists()


# --- the catalogue ------------------------------------------------------------------------------


def test_the_cluster_page_loads_its_catalogue(operator_client, fleet_east):
    page = operator_client.get(reverse("fleet:cluster-detail", kwargs={"name": "east"}))
    assert f'hx-get="{images_url()}" hx-trigger="load"' in page.content.decode()


def test_an_operator_adds_withdraws_and_removes_an_image(operator_client, fleet_east):
    added = operator_client.post(
        images_url("bare-metal-image-add"),
        {"name": "rocky-9", "image_url": "https://mirror.example/rocky-9.iso"},
        headers=HTMX,
    )
    assert added.status_code == 200 and "Added rocky-9" in added.content.decode()
    image = BareMetalImage.objects.get(name="rocky-9")

    withdrawn = operator_client.post(
        images_url("bare-metal-image-offer", pk=image.pk), {"enabled": "0"}, headers=HTMX
    )
    assert "rocky-9 is withdrawn from tenants" in withdrawn.content.decode()
    assert not BareMetalImage.objects.get(pk=image.pk).enabled

    removed = operator_client.post(images_url("bare-metal-image-delete", pk=image.pk), headers=HTMX)
    assert "Removed rocky-9." in removed.content.decode()
    assert not BareMetalImage.objects.exists()


def test_a_bad_image_is_refused_next_to_its_field(operator_client, fleet_east, image):
    response = operator_client.post(
        images_url("bare-metal-image-add"),
        {"name": "ubuntu-24.04-server", "image_url": "file:///etc/passwd"},
        headers=HTMX,
    )

    page = response.content.decode()
    assert response.status_code == 400
    assert "Image URL: must be an http:// or https:// URL the BMC can fetch" in page
    assert BareMetalImage.objects.count() == 1


def test_an_image_a_rental_names_is_not_removed(operator_client, a100, image):
    rent(a100, a100.dedicated_tenant, image=image)

    response = operator_client.post(
        images_url("bare-metal-image-delete", pk=image.pk), headers=HTMX
    )

    assert response.status_code == 409
    assert "disable it instead" in response.content.decode()
    assert BareMetalImage.objects.filter(pk=image.pk).exists()
