"""The API of bare-metal rentals and their catalogue: a tenant reads and acts on its own rentals
only (another tenant's is a 404), operators rent, end and read every one; bad input is a 400
naming the field and changes nothing; no answer ever names the BMC's address, user or
password."""

import json

import pytest

from gpucap.audit.models import AuditEvent
from gpucap.bmc import bare_metal
from gpucap.bmc.models import BareMetalImage, BareMetalPowerAction, BareMetalRental
from gpucap.fleet import services as fleet
from tests.bmc.bare_metal_helpers import catalogue_image, dedicated, rent

BMC = type(
    "Bmc", (), {"url": "https://10.77.0.5", "username": "bmc-admin", "password": "Hunter2-bmc!"}
)
# Nothing a tenant or an operator reads from these routes may carry any of it.
CREDENTIAL_WORDS = ("10.77.0.5", "bmc-admin", "Hunter2-bmc!", "bmc_address", "username", "password")


@pytest.fixture
def node(fleet_east, tenant, operator):
    return dedicated(fleet_east["nodes"]["a100-001"], tenant, bmc=BMC, operator=operator)


@pytest.fixture
def image(fleet_east):
    return catalogue_image(fleet_east["cluster"], description="Ubuntu 24.04 LTS server")


@pytest.fixture
def rental(node, tenant, operator, image):
    return rent(node, tenant, image=image, actor=operator)


def _no_credentials(response) -> None:
    text = response.content.decode()
    for word in CREDENTIAL_WORDS:
        assert word not in text, f"{word!r} in {response.request['PATH_INFO']}"


def _unchanged():
    return (
        list(BareMetalRental.objects.values_list("pk", "ended_at")),
        BareMetalPowerAction.objects.count(),
        AuditEvent.objects.count(),
    )


def test_a_tenant_lists_and_reads_its_rentals_and_never_the_bmc(member_api, rental):
    listed = member_api.get("/api/bare-metal/")
    one = member_api.get(f"/api/bare-metal/{rental.pk}/")

    assert listed.status_code == one.status_code == 200
    assert [r["id"] for r in listed.json()["results"]] == [rental.pk]
    body = one.json()
    assert body == listed.json()["results"][0]
    assert {key: body[key] for key in ("tenant", "hostname", "cluster_name", "gpu_count")} == {
        "tenant": "acme",
        "hostname": "a100-001",
        "cluster_name": "east",
        "gpu_count": 8,
    }
    assert body["image"] == {"id": rental.image_id, "name": "ubuntu-24.04-server"}
    assert body["active"] is True and body["power_action"] is None
    assert "node" not in body and "started_by" not in body
    _no_credentials(listed)
    _no_credentials(one)


def test_another_tenant_s_rental_is_not_found_on_every_route(other_member_api, rental):
    before = _unchanged()
    for method, path, data in (
        ("get", f"/api/bare-metal/{rental.pk}/", None),
        ("post", f"/api/bare-metal/{rental.pk}/power/", {"action": "off"}),
        ("post", f"/api/bare-metal/{rental.pk}/end/", None),
    ):
        response = getattr(other_member_api, method)(path, data, format="json")
        assert response.status_code == 404, (path, response.content)
        assert response.json()["error"]["code"] == "not_found"
    assert other_member_api.get("/api/bare-metal/").json()["results"] == []
    assert _unchanged() == before


def test_operators_read_every_rental_with_who_and_the_node(operator_api, rental, operator):
    body = operator_api.get(f"/api/bare-metal/{rental.pk}/").json()

    assert (body["node"], body["started_by"], body["ended_by"]) == (rental.node_id, "olivia", None)


def test_the_tenant_asks_for_power_and_reads_how_far_it_got(member_api, rental):
    response = member_api.post(
        f"/api/bare-metal/{rental.pk}/power/", {"action": "reset"}, format="json"
    )

    assert response.status_code == 202
    assert response.json()["power_action"]["action"] == "reset"
    assert response.json()["power_action"]["state"] == "queued"
    assert AuditEvent.objects.filter(verb="bare_metal.power", actor__username="mallory").exists()
    _no_credentials(response)
    again = member_api.post(f"/api/bare-metal/{rental.pk}/power/", {"action": "on"}, format="json")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "power_under_way"


@pytest.mark.parametrize(
    ("data", "field", "reason"),
    [
        ({"action": "hibernate"}, "action", "'hibernate' is not one of: on, off, reset"),
        ({}, "action", "This field is required."),
        ({"action": 1}, "action", "1 is not one of: on, off, reset"),
        ({"action": "off", "force": True}, "force", "cannot be set by this request"),
    ],
)
def test_bad_power_input_is_a_400_naming_the_field(member_api, rental, data, field, reason):
    before = _unchanged()

    response = member_api.post(f"/api/bare-metal/{rental.pk}/power/", data, format="json")

    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {field: [reason]}
    assert _unchanged() == before


def test_operators_look_at_a_tenant_s_power_and_do_not_switch_it(operator_api, rental):
    response = operator_api.post(
        f"/api/bare-metal/{rental.pk}/power/", {"action": "off"}, format="json"
    )
    assert response.status_code == 403
    assert not BareMetalPowerAction.objects.exists()


def test_operators_rent_and_tenants_may_not(operator_api, member_api, node, image):
    data = {"node": node.pk, "tenant": "acme", "image": image.name}
    assert member_api.post("/api/bare-metal/", data, format="json").status_code == 403

    response = operator_api.post("/api/bare-metal/", data, format="json")

    assert response.status_code == 201, response.content
    assert response.json()["image"]["name"] == image.name
    assert response.json()["active"] is True
    _no_credentials(response)
    refused = operator_api.post("/api/bare-metal/", data, format="json")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "node_rented"


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ({"node": 10**6}, "node", "no node has id 1000000"),
        ({"tenant": "initech"}, "tenant", "no tenant initech"),
        ({"image": "windows-95"}, "image", "no bare-metal image 'windows-95' in the catalogue"),
        ({"image": True}, "image", "must be an image's id (a whole number) or its name"),
        ({"image": "elsewhere"}, "image", "in the catalogue of cluster east"),
        ({"image": "retired"}, "image", "image 'retired' is disabled"),
    ],
)
def test_bad_rent_input_is_a_400_naming_the_field(operator_api, node, image, change, field, reason):
    catalogue_image(node.cluster, name="retired", enabled=False)
    west = catalogue_image(fleet.cluster_create(name="west"), name="elsewhere")
    if change.get("image") == "elsewhere":
        change = {"image": west.pk}
    before = _unchanged()

    data = {"node": node.pk, "tenant": "acme", **change}
    response = operator_api.post("/api/bare-metal/", data, format="json")

    assert response.status_code == 400, response.content
    assert reason in response.json()["error"]["fields"][field][0]
    assert _unchanged() == before


def test_a_node_not_dedicated_to_the_tenant_is_a_409_naming_why(operator_api, fleet_east, node):
    shared = fleet_east["nodes"]["l40s-001"]
    response = operator_api.post(
        "/api/bare-metal/", {"node": shared.pk, "tenant": "acme"}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["error"] | {"fields": {}} == {
        "fields": {},
        "code": "node_not_dedicated",
        "message": "node l40s-001 is shared: only a node dedicated to tenant acme can be rented "
        "to it whole (dedicate it first)",
    }


def test_the_tenant_ends_a_rental_once_and_operators_reclaim_it(
    member_api, operator_api, rental, tenant, operator, node
):
    assert operator_api.post(f"/api/bare-metal/{rental.pk}/end/").status_code == 403
    assert member_api.post(f"/api/bare-metal/{rental.pk}/reclaim/").status_code == 403

    response = member_api.post(f"/api/bare-metal/{rental.pk}/end/")

    assert response.status_code == 200
    assert response.json()["active"] is False and response.json()["ended_at"]
    again = member_api.post(f"/api/bare-metal/{rental.pk}/end/")
    assert again.status_code == 409 and again.json()["error"]["code"] == "rental_ended"
    assert member_api.get("/api/bare-metal/?active=true").json()["results"] == []

    fleet.node_uncordon(node=node, actor=operator)
    fleet.node_cordon(node=node, actor=operator)
    second = rent(node, tenant, actor=operator)
    reclaimed = operator_api.post(f"/api/bare-metal/{second.pk}/reclaim/")
    assert reclaimed.status_code == 200
    assert (reclaimed.json()["active"], reclaimed.json()["ended_by"]) == (False, "olivia")


def test_listing_rentals_takes_a_fixed_number_of_queries(
    member_api, fleet_east, tenant, operator, rental, django_assert_num_queries
):
    for hostname in ("l40s-001", "l40s-002"):
        other = dedicated(fleet_east["nodes"][hostname], tenant, operator=operator)
        BareMetalPowerAction.objects.create(
            rental=rent(other, tenant), action="on", requested_at=rental.started_at
        )
    # the memberships, the count, the page, the power actions, the re-images
    with django_assert_num_queries(5):
        response = member_api.get("/api/bare-metal/")
    assert len(response.json()["results"]) == 3


def test_operators_list_every_rental_in_a_fixed_number_of_queries(
    operator_api, fleet_east, tenant, operator, rental, django_assert_num_queries
):
    for hostname in ("l40s-001", "l40s-002"):
        rent(
            dedicated(fleet_east["nodes"][hostname], tenant, operator=operator),
            tenant,
            actor=operator,
        )
    bare_metal.bare_metal_end(rental=rental, actor=operator)
    # the operators' group, the count, the page (with who started and ended each), the power
    # actions, the re-images
    with django_assert_num_queries(5):
        response = operator_api.get("/api/bare-metal/")
    assert [r["ended_by"] for r in response.json()["results"]] == [None, None, "olivia"]


# --- the catalogue ------------------------------------------------------------------------------


def test_operators_keep_the_catalogue(operator_api, fleet_east):
    cluster = fleet_east["cluster"].pk
    created = operator_api.post(
        "/api/bare-metal-images/",
        {"cluster": cluster, "name": "rocky-9", "image_url": "http://mirror.example/rocky-9.iso"},
        format="json",
    )
    assert created.status_code == 201, created.content
    image_id = created.json()["id"]

    changed = operator_api.patch(
        f"/api/bare-metal-images/{image_id}/", {"enabled": False}, format="json"
    )
    assert changed.status_code == 200 and changed.json()["enabled"] is False
    assert operator_api.delete(f"/api/bare-metal-images/{image_id}/").status_code == 204
    verbs = AuditEvent.objects.filter(object_type="baremetalimage").values_list("verb", flat=True)
    assert sorted(verbs) == [
        "bare_metal_image.create",
        "bare_metal_image.delete",
        "bare_metal_image.update",
    ]


@pytest.mark.parametrize(
    ("data", "field", "reason"),
    [
        (
            {"image_url": "ftp://mirror.example/x.iso"},
            "image_url",
            "must be an http:// or https://",
        ),
        ({"image_url": ""}, "image_url", "may not be blank"),
        ({"name": "Ubuntu 24"}, "name", "must be 1-64 lowercase letters"),
        ({"name": "ubuntu-24.04-server"}, "name", "already has a bare-metal image named"),
        ({"cluster": 10**6}, "cluster", "no cluster 1000000"),
    ],
)
def test_bad_catalogue_input_is_a_400_naming_the_field(
    operator_api, fleet_east, image, data, field, reason
):
    body = {"cluster": fleet_east["cluster"].pk, "name": "new", "image_url": "https://x/y.iso"}
    response = operator_api.post("/api/bare-metal-images/", body | data, format="json")

    assert response.status_code == 400, response.content
    assert reason in response.json()["error"]["fields"][field][0]
    assert BareMetalImage.objects.count() == 1


def test_an_image_a_rental_names_is_disabled_not_deleted(operator_api, rental):
    response = operator_api.delete(f"/api/bare-metal-images/{rental.image_id}/")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "image_in_use"
    assert BareMetalImage.objects.filter(pk=rental.image_id).exists()


def test_a_tenant_sees_the_enabled_images_where_it_rents_and_not_their_urls(
    member_api, other_member_api, rental, image
):
    catalogue_image(image.cluster, name="retired", enabled=False)
    catalogue_image(fleet.cluster_create(name="west"), name="elsewhere")

    mine = member_api.get("/api/bare-metal-images/").json()["results"]
    theirs = other_member_api.get("/api/bare-metal-images/").json()["results"]

    assert [i["name"] for i in mine] == ["ubuntu-24.04-server"]
    assert "image_url" not in mine[0]
    assert theirs == []
    assert other_member_api.get(f"/api/bare-metal-images/{image.pk}/").status_code == 404
    refused = member_api.patch(
        f"/api/bare-metal-images/{image.pk}/", {"enabled": False}, format="json"
    )
    assert refused.status_code == 403
    assert json.loads(refused.content)["error"]["code"] == "permission_denied"


# --- re-image -------------------------------------------------------------------------------------


def test_the_tenant_reimages_by_name_or_id_and_reads_the_run(member_api, rental, image):
    response = member_api.post(
        f"/api/bare-metal/{rental.pk}/reimage/", {"image": "ubuntu-24.04-server"}, format="json"
    )

    assert response.status_code == 202, response.content
    reimage = response.json()["reimage"]
    assert (reimage["state"], reimage["image"]) == ("inserting", "ubuntu-24.04-server")
    assert reimage["words"] == "putting the image in the machine's virtual drive"
    assert "images.example" not in response.content.decode()
    _no_credentials(response)
    again = member_api.post(
        f"/api/bare-metal/{rental.pk}/reimage/", {"image": image.pk}, format="json"
    )
    assert again.status_code == 409 and again.json()["error"]["code"] == "reimage_under_way"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (
            {"image": "windows-95"},
            "no bare-metal image 'windows-95' in the catalogue of cluster east",
        ),
        ({"image": "retired"}, "image 'retired' is disabled: it is not offered any more"),
        ({"image": 10**6}, "no bare-metal image 1000000 in the catalogue of cluster east"),
        ({"image": ["ubuntu"]}, "must be an image's id (a whole number) or its name"),
        ({}, "This field is required."),
    ],
)
def test_bad_reimage_input_is_a_400_naming_image(member_api, rental, image, data, reason):
    catalogue_image(rental.node.cluster, name="retired", enabled=False)
    before = _unchanged()

    response = member_api.post(f"/api/bare-metal/{rental.pk}/reimage/", data, format="json")

    assert response.status_code == 400, response.content
    assert response.json()["error"]["fields"] == {"image": [reason]}
    assert _unchanged() == before
    assert BareMetalRental.objects.get(pk=rental.pk).image == image


def test_a_reimage_of_another_tenant_s_machine_is_not_found_and_operators_only_look(
    other_member_api, operator_api, rental, image
):
    data = {"image": image.pk}
    assert (
        other_member_api.post(
            f"/api/bare-metal/{rental.pk}/reimage/", data, format="json"
        ).status_code
        == 404
    )
    assert (
        operator_api.post(f"/api/bare-metal/{rental.pk}/reimage/", data, format="json").status_code
        == 403
    )
