"""The operators' quotas page (list, set, remove, with the use shown; a refused form re-renders
in place) and the tenant portal's quotas panel."""

from django.urls import reverse

from gpucap.allocation import services as allocation
from gpucap.allocation.models import TenantQuota
from tests.rentals.vm_helpers import request_vm, running_vm

HTMX = {"HX-Request": "true"}


def _section(page: str, element_id: str) -> str:
    start = page.index(f'id="{element_id}"')
    return page[start : page.index("</section>", start)]


def test_the_quotas_page_lists_quotas_with_their_use(
    operator_client, operator, tenant, pools, fleet_east
):
    running_vm(
        tenant,
        pools["h100-spot"],
        fleet_east["nodes"]["h100-001"],
        [0, 1, 2, 3],
        name="train-1",
        ip="10.64.0.1",
    )
    allocation.quota_set(tenant=tenant, pool=pools["h100-spot"], max_gpus=2, actor=operator)
    page = operator_client.get(reverse("allocation:quotas")).content.decode()
    assert "pool h100-spot" in page and 'title="train-1"' in page
    assert (
        "acme holds 4 GPUs in pool h100-spot (train-1), over the new quota of 2: nothing is "
        "stopped" in page
    )


def test_an_operator_sets_a_quota_from_the_page(operator_client, tenant, pools):
    response = operator_client.post(
        reverse("allocation:quota-set"),
        {"tenant": "acme", "pool": "h100-spot", "max_gpus": "16", "max_pending": ""},
        headers=HTMX,
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div class="columns" id="quotas-panel">')  # the fragment
    assert "Set acme&#x27;s quota in pool h100-spot: 16 GPUs." in body
    quota = TenantQuota.objects.get()
    assert (quota.max_gpus, quota.max_pending) == (16, None)


def test_bad_input_is_shown_in_place_and_changes_nothing(operator_client, tenant, pools):
    response = operator_client.post(
        reverse("allocation:quota-set"),
        {"tenant": "acme", "pool": "h100-spot", "gpu_model": "L40S", "max_gpus": "-1"},
        headers=HTMX,
    )
    assert response.status_code == 400
    body = response.content.decode()
    assert 'id="id_gpu_model-error"' in body and "not both" in body
    assert 'id="id_max_gpus-error"' in body and "must be 0 or more" in body
    assert not TenantQuota.objects.exists()


def test_an_operator_removes_a_quota(operator_client, operator, tenant, pools):
    quota = allocation.quota_set(
        tenant=tenant, pool=pools["h100-spot"], max_gpus=2, actor=operator
    ).quota
    response = operator_client.post(
        reverse("allocation:quota-delete", args=[quota.pk]), headers=HTMX
    )
    assert response.status_code == 200 and "Removed" in response.content.decode()
    assert not TenantQuota.objects.exists()


def test_the_quotas_page_is_for_operators(member_client, operator, tenant, pools):
    quota = allocation.quota_set(
        tenant=tenant, pool=pools["h100-spot"], max_gpus=2, actor=operator
    ).quota
    assert member_client.get(reverse("allocation:quotas")).status_code == 403
    assert (
        member_client.post(reverse("allocation:quota-delete", args=[quota.pk])).status_code == 403
    )
    assert TenantQuota.objects.exists()


def test_the_portal_shows_the_tenants_quotas_and_use(
    member_client, operator, tenant, other_tenant, pools, fleet_east
):
    running_vm(
        tenant,
        pools["h100-spot"],
        fleet_east["nodes"]["h100-001"],
        [0, 1],
        name="web",
        ip="10.64.0.2",
    )
    request_vm(tenant, pools["h100-spot"], name="waits", gpu_count=1)
    allocation.quota_set(
        tenant=tenant, pool=pools["h100-spot"], max_gpus=8, max_pending=3, actor=operator
    )
    allocation.quota_set(tenant=other_tenant, gpu_model="L40S", max_gpus=99, actor=operator)
    page = member_client.get(reverse("tenant-detail", args=["acme"])).content.decode()
    panel = _section(page, "portal-quotas")
    assert "pool h100-spot" in panel and "2 / 8" in panel and "1 of 3 requests" in panel
    assert "L40S" not in panel  # globex's quota is not acme's business
