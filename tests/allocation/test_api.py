"""/api/quotas/: operators set, change and remove quotas; a tenant member reads its own tenant's,
with their use, and nothing else. Bad input is a 400 naming the field that changes nothing."""

import pytest

from gpucap.allocation import services as allocation
from gpucap.allocation.models import TenantQuota
from gpucap.audit.models import AuditEvent
from tests.rentals.vm_helpers import IMAGE, SSH_KEY, running_vm


@pytest.fixture
def acme_quota(tenant, pools, operator, fleet_east):
    running_vm(
        tenant,
        pools["h100-spot"],
        fleet_east["nodes"]["h100-001"],
        [0, 1],
        name="web",
        ip="10.63.0.1",
    )
    return allocation.quota_set(
        tenant=tenant, pool=pools["h100-spot"], max_gpus=16, max_pending=2, actor=operator
    ).quota


@pytest.fixture
def globex_quota(other_tenant, operator, pools):
    return allocation.quota_set(
        tenant=other_tenant, pool=pools["l40s-ondemand"], max_gpus=4, actor=operator
    ).quota


def _fields(response) -> dict:
    return response.json()["error"]["fields"]


def test_an_operator_sets_a_quota_and_reads_its_use(operator_api, tenant, pools, fleet_east):
    running_vm(
        tenant,
        pools["h100-spot"],
        fleet_east["nodes"]["h100-001"],
        [0, 1, 2, 3],
        name="train-1",
        ip="10.63.0.2",
    )
    response = operator_api.post(
        "/api/quotas/",
        {"tenant": "acme", "pool": pools["h100-spot"].pk, "max_gpus": 2},
        format="json",
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["tenant"], body["pool_name"], body["max_gpus"]) == ("acme", "h100-spot", 2)
    assert body["use"]["held_gpus"] == 4 and body["use"]["held_vms"] == ["train-1"]
    assert body["note"].startswith("acme holds 4 GPUs in pool h100-spot (train-1), over the new")
    # Setting it again in the same scope changes it (200), not a second quota.
    again = operator_api.post(
        "/api/quotas/",
        {"tenant": "acme", "pool": pools["h100-spot"].pk, "max_gpus": 8},
        format="json",
    )
    assert again.status_code == 200 and again.json()["note"] == ""
    assert TenantQuota.objects.get().max_gpus == 8


def test_an_operator_changes_and_removes_a_quota(operator_api, acme_quota):
    response = operator_api.patch(
        f"/api/quotas/{acme_quota.pk}/", {"max_pending": None}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["max_pending"] is None and response.json()["max_gpus"] == 16
    assert operator_api.delete(f"/api/quotas/{acme_quota.pk}/").status_code == 204
    assert not TenantQuota.objects.exists()


@pytest.mark.parametrize(
    "body, field",
    [
        ({"tenant": "acme", "gpu_model": "L40S", "max_gpus": -1}, "max_gpus"),
        ({"tenant": "acme", "gpu_model": "L40S", "max_gpus": 4, "max_pending": -1}, "max_pending"),
        ({"tenant": "acme", "gpu_model": "L40S", "max_gpus": "4"}, "max_gpus"),
        ({"tenant": "nobody", "gpu_model": "L40S", "max_gpus": 4}, "tenant"),
        ({"tenant": "acme", "pool": 999999, "max_gpus": 4}, "pool"),
        ({"tenant": "acme", "max_gpus": 4}, "pool"),
        ({"tenant": "acme", "pool": "POOL", "gpu_model": "L40S", "max_gpus": 4}, "gpu_model"),
        ({"tenant": "acme", "gpu_model": "B200", "max_gpus": 4}, "gpu_model"),
        ({"tenant": "acme", "gpu_model": "L40S", "max_gpus": 4, "rank": 1}, "rank"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_changes_nothing(operator_api, pools, body, field):
    if body.get("pool") == "POOL":
        body["pool"] = pools["h100-spot"].pk
    events = AuditEvent.objects.count()
    response = operator_api.post("/api/quotas/", body, format="json")
    assert response.status_code == 400, response.json()
    assert field in _fields(response), response.json()
    assert not TenantQuota.objects.exists()
    assert AuditEvent.objects.count() == events


def test_a_negative_patch_is_a_400_and_changes_nothing(operator_api, acme_quota):
    response = operator_api.patch(f"/api/quotas/{acme_quota.pk}/", {"max_gpus": -3}, format="json")
    assert response.status_code == 400 and "max_gpus" in _fields(response)
    assert TenantQuota.objects.get().max_gpus == 16


def test_a_tenant_reads_only_its_own_quotas(member_api, acme_quota, globex_quota):
    body = member_api.get("/api/quotas/").json()
    assert [row["id"] for row in body["results"]] == [acme_quota.pk]
    assert body["results"][0]["use"]["held_vms"] == ["web"]
    assert member_api.get(f"/api/quotas/{acme_quota.pk}/").status_code == 200
    assert member_api.get(f"/api/quotas/{globex_quota.pk}/").status_code == 404


def test_a_tenant_cannot_change_a_quota(member_api, acme_quota, pools):
    assert (
        member_api.patch(
            f"/api/quotas/{acme_quota.pk}/", {"max_gpus": 64}, format="json"
        ).status_code
        == 403
    )
    assert member_api.delete(f"/api/quotas/{acme_quota.pk}/").status_code == 403
    assert (
        member_api.post(
            "/api/quotas/", {"tenant": "acme", "gpu_model": "L40S", "max_gpus": 64}, format="json"
        ).status_code
        == 403
    )
    assert TenantQuota.objects.get().max_gpus == 16


def test_the_quota_list_reads_in_a_fixed_number_of_queries(
    operator_api, operator, acme_quota, globex_quota, tenant, django_assert_num_queries
):
    operator_api.get("/api/quotas/")
    with django_assert_num_queries(3):
        first = operator_api.get("/api/quotas/")
    allocation.quota_set(tenant=tenant, gpu_model="L40S", max_gpus=1, actor=operator)
    with django_assert_num_queries(3):
        second = operator_api.get("/api/quotas/")
    assert (first.json()["count"], second.json()["count"]) == (2, 3)


def test_a_rental_past_the_quota_is_a_400_naming_the_quota(member_api, acme_quota, pools, operator):
    allocation.quota_set(
        tenant=acme_quota.tenant, pool=pools["h100-spot"], max_gpus=2, actor=operator
    )
    response = member_api.post(
        "/api/vms/",
        {
            "tenant": "acme",
            "pool": pools["h100-spot"].pk,
            "name": "more",
            "gpu_count": 1,
            "image": IMAGE,
            "ssh_public_key": SSH_KEY,
        },
        format="json",
    )
    assert response.status_code == 400, response.json()
    assert _fields(response)["gpu_count"] == [
        "over acme's quota in pool h100-spot: 2 GPUs; acme holds 2 (web) and asks for 1"
    ]
