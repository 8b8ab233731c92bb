"""The node page's provisioning panel: the image URL form on a cordoned or down node, a run's
steps with their times (polled while it runs), what happened when it ended; bad input
re-rendered in place with a 400 next to the field, a refusal with a 409, and nothing changed."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from gpucap.bmc.models import Provisioning
from gpucap.bmc.services import bmc_credential_set
from gpucap.fleet import services as fleet

HTMX = {"HX-Request": "true"}
IMAGE = "https://images.example/installer.iso"
KEY = "dGVzdHMtb25seS1ibWMta2V5LTMyLWJ5dGVzLWxvbmc="


@pytest.fixture
def node(fleet_east, operator, settings):
    settings.BMC_CREDENTIAL_KEYS = [KEY]
    node = fleet_east["nodes"]["a100-001"]
    node.bmc_address = "https://10.0.0.5"
    node.save(update_fields=["bmc_address"])
    bmc_credential_set(node=node, username="admin", password="bmc-password")
    return fleet.node_cordon(node=node, actor=operator)


def _panel_url(node) -> str:
    return reverse("fleet:node-provisioning", kwargs={"cluster": "east", "hostname": node.hostname})


def _page(client, node) -> str:
    url = reverse("fleet:node-detail", kwargs={"cluster": "east", "hostname": node.hostname})
    return client.get(url).content.decode()


def test_a_cordoned_node_offers_the_form(operator_client, node):
    page = _page(operator_client, node)

    assert 'id="node-provisioning"' in page
    assert 'name="image_url"' in page and "Boot from image" in page


def test_a_node_in_service_says_to_cordon_it_first(operator_client, node, operator):
    fleet.node_uncordon(node=node, actor=operator)

    page = _page(operator_client, node)

    assert 'name="image_url"' not in page
    assert "cordon or drain a100-001 first" in page


def test_starting_a_run_answers_the_panel_with_its_steps_polled(operator_client, node):
    response = operator_client.post(_panel_url(node), {"image_url": IMAGE}, headers=HTMX)

    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<section class="panel provisioning" id="node-provisioning"')
    assert 'hx-trigger="every 5s"' in html
    assert 'class="provisioning-step step-current"' in html and "Inserting the image" in html
    assert 'name="image_url"' not in html  # one run at a time
    assert Provisioning.objects.get().requested_by.username == "olivia"


def test_without_htmx_starting_a_run_goes_back_to_the_node_page(operator_client, node):
    response = operator_client.post(_panel_url(node), {"image_url": IMAGE})

    assert response.status_code == 302
    assert response["Location"].endswith("/fleet/nodes/east/a100-001/")


def test_a_bad_image_url_is_shown_next_to_the_field_and_starts_nothing(operator_client, node):
    response = operator_client.post(
        _panel_url(node), {"image_url": "ftp://images.example/a.iso"}, headers=HTMX
    )

    html = response.content.decode()
    assert response.status_code == 400
    assert 'class="field-error" id="id_image_url-error"' in html
    assert "Image URL: must be an http:// or https:// URL" in html
    assert 'value="ftp://images.example/a.iso"' in html  # kept for correcting
    assert not Provisioning.objects.exists()


def test_a_node_that_may_not_be_provisioned_now_is_a_409_saying_why(
    operator_client, node, operator
):
    fleet.node_uncordon(node=node, actor=operator)

    response = operator_client.post(_panel_url(node), {"image_url": IMAGE}, headers=HTMX)

    assert response.status_code == 409
    assert "Not started: node a100-001 is ready" in response.content.decode()
    assert not Provisioning.objects.exists()


def test_a_failed_run_says_what_happened_and_is_no_longer_polled(operator_client, node):
    started = timezone.now() - timedelta(hours=1)
    Provisioning.objects.create(
        node=node,
        image_url=IMAGE,
        state=Provisioning.State.FAILED,
        started_at=started,
        deadline=started + timedelta(seconds=3600),
        inserted_at=started + timedelta(seconds=5),
        reset_at=started + timedelta(seconds=9),
        reset_type="ForceRestart",
        finished_at=started + timedelta(seconds=3600),
        message="the BMC accepted the image and the machine was reset at 10:02 UTC, but its "
        "hypervisor has not answered by 11:02 UTC; power is On",
    )

    html = operator_client.get(_panel_url(node), headers=HTMX).content.decode()

    assert "hx-trigger" not in html
    assert "Failed: the BMC accepted the image and the machine was reset at 10:02 UTC" in html
    assert 'class="provisioning-step step-failed"' in html
    assert 'name="image_url"' in html  # another run may start


def test_the_panel_alone_answers_a_poll_and_the_page_a_plain_get(operator_client, node):
    assert operator_client.get(_panel_url(node)).status_code == 302
    html = operator_client.get(_panel_url(node), headers=HTMX).content.decode()
    assert html.lstrip().startswith("<section")
    assert "<html" not in html


def test_tenant_members_are_refused(member_client, node):
    assert member_client.post(_panel_url(node), {"image_url": IMAGE}).status_code == 403
    assert not Provisioning.objects.exists()
