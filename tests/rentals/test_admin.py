"""The admin of VMs, allocations and usage intervals: searchable, and read-only (every change
goes through the services)."""

from django.contrib.auth.models import User
from django.urls import reverse

from tests.conftest import PASSWORD
from tests.rentals.vm_helpers import request_vm, running_vm


def test_admin_shows_vms_allocations_and_usage_read_only(client, tenant, pools, nodes):
    vm = running_vm(
        tenant, pools["a100-standalone"], nodes["a100-001"], [6, 7], name="adm", ip="10.0.0.6"
    )
    request_vm(tenant, pools["h100-spot"], name="other")
    client.force_login(User.objects.create_superuser("root", password=PASSWORD))

    found = client.get(reverse("admin:rentals_virtualmachine_changelist") + f"?q={vm.instance_id}")
    assert found.status_code == 200
    assert [row.pk for row in found.context["cl"].result_list] == [vm.pk]
    change = client.get(reverse("admin:rentals_virtualmachine_change", args=[vm.pk]))
    assert change.status_code == 200
    assert not change.context["adminform"].form.fields  # every field is read-only
    assert client.get(reverse("admin:rentals_virtualmachine_add")).status_code == 403
    allocations = client.get(reverse("admin:rentals_allocation_changelist"))
    assert allocations.status_code == 200 and allocations.context["cl"].result_count == 2
    usage = client.get(reverse("admin:usage_usageinterval_changelist"))
    assert usage.status_code == 200 and usage.context["cl"].result_count == 1
    assert client.get(reverse("admin:usage_usageinterval_add")).status_code == 403
