"""The tenants' quotas in the fleet file (its top-level ``quotas:``): applied through the quota
services, previewed by a dry run, refused naming the place and field, left as they are when the
file leaves them out, and exported so that the export applies to the same quotas."""

import textwrap
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from gpucap.allocation.models import TenantQuota
from gpucap.audit.models import AuditEvent
from gpucap.fleet.models import CapacitySet, Cluster, Node, Pool
from gpucap.tenancy.models import Tenant

QUOTAS = """\
quotas:
  - {tenant: acme, pool: h100-spot, max_gpus: 16, max_pending: 4}
  - {tenant: acme, gpu_model: H100-SXM5-80GB, max_gpus: 24}
"""

FLEET = """\
version: 1
tenants:
  - {name: Acme AI, slug: acme}
clusters:
  - name: east
    nodes:
      - hostname: "h100-{:03d}"
        count: 2
        gpu_model: H100-SXM5-80GB
        fabric: nvswitch
        gpus: 8
        capacity_set: h100-east
capacity_sets:
  - name: h100-east
    cluster: east
    gpu_model: H100-SXM5-80GB
    fabric: nvswitch
pools:
  - {name: h100-spot, kind: spot, cluster: east, capacity_set: h100-east, rank: 1}
QUOTAS
"""


def fleet(quotas: str = QUOTAS) -> str:
    return FLEET.replace("QUOTAS\n", quotas)


@pytest.fixture
def fleet_file(tmp_path):
    def write(text: str, name: str = "fleet.yaml"):
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


def apply(path, *args) -> str:
    out = StringIO()
    call_command("fleet_apply", str(path), *args, stdout=out)
    return out.getvalue()


def refused(path, *args) -> str:
    with pytest.raises(CommandError) as excinfo:
        apply(path, *args)
    return str(excinfo.value).replace(f"{path.parent}/", "")


def export() -> str:
    out = StringIO()
    call_command("fleet_export", stdout=out)
    return out.getvalue()


def quotas() -> list[tuple]:
    return list(
        TenantQuota.objects.order_by("pk").values_list(
            "tenant__slug", "pool__name", "gpu_model", "max_gpus", "max_pending"
        )
    )


@pytest.mark.django_db
def test_the_files_quotas_are_applied_through_the_quota_services(fleet_file):
    output = apply(fleet_file(fleet()))
    assert "create quota acme in pool h100-spot: 16 GPUs, at most 4 pending" in output
    assert quotas() == [
        ("acme", "h100-spot", "", 16, 4),
        ("acme", None, "H100-SXM5-80GB", 24, None),
    ]
    assert AuditEvent.objects.filter(verb="quota.set").count() == 2
    events = AuditEvent.objects.count()
    assert apply(fleet_file(fleet())).strip().startswith("nothing to change")
    assert AuditEvent.objects.count() == events


@pytest.mark.django_db
def test_a_dry_run_previews_and_changes_nothing(fleet_file):
    apply(fleet_file(fleet()))
    changed = fleet("quotas:\n  - {tenant: acme, pool: h100-spot, max_gpus: 8}\n")
    output = apply(fleet_file(changed), "--dry-run")
    assert "update quota acme in pool h100-spot: 16 GPUs, at most 4 pending -> 8 GPUs" in output
    assert "delete quota acme on H100-SXM5-80GB GPUs: 24 GPUs" in output
    assert len(quotas()) == 2
    apply(fleet_file(changed))
    assert quotas() == [("acme", "h100-spot", "", 8, None)]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "item, words",
    [
        (
            "{tenant: acme, pool: h100-spot, max_gpus: -1}",
            "quotas[0] (acme in pool h100-spot): max_gpus: must be 0 or more",
        ),
        (
            "{tenant: acme, max_gpus: 4}",
            "quotas[0] (acme on None GPUs): pool: give a pool or a GPU model",
        ),
        (
            "{tenant: acme, pool: h100-spot, gpu_model: L40S, max_gpus: 4}",
            "gpu_model: give a pool or a GPU model, not both",
        ),
        ("{tenant: acme, pool: h100-spot, max_gpus: 4, rank: 1}", "rank: "),
        ("{tenant: nobody, pool: h100-spot, max_gpus: 4}", "tenant: no tenant 'nobody'"),
        ("{tenant: acme, pool: nowhere, max_gpus: 4}", "pool: no pool 'nowhere'"),
        ("{tenant: acme, gpu_model: B200, max_gpus: 4}", "gpu_model: no pool or node has 'B200'"),
    ],
)
def test_bad_quotas_are_named_with_their_place_and_nothing_is_applied(fleet_file, item, words):
    text = refused(fleet_file(fleet(f"quotas:\n  - {item}\n")))
    assert words in text
    assert not TenantQuota.objects.exists() and not Tenant.objects.exists()


@pytest.mark.django_db
def test_a_quota_given_twice_is_refused(fleet_file):
    text = refused(
        fleet_file(
            fleet(
                "quotas:\n  - {tenant: acme, pool: h100-spot, max_gpus: 4}\n"
                "  - {tenant: acme, pool: h100-spot, max_gpus: 8}\n"
            )
        )
    )
    assert "quotas[1] (acme in pool h100-spot): tenant: a second quota in this scope" in text


@pytest.mark.django_db
def test_a_file_without_quotas_leaves_them_and_an_empty_list_removes_them(fleet_file):
    apply(fleet_file(fleet()))
    output = apply(fleet_file(fleet("")))
    assert "acme's quota in pool h100-spot" in output  # listed as left as is
    assert len(quotas()) == 2
    apply(fleet_file(fleet("quotas: []\n")))
    assert quotas() == []


@pytest.mark.django_db
def test_export_round_trips_the_quotas_through_an_empty_database(fleet_file):
    apply(fleet_file(fleet()))
    first = export()
    assert (
        "quotas:\n"
        "  - {tenant: acme, pool: h100-spot, max_gpus: 16, max_pending: 4}\n"
        "  - {tenant: acme, gpu_model: H100-SXM5-80GB, max_gpus: 24}\n"
    ) in first
    stored = quotas()
    TenantQuota.objects.all().delete()
    Pool.objects.all().delete()
    Node.objects.all().delete()
    CapacitySet.objects.all().delete()
    Cluster.objects.all().delete()
    apply(fleet_file(first, name="exported.yaml"))
    assert [row[:5] for row in quotas()] == [row[:5] for row in stored]
    assert export() == first
