"""The image catalogue: operators manage it (service, API, admin, fleet file); tenant members
read the enabled images of the clusters their pools use, and nothing else."""

import textwrap
from io import StringIO

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command

from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster, Image

BASE = "/var/lib/gpucap/images/rocky-9.qcow2"


def images_state() -> list:
    return list(Image.objects.order_by("pk").values())


def names(response) -> list[str]:
    return [row["name"] for row in response.data["results"]]


@pytest.fixture
def west(db, other_tenant):
    """A second cluster whose only pool globex (not acme) may use, with an image of its own."""
    cluster = fleet.cluster_create(name="west")
    node = fleet.node_create(
        cluster=cluster, hostname="h200-001", gpu_model="H200", fabric="nvswitch", gpu_count=8
    )
    pool = fleet.pool_create(
        name="h200-ondemand",
        kind="on_demand",
        cluster=cluster,
        rank=1,
        gpu_model="H200",
        fabric="nvswitch",
    )
    fleet.pool_set_tenants(pool=pool, tenants=[other_tenant])
    image = fleet.image_create(cluster=cluster, name="west-only", base_image="/img/west.qcow2")
    return {"cluster": cluster, "node": node, "pool": pool, "image": image}


# --- the service -----------------------------------------------------------------------------


def test_image_create_is_audited_and_keeps_what_the_operator_gave(fleet_east, operator):
    image = fleet.image_create(
        cluster=fleet_east["cluster"],
        name="rocky-9-cuda-12.6",
        base_image=BASE,
        node_paths={"a100-001": "/nvme/rocky-9.qcow2"},
        default_user="rocky",
        actor=operator,
    )
    assert image.base_for("a100-001") == "/nvme/rocky-9.qcow2"
    assert image.base_for("h100-001") == BASE
    assert image.health_path == "/v1/models" and image.enabled
    event = AuditEvent.objects.get(verb="image.create", actor=operator)
    assert event.after["default_user"] == "rocky"


def test_image_create_names_every_bad_field(fleet_east):
    with pytest.raises(ValidationError) as excinfo:
        fleet.image_create(
            cluster=fleet_east["cluster"],
            name="Ubuntu 24",
            base_image="has spaces.qcow2",
            node_paths={"h100-009": "/x.qcow2"},
            default_user="1nope",
            ports=[8000, 8000],
            health_path="v1/models",
        )
    errors = excinfo.value.message_dict
    assert set(errors) == {
        "name",
        "base_image",
        "node_paths",
        "default_user",
        "ports",
        "health_path",
    }
    assert errors["node_paths"] == ["h100-009 is not a node of cluster east"]
    assert errors["ports"] == ["a port is listed twice"]
    assert not Image.objects.filter(name="Ubuntu 24").exists()


def test_an_image_name_is_unique_per_cluster_only(fleet_east, west):
    with pytest.raises(ValidationError) as excinfo:
        fleet.image_create(
            cluster=fleet_east["cluster"], name="ubuntu-24.04-cuda-12.6", base_image=BASE
        )
    assert excinfo.value.message_dict["name"] == [
        "cluster east already has an image named 'ubuntu-24.04-cuda-12.6'"
    ]
    fleet.image_create(cluster=west["cluster"], name="ubuntu-24.04-cuda-12.6", base_image=BASE)


def test_image_update_audits_only_what_changed(fleet_east, operator):
    image = fleet_east["images"]["ubuntu-24.04-cuda-12.6"]
    fleet.image_update(image=image, enabled=False, actor=operator)
    event = AuditEvent.objects.get(verb="image.update")
    assert event.before == {"enabled": True} and event.after == {"enabled": False}
    fleet.image_update(image=image, enabled=False, actor=operator)  # nothing to change
    assert AuditEvent.objects.filter(verb="image.update").count() == 1


# --- the API: operators ----------------------------------------------------------------------


def test_operator_creates_updates_and_deletes_an_image(operator_api, fleet_east):
    response = operator_api.post(
        "/api/images/",
        {
            "cluster": fleet_east["cluster"].pk,
            "name": "vllm-0.6-openai",
            "base_image": "/var/lib/gpucap/images/vllm.qcow2",
            "default_user": "ubuntu",
            "ports": [8000, 9000],
        },
        format="json",
    )
    assert response.status_code == 201, response.data
    assert response.data["ports"] == [8000, 9000]
    assert response.data["cluster_name"] == "east"
    assert response.data["health_path"] == "/v1/models"
    pk = response.data["id"]

    response = operator_api.patch(
        f"/api/images/{pk}/", {"node_paths": {"h100-001": "/nvme/vllm.qcow2"}}, format="json"
    )
    assert response.status_code == 200, response.data
    assert response.data["node_paths"] == {"h100-001": "/nvme/vllm.qcow2"}

    assert operator_api.delete(f"/api/images/{pk}/").status_code == 204
    assert not Image.objects.filter(pk=pk).exists()
    assert AuditEvent.objects.filter(verb="image.delete").count() == 1


def test_bad_image_input_is_a_400_naming_the_field_and_changes_nothing(operator_api, fleet_east):
    before = images_state()
    response = operator_api.post(
        "/api/images/",
        {
            "cluster": fleet_east["cluster"].pk,
            "name": "ok-name",
            "base_image": "/img/ok.qcow2",
            "ports": [70000],
            "node_paths": {"nowhere": "/img/x.qcow2"},
        },
        format="json",
    )
    assert response.status_code == 400
    fields = response.data["error"]["fields"]
    assert fields["ports"] == ["each port must be a whole number from 1 to 65535, got [70000]"]
    assert fields["node_paths"] == ["nowhere is not a node of cluster east"]
    assert images_state() == before


def test_an_image_cannot_be_renamed_or_moved(operator_api, fleet_east):
    image = fleet_east["images"]["ubuntu-24.04-cuda-12.6"]
    response = operator_api.patch(f"/api/images/{image.pk}/", {"name": "x"}, format="json")
    assert response.status_code == 400
    assert "create an image with the new name" in response.data["error"]["fields"]["name"][0]


# --- the API: tenants --------------------------------------------------------------------------


def test_a_member_sees_only_enabled_images_of_clusters_their_pools_use(
    member_api, other_member_api, fleet_east, west, pools_for_acme
):
    fleet.image_create(
        cluster=fleet_east["cluster"], name="retired", base_image=BASE, enabled=False
    )
    response = member_api.get("/api/images/")
    assert response.status_code == 200
    assert names(response) == ["gpucap-model-server", "ubuntu-24.04-cuda-12.6"]
    # Where the files lie on the nodes is the operator's business.
    assert "base_image" not in response.data["results"][0]
    assert "node_paths" not in response.data["results"][0]
    # globex uses a pool of east (l40s-ondemand) and one of west.
    assert names(other_member_api.get("/api/images/")) == [
        "gpucap-model-server",
        "ubuntu-24.04-cuda-12.6",
        "west-only",
    ]


def test_another_tenants_cluster_image_is_a_404_to_a_member(member_api, west, pools_for_acme):
    response = member_api.get(f"/api/images/{west['image'].pk}/")
    assert response.status_code == 404


def test_a_member_cannot_change_the_catalogue(member_api, fleet_east, pools_for_acme):
    image = fleet_east["images"]["ubuntu-24.04-cuda-12.6"]
    before = images_state()
    assert member_api.patch(f"/api/images/{image.pk}/", {"enabled": False}).status_code == 403
    assert member_api.delete(f"/api/images/{image.pk}/").status_code == 403
    response = member_api.post(
        "/api/images/",
        {"cluster": fleet_east["cluster"].pk, "name": "mine", "base_image": "/x"},
        format="json",
    )
    assert response.status_code == 403
    assert images_state() == before


def test_images_filter_by_pool(operator_api, fleet_east, west):
    response = operator_api.get(f"/api/images/?pool={west['pool'].pk}")
    assert names(response) == ["west-only"]


def test_a_member_without_pools_sees_no_images(member_api, fleet_east, tenant):
    fleet.pool_set_tenants(pool=fleet_east["pools"]["h100-spot"], tenants=[])
    assert names(member_api.get("/api/images/")) == []


def test_the_image_list_runs_a_fixed_number_of_queries(
    member_api, fleet_east, pools_for_acme, django_assert_num_queries
):
    for n in range(5):
        fleet.image_create(cluster=fleet_east["cluster"], name=f"extra-{n}", base_image=BASE)
    member_api.get("/api/images/")
    # count, rows (the member's tenants are read once per user).
    with django_assert_num_queries(2):
        response = member_api.get("/api/images/")
    assert len(response.data["results"]) == 7


@pytest.fixture
def pools_for_acme(fleet_east, tenant):
    return fleet_east["pools"]


# --- the admin ---------------------------------------------------------------------------------


def test_the_admin_saves_through_the_service_and_shows_its_errors(operator, fleet_east, client):
    operator.is_superuser = True
    operator.save()
    client.force_login(operator)
    cluster = fleet_east["cluster"]
    form = {
        "cluster": cluster.pk,
        "name": "debian-12",
        "base_image": "/img/debian-12.qcow2",
        "node_paths": '{"nowhere": "/x.qcow2"}',
        "default_user": "debian",
        "ports": "[]",
        "health_path": "/v1/models",
        "description": "",
        "enabled": "on",
    }
    page = client.post("/admin/fleet/image/add/", form)
    assert page.status_code == 200
    assert "nowhere is not a node of cluster east" in page.content.decode()
    assert not Image.objects.filter(name="debian-12").exists()
    form["node_paths"] = '{"h100-001": "/nvme/debian-12.qcow2"}'
    page = client.post("/admin/fleet/image/add/", form)
    assert page.status_code == 302
    image = Image.objects.get(cluster=cluster, name="debian-12")
    assert image.base_for("h100-001") == "/nvme/debian-12.qcow2"
    assert AuditEvent.objects.filter(verb="image.create", actor=operator).count() == 1


# --- the fleet file ----------------------------------------------------------------------------


FLEET = """\
version: 1
clusters:
  - name: east
    nodes:
      - {hostname: a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8}
images:
  - name: ubuntu-24.04-cuda-12.6
    cluster: east
    base_image: /var/lib/gpucap/images/ubuntu-24.04-cuda-12.6.qcow2
    default_user: ubuntu
  - name: vllm-0.6-openai
    cluster: east
    base_image: /var/lib/gpucap/images/vllm.qcow2
    node_paths: {a100-001: /nvme/vllm.qcow2}
    ports: [8000]
"""


def apply(tmp_path, text: str) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(textwrap.dedent(text))
    out = StringIO()
    call_command("fleet_apply", str(path), stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_a_fleet_file_declares_the_catalogue_and_round_trips(tmp_path):
    output = apply(tmp_path, FLEET)
    assert "create image east/vllm-0.6-openai: base /var/lib/gpucap/images/vllm.qcow2" in output
    vllm = Image.objects.get(name="vllm-0.6-openai")
    assert vllm.ports == [8000]
    assert vllm.base_for("a100-001") == "/nvme/vllm.qcow2"
    assert Image.objects.get(name="ubuntu-24.04-cuda-12.6").default_user == "ubuntu"

    changed = FLEET.replace("    ports: [8000]\n", "    ports: [8000]\n    enabled: false\n")
    output = apply(tmp_path, changed)
    assert "update image east/vllm-0.6-openai: enabled true -> false" in output
    assert not Image.objects.get(name="vllm-0.6-openai").enabled

    out = StringIO()
    call_command("fleet_export", stdout=out)
    exported = out.getvalue()
    assert "images:" in exported
    assert apply(tmp_path, exported).strip().startswith("nothing to change")


@pytest.mark.django_db
def test_a_fleet_file_image_on_an_unknown_node_is_refused_whole(tmp_path):
    bad = FLEET.replace("{a100-001: /nvme/vllm.qcow2}", "{a100-009: /nvme/vllm.qcow2}")
    path = tmp_path / "fleet.yaml"
    path.write_text(bad)
    with pytest.raises(Exception) as excinfo:
        call_command("fleet_apply", str(path), stdout=StringIO())
    assert (
        "images[1] (vllm-0.6-openai): node_paths: a100-009 is not a node of cluster east "
        "in the file or the database"
    ) in str(excinfo.value)
    assert not Cluster.objects.exists()
