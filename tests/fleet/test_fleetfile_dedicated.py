"""Dedicated nodes in the fleet file: a node's optional ``dedicated_to: <tenant slug>``, shown
by the diff, applied, exported, and round-tripped; an unknown tenant is refused by name."""

import pytest

from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Node, Pool
from gpucap.notices import tasks
from gpucap.notices.models import InterruptionNotice
from gpucap.tenancy.models import Tenant
from tests.fleet import test_fleetfile as base
from tests.fleet.test_fleetfile import (
    FLEET,
    _empty_the_database,
    apply,
    edited,
    export,
    refused,
    rows,
)
from tests.rentals.vm_helpers import IMAGE, running_vm

fleet_file = base.fleet_file
fast_passwords = base.fast_passwords

A100 = "{hostname: a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8}"
A100_ACME = (
    "{hostname: a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8, dedicated_to: acme}"
)


def dedicated(hostname: str) -> str | None:
    node = Node.objects.select_related("dedicated_tenant").get(hostname=hostname)
    return node.dedicated_tenant.slug if node.dedicated_tenant else None


@pytest.mark.django_db
def test_a_new_node_is_created_dedicated(fleet_file):
    output = apply(fleet_file(edited(FLEET, A100, A100_ACME)))

    assert "dedicated to acme" in output
    assert dedicated("a100-001") == "acme"
    assert AuditEvent.objects.filter(verb="node.dedicate").count() == 1


@pytest.mark.django_db
def test_the_diff_shows_a_dedication_and_a_release_and_applies_them(fleet_file):
    apply(fleet_file())

    preview = apply(fleet_file(edited(FLEET, A100, A100_ACME)), "--dry-run")
    assert "dedicated_to (shared) -> acme" in preview
    assert dedicated("a100-001") is None, "a dry run writes nothing"

    apply(fleet_file(edited(FLEET, A100, A100_ACME)))
    assert dedicated("a100-001") == "acme"
    again = apply(fleet_file(edited(FLEET, A100, A100_ACME)))
    assert again.strip().startswith("nothing to change")

    released = apply(fleet_file())
    assert "dedicated_to acme -> (shared)" in released
    assert dedicated("a100-001") is None


@pytest.mark.django_db
def test_an_unknown_tenant_is_refused_by_name_and_nothing_changes(fleet_file):
    apply(fleet_file())
    before = rows()
    text = edited(FLEET, A100, A100_ACME.replace("acme", "initech"))

    problems = refused(fleet_file(text))

    assert "a100-001): dedicated_to: no tenant initech in the file or the database" in problems
    assert rows() == before


@pytest.mark.django_db
def test_a_bad_slug_is_refused_naming_the_field(fleet_file):
    problems = refused(fleet_file(edited(FLEET, A100, A100_ACME.replace("acme", "'Acme AI'"))))

    assert "dedicated_to" in problems
    assert not Tenant.objects.exists()


@pytest.mark.django_db
def test_export_writes_the_dedication_and_round_trips(fleet_file):
    apply(fleet_file(edited(FLEET, A100, A100_ACME)))
    first = export()
    assert "dedicated_to: acme" in first
    _empty_the_database()

    apply(fleet_file(first, name="exported.yaml"))

    assert export() == first
    assert dedicated("a100-001") == "acme"


@pytest.mark.django_db
def test_other_tenants_vms_on_a_node_dedicated_by_file_get_notices_from_the_sweep(fleet_file):
    apply(fleet_file())
    node = Node.objects.select_related("cluster").get(hostname="h100-004")
    fleet.image_create(cluster=node.cluster, name=IMAGE, base_image="/var/lib/images/u.qcow2")
    globex = Tenant.objects.get(slug="globex")
    vm = running_vm(
        globex, Pool.objects.get(name="h100-spot"), node, [0, 2], name="g", ip="10.9.0.1"
    )
    text = edited(
        FLEET,
        "      - hostname: h100-004\n",
        "      - hostname: h100-004\n        dedicated_to: acme\n",
    )

    apply(fleet_file(text))

    assert dedicated("h100-004") == "acme"
    assert not InterruptionNotice.objects.exists(), "the fleet sits below the notices"
    tasks.sweep()
    assert InterruptionNotice.objects.filter(vm=vm, completed_at=None).count() == 1
