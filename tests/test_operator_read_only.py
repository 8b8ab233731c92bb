"""Operators look at a tenant's pages and API read-only (#16): every route that changes
something of a tenant's (its VMs, deployments, API keys, members, invitations), found by
walking the URL resolver, answers an operator who is not a member 403 and changes nothing.

The routes are not listed by hand: a new tenant-side route is checked the day it is added.
Left out are the operators' own commands (views marked ``operator_only`` by
``gpucap.web.pages.operator_required``, and API views whose permission is ``IsOperator`` or
``IsOperatorOrReadOnly``: reclaim with notice, drains, placements, the fleet) and what anyone
may post signed out (sign-in, password forms, an invitation's link)."""

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from gpucap.audit.models import AuditEvent
from gpucap.bmc.models import BareMetalPowerAction, BareMetalRental
from gpucap.inference import services as inference
from gpucap.inference.models import ApiKey, InferenceDeployment
from gpucap.rentals.models import VirtualMachine
from gpucap.tenancy import services as tenancy
from gpucap.tenancy.models import Invitation, Membership, Tenant
from tests.bmc.bare_metal_helpers import dedicated, rent
from tests.conftest import PASSWORD
from tests.inference import conftest as inference_fixtures
from tests.rentals import conftest as rentals_fixtures
from tests.rentals.vm_helpers import IMAGE, SSH_KEY, running_vm
from tests.routes import fill, operator_only, routes

pools = rentals_fixtures.pools
inference_pools = inference_fixtures.inference_pools
inference_redis = inference_fixtures.inference_redis

UNSAFE = ("post", "put", "patch", "delete")


@pytest.fixture
def acme(member, tenant, pools, inference_pools, fleet_east, django_capture_on_commit_callbacks):
    """Something of acme's behind every kind of route: a VM, a deployment, an API key, a
    member besides its admin, an open invitation."""
    vm = running_vm(
        tenant,
        pools["a100-standalone"],
        fleet_east["nodes"]["a100-001"],
        [0],
        name="web",
        ip="10.200.0.9",
    )
    deployment = inference.deployment_create(
        tenant=tenant,
        pool=inference_pools["standalone"],
        name="chat",
        model_name="gpucap/sim-8b",
        gpus_per_replica=1,
        actor=member,
    )
    api_key, _ = inference.api_key_create(tenant=tenant, name="prod", deployment=deployment)
    colleague = User.objects.create_user("mike", "mike@acme.example", PASSWORD)
    membership = Membership.objects.create(user=colleague, tenant=tenant, role="member")
    invitation = tenancy.invitation_send(
        tenant=tenant, email="nina@acme.example", role="member", site_url="http://testserver"
    )
    machine = dedicated(fleet_east["nodes"]["l40s-002"], tenant)
    rental = rent(machine, tenant)
    return {
        ("bare-metal", "pk"): rental.pk,
        ("machines", "pk"): rental.pk,
        ("tenants", "slug"): tenant.slug,
        ("tenants", "pk"): tenant.pk,
        ("vms", "pk"): vm.pk,
        ("vms", "id"): vm.pk,
        ("deployments", "pk"): deployment.pk,
        ("inference", "name"): deployment.name,
        ("api-keys", "pk"): api_key.pk,
        ("keys", "pk"): api_key.pk,
        ("members", "pk"): membership.pk,
        ("invitations", "pk"): invitation.pk,
        "membership_id": membership.pk,
        "invitation_id": invitation.pk,
        "slug": tenant.slug,
        "fmt": "csv",
    }


# Bodies that pass a create's checks, so its refusal is the read-only rule, not bad input.
def bodies(pools, inference_pools) -> dict:
    return {
        "/api/vms/": {
            "tenant": "acme",
            "pool": pools["a100-standalone"].pk,
            "name": "ops-vm",
            "gpu_count": 1,
            "image": IMAGE,
            "ssh_public_key": SSH_KEY,
        },
        "/api/deployments/": {
            "tenant": "acme",
            "pool": inference_pools["standalone"].pk,
            "name": "ops",
            "model_name": "gpucap/sim-8b",
            "gpus_per_replica": 1,
        },
        "/api/api-keys/": {"tenant": "acme", "name": "ops"},
    }


def world() -> dict:
    return {
        "vms": list(
            VirtualMachine.objects.order_by("pk").values_list("pk", "state", "stop_reason")
        ),
        "deployments": list(InferenceDeployment.objects.order_by("pk").values()),
        "keys": list(ApiKey.objects.order_by("pk").values_list("pk", "revoked_at")),
        "members": list(Membership.objects.order_by("pk").values_list("pk", "user_id", "role")),
        "invitations": list(Invitation.objects.order_by("pk").values_list("pk", "revoked_at")),
        "tenants": list(Tenant.objects.order_by("pk").values()),
        "events": AuditEvent.objects.count(),
        "bare_metal": list(BareMetalRental.objects.order_by("pk").values_list("pk", "ended_at")),
        "power": BareMetalPowerAction.objects.count(),
    }


def needs_sign_in(response) -> bool:
    if response.status_code in (401, 403):
        return True
    return response.status_code == 302 and response["Location"].startswith("/login/?next=")


def test_every_tenant_side_change_is_refused_to_an_operator_who_is_not_a_member(
    operator, acme, pools, inference_pools
):
    anonymous, page, api = Client(), Client(), APIClient()
    page.force_login(operator)
    api.force_authenticate(operator)
    known = bodies(pools, inference_pools)
    checked, allowed = [], []
    for regex, view in routes():
        if operator_only(view):
            continue
        path = fill(regex, acme)
        if path is None or path.startswith("/admin/"):  # Django's admin has its own permissions
            continue
        for method in UNSAFE:
            if not needs_sign_in(getattr(anonymous, method)(path)):
                continue  # signed out may post it (sign-in, password forms) or nobody may (405)
            before = world()
            if path.startswith("/api/"):
                response = getattr(api, method)(path, known.get(path, {}), format="json")
            else:
                response = getattr(page, method)(path, known.get(path, {}))
            if response.status_code == 405:
                continue
            checked.append(f"{method.upper()} {path}")
            if response.status_code != 403 or world() != before:
                allowed.append(f"{method.upper()} {path}: {response.status_code}")
            elif path.startswith("/api/"):
                error = response.json()["error"]
                assert error["code"] == "permission_denied", path
                assert "read-only" in error["message"], path
    assert not allowed, f"an operator who is not a member changed a tenant's things: {allowed}"
    # The walk found the routes this issue is about, pages and API.
    expected = {
        "POST /tenants/acme/vms/",
        f"POST /vms/{acme[('vms', 'pk')]}/stop/",
        f"POST /vms/{acme[('vms', 'pk')]}/terminate/",
        "POST /tenants/acme/inference/chat/settings/",
        f"POST /tenants/acme/inference/chat/keys/{acme[('keys', 'pk')]}/revoke/",
        f"POST /tenants/acme/members/{acme[('members', 'pk')]}/remove/",
        "POST /api/vms/",
        f"POST /api/vms/{acme[('vms', 'pk')]}/stop/",
        f"POST /api/vms/{acme[('vms', 'pk')]}/terminate-job/",
        f"DELETE /api/vms/{acme[('vms', 'pk')]}/",
        f"PATCH /api/deployments/{acme[('deployments', 'pk')]}/",
        f"POST /api/api-keys/{acme[('api-keys', 'pk')]}/revoke/",
        f"PATCH /api/tenants/{acme[('tenants', 'pk')]}/members/{acme['membership_id']}/",
        f"POST /api/tenants/{acme[('tenants', 'pk')]}/invitations/",
        f"POST /api/bare-metal/{acme[('bare-metal', 'pk')]}/power/",
        f"POST /api/bare-metal/{acme[('bare-metal', 'pk')]}/end/",
        f"POST /api/bare-metal/{acme[('bare-metal', 'pk')]}/reimage/",
        f"POST /tenants/acme/machines/{acme[('machines', 'pk')]}/reimage/",
        f"POST /tenants/acme/machines/{acme[('machines', 'pk')]}/power/",
        f"POST /tenants/acme/machines/{acme[('machines', 'pk')]}/end/",
    }
    assert expected <= set(checked), sorted(expected - set(checked))


def test_an_operator_who_is_also_a_member_changes_that_tenants_things(operator, acme, tenant):
    Membership.objects.create(user=operator, tenant=tenant, role="member")
    api = APIClient()
    api.force_authenticate(operator)
    response = api.post(f"/api/api-keys/{acme[('api-keys', 'pk')]}/revoke/")
    assert response.status_code == 200
    assert ApiKey.objects.get(pk=acme[("api-keys", "pk")]).revoked_at is not None
