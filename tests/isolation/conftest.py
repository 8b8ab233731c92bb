"""The world the isolation matrix runs in, built once per module: two tenants, acme (A) and
globex (B, the attacker), each with something of every kind a route can name, and the fleet
the operators own (tests/conftest.py's ``fleet_east`` plus a cluster only acme uses).

Building it takes a few hundred queries; each of the matrix's cases only reads it or is
refused. It is built inside one transaction that is rolled back at the end of the module, and
each case runs in a savepoint of its own (pytest-django's ``db``), so a case that did change
something leaves nothing behind for the next one."""

from dataclasses import dataclass, field

import pytest
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from rest_framework.authtoken.models import Token

from gpucap.allocation import services as allocation
from gpucap.bmc.models import DiscoveryRun
from gpucap.fleet import services as fleet
from gpucap.inference import services as inference
from gpucap.notices import services as notices
from gpucap.plans import services as plans
from gpucap.plans import simulation_runs
from gpucap.rentals.models import GuestAddress
from gpucap.roles import OPERATORS_GROUP
from gpucap.schedules import services as schedules
from gpucap.tenancy import services as tenancy
from gpucap.tenancy.models import Membership, Tenant
from gpucap.usage import services as usage
from gpucap.usage.models import BillingDelivery
from tests.bmc.bare_metal_helpers import catalogue_image, dedicated, rent
from tests.conftest import PASSWORD, TEST_INFERENCE_REDIS_URL, fleet_east_build
from tests.inference.conftest import inference_pools_build
from tests.rentals.vm_helpers import grant_pools, running_vm

# What acme's things are called: none of it may appear in an answer to globex or to a visitor
# who is signed out. Names every route of acme's shows, none a word of globex's pages uses.
SECRET = "acme-secret"


@dataclass
class World:
    users: dict[str, User]  # by role: a_member, a_admin, b_admin (also as b_admin@globex), operator
    ids: dict  # what fills each captured parameter: see tests/routes.fill
    # globex's own tenant and deployment, for the attacker who names acme's object under them
    own_ids: dict
    markers: list[str] = field(default_factory=list)  # acme's words globex must never read


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    """The world of the module, in a transaction rolled back when the module ends."""
    with (
        override_settings(INFERENCE_REDIS_URL=TEST_INFERENCE_REDIS_URL),
        django_db_blocker.unblock(),
    ):
        block = transaction.atomic()
        # Marked as a test case's wrapper, as Django's TestCase marks its own: the application
        # code's own outermost transactions (durable blocks, on-commit hooks) behave as they do
        # in every other test.
        block._from_testcase = True
        block.__enter__()
        try:
            yield world_build()
        finally:
            transaction.set_rollback(True)
            block.__exit__(None, None, None)


def world_build() -> World:
    acme = Tenant.objects.create(name="Acme AI", slug="acme")
    globex = Tenant.objects.create(name="Globex Research", slug="globex")
    users = {
        "a_member": _user("acme-secret-colleague", acme, Membership.Role.MEMBER),
        "a_admin": _user("mallory", acme, Membership.Role.ADMIN),
        "b_admin": _user("oscar", globex, Membership.Role.ADMIN),
        "operator": _operator(),
    }
    east = fleet_east_build(acme, globex)
    pools = grant_pools(east, acme, globex)
    inference_pools = inference_pools_build(east, acme)
    # A cluster only acme uses: its pool and image are in acme's catalogue, not in globex's.
    west = fleet.cluster_create(name="west")
    west_pool = fleet.pool_create(
        name="acme-secret-west",
        kind="on_demand",
        cluster=west,
        rank=1,
        gpu_model="L40S",
        fabric="pcie",
    )
    fleet.pool_set_tenants(pool=west_pool, tenants=[acme])
    image = fleet.image_create(
        cluster=west, name="acme-secret-image", base_image="/var/lib/gpucap/images/a.qcow2"
    )
    node = east["nodes"]["a100-001"]
    vm = running_vm(
        acme, pools["a100-standalone"], node, [0], name="acme-secret-vm", ip="10.200.0.9"
    )
    # The simulated fleet's nodes have no guest subnet; a libvirt node's VM has its address.
    GuestAddress.objects.create(vm=vm, node=node, address=vm.ip_address, mac="52:54:00:00:00:09")
    notice = notices.notice_issue(vm=vm, reason="reclaim", message="acme-secret-reclaim")
    h100 = east["sets"]["h100-east"]
    plan = plans.plan_make(capacity_set=h100)
    # The set's schedule and an override: the operators' own, named in their API's paths.
    entry = schedules.schedule_entry_save(
        capacity_set=h100,
        data={
            "name": "day-shift",
            "days": "mon-fri",
            "start": "08:00",
            "end": "20:00",
            "time_zone": "America/New_York",
            "pools": {"h100-inference": {"floor_gpus": 8}},
        },
    )
    override = schedules.policy_override_set(
        capacity_set=h100,
        data={"name": "peak", "rank_order": ["h100-spot", "h100-ondemand"], "ttl_seconds": 86400},
    )
    # A stored simulation run of the set (the operators' own; its start names acme's VMs).
    simulation = simulation_runs.simulation_request(h100, profile={}, hours=1, send=False)
    deployment = inference.deployment_create(
        tenant=acme,
        pool=inference_pools["standalone"],
        name="acme-secret-chat",
        model_name="gpucap/sim-8b",
        gpus_per_replica=1,
        actor=users["a_admin"],
    )
    api_key, _ = inference.api_key_create(
        tenant=acme, name="acme-secret-key", deployment=deployment
    )
    membership = Membership.objects.get(user=users["a_member"])
    invitation = tenancy.invitation_send(
        tenant=acme, email="acme-secret-invitee@acme.example", role="member", site_url="http://x"
    )
    Token.objects.create(user=users["a_admin"])
    _billing_delivery()
    gpu = node.gpus.get(index=0)
    # The set's schedule: an entry and an outside scheduler's override (the set page's routes).
    entry = schedules.schedule_entry_save(
        capacity_set=h100,
        data={
            "name": "day-shift",
            "days": "mon-fri",
            "start": "08:00",
            "end": "20:00",
            "time_zone": "America/New_York",
            "pools": {"h100-spot": {"floor_gpus": 4}},
        },
    )
    override = schedules.policy_override_set(
        capacity_set=h100,
        data={"name": "peak", "pools": {"h100-ondemand": {"floor_gpus": 4}}, "ttl_seconds": 3600},
    )
    # acme's quota where its VM runs: its use names the VM (a marker).
    quota = allocation.quota_set(
        tenant=acme, pool=pools["a100-standalone"], max_gpus=8, actor=users["operator"]
    ).quota
    # acme's reservation in the set (while globex's spot VMs could borrow from it).
    reservation = allocation.reservation_create(
        tenant=acme,
        capacity_set=h100,
        data={"name": "acme-8", "gpus": 8, "block_gpus": 8, "always": True},
    )
    # acme rents l40s-002 whole, with an image of east's bare-metal catalogue on it.
    bare_metal_image = catalogue_image(east["cluster"], name="acme-secret-os")
    rented = dedicated(east["nodes"]["l40s-002"], acme, operator=users["operator"])
    rental = rent(rented, acme, image=bare_metal_image, actor=users["operator"])
    # A discovery of the node's BMC (the operators' own), previewed as a worker would store it.
    discovery = DiscoveryRun.objects.create(
        node=node,
        state=DiscoveryRun.State.PREVIEWED,
        entries=[
            {
                "cluster": east["cluster"].name,
                "address": "https://10.0.0.5",
                "username": "admin",
                "verify_tls": True,
                "hostname": node.hostname,
                "gpu_model": "",
                "fabric": "",
                "system_id": "",
                "node": node.pk,
            }
        ],
        passwords_sealed=[""],
        digest="0" * 64,
    )
    ids = {
        # pages
        "slug": acme.slug,
        ("sets", "name"): h100.name,
        ("clusters", "name"): east["cluster"].name,
        ("nodes", "cluster"): east["cluster"].name,
        "hostname": node.hostname,
        "plan_id": plan.pk,
        "run_id": simulation.pk,
        ("discoveries", "run_id"): discovery.pk,
        ("members", "pk"): membership.pk,
        ("invitations", "pk"): invitation.pk,
        ("vms", "pk"): vm.pk,
        ("inference", "name"): deployment.name,
        ("keys", "pk"): api_key.pk,
        ("entries", "entry"): entry.name,
        ("overrides", "override"): override.name,
        "fmt": "csv",
        # links that carry their own secret, forged
        ("invitations", "token"): "forged-invitation-link",
        "uidb64": urlsafe_base64_encode(force_bytes(users["a_member"].pk)),
        "token": "forged-password-reset-token",
        # the API
        ("tenants", "pk"): acme.pk,
        "membership_id": membership.pk,
        "invitation_id": invitation.pk,
        ("vms", "id"): vm.pk,
        ("notices", "pk"): notice.pk,
        ("deployments", "pk"): deployment.pk,
        ("api-keys", "pk"): api_key.pk,
        ("clusters", "pk"): east["cluster"].pk,
        ("clusters", "id"): east["cluster"].pk,
        ("nodes", "pk"): node.pk,
        ("nodes", "id"): node.pk,
        ("gpus", "pk"): gpu.pk,
        ("capacity-sets", "pk"): h100.pk,
        ("capacity-sets", "id"): h100.pk,
        ("pools", "pk"): pools["h100-spot"].pk,  # acme's alone
        ("images", "pk"): image.pk,  # in acme's catalogue alone
        ("plans", "pk"): plan.pk,
        ("simulations", "id"): simulation.pk,
        ("schedule", "name"): entry.name,
        ("overrides", "name"): override.name,
        ("quotas", "pk"): quota.pk,
        ("reservations", "pk"): reservation.pk,
        ("bare-metal", "pk"): rental.pk,
        ("bare-metal-images", "pk"): bare_metal_image.pk,
        ("machines", "pk"): rental.pk,
        ("discoveries", "id"): discovery.pk,
    }
    # Not the VM's instance id: "vm-1" is also the start of "vm-12", which globex may own.
    markers = [SECRET, vm.ip_address, api_key.prefix, invitation.email]
    # globex's deployment, in the standalone inference pool it may use too
    fleet.pool_set_tenants(pool=inference_pools["standalone"], tenants=[acme, globex])
    theirs = inference.deployment_create(
        tenant=globex,
        pool=inference_pools["standalone"],
        name="chat",
        model_name="gpucap/sim-8b",
        gpus_per_replica=1,
        actor=users["b_admin"],
    )
    own_ids = {
        "slug": globex.slug,
        ("tenants", "pk"): globex.pk,
        ("inference", "name"): theirs.name,
    }
    users["b_admin@globex"] = users["b_admin"]
    return World(users=users, ids=ids, own_ids=own_ids, markers=markers)


def _user(username: str, tenant: Tenant, role: str) -> User:
    user = User.objects.create_user(username, f"{username}@{tenant.slug}.example", PASSWORD)
    Membership.objects.create(user=user, tenant=tenant, role=role)
    return user


def _operator() -> User:
    user = User.objects.create_user("olivia", "olivia@ops.example", PASSWORD, is_staff=True)
    user.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])
    return user


def _billing_delivery() -> None:
    """One delivery to the billing webhook, for the admin's delivery pages."""
    hook = usage.billing_webhook_configure(
        url="https://billing.example/hook",
        secret="s" * 32,
        enabled=True,
        batch_size=100,
        actor=None,
    )
    BillingDelivery.objects.create(
        webhook=hook,
        batch_id="1-1",
        first_record=1,
        last_record=1,
        record_count=1,
        attempt=1,
        duration_ms=5,
        at=timezone.now(),
    )
