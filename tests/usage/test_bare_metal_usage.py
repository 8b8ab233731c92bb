"""A bare-metal rental is usage (docs/bmc.md, "Whole machines for tenants"): every GPU of the
rented machine held from the rental's start to its end, kind ``bare_metal`` and attributed
``dedicated`` to the node; its records add up to GPUs x hours exactly, and end when it ends.
Told twice (a retried signal, a second recording run) nothing is counted twice. The exports,
the usage API and the billing webhook name the rental and its machine."""

import json
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from gpucap.bmc import bare_metal
from gpucap.bmc.models import BareMetalRental
from gpucap.bmc.signals import bare_metal_rental_changed
from gpucap.usage import export, selectors, services
from gpucap.usage.models import UsageInterval, UsageRecord
from tests.bmc.bare_metal_helpers import dedicated, rent
from tests.usage.test_export import csv_rows, export_url, json_rows

NOVEMBER = {"since": "2026-11-01", "until": "2026-12-01"}


def at(hour: int, minute: int = 0, day: int = 2) -> datetime:
    return datetime(2026, 11, day, hour, minute, tzinfo=UTC)


@pytest.fixture
def rented(clock, fleet_east, tenant, operator) -> BareMetalRental:
    """acme rents a100-001 (8 GPUs) whole from 09:30 to 13:00 (3.5 hours)."""
    clock.set(at(9))
    node = dedicated(fleet_east["nodes"]["a100-001"], tenant, operator=operator)
    clock.set(at(9, 30))
    rental = rent(node, tenant, actor=operator)
    clock.set(at(13))
    return bare_metal.bare_metal_end(rental=rental, actor=operator)


def test_a_rental_s_records_are_its_gpus_times_its_hours_ending_when_it_ends(clock, rented):
    clock.set(at(14, 5))

    services.usage_record()

    records = list(UsageRecord.objects.filter(bare_metal_rental=rented).order_by("started_at"))
    assert [(r.started_at, r.ended_at) for r in records] == [
        (at(9, 30), at(10)),
        (at(10), at(11)),
        (at(11), at(12)),
        (at(12), at(13)),
    ]
    assert sum(r.gpu_seconds for r in records) == Decimal(8 * 3.5 * 3600)
    for record in records:
        assert (record.pool_kind, record.gpu_model, record.gpu_count) == (
            "bare_metal",
            "A100-SXM4-80GB",
            8,
        )
        assert (record.allocation, record.dedicated_node) == ("dedicated", "a100-001")
        assert (record.vm_id, record.pool_id, record.tenant_id) == (None, None, rented.tenant_id)


def test_told_twice_nothing_is_counted_twice(clock, rented):
    started = BareMetalRental.objects.get(pk=rented.pk)
    started.ended_at = None
    bare_metal_rental_changed.send(sender=BareMetalRental, rental=started)  # the start, again
    bare_metal_rental_changed.send(sender=BareMetalRental, rental=rented)  # the end, again
    clock.set(at(14, 5))
    services.usage_record()
    services.usage_record()

    interval = UsageInterval.objects.get(bare_metal_rental=rented)
    assert (interval.started_at, interval.ended_at) == (at(9, 30), at(13))
    total = sum(r.gpu_seconds for r in UsageRecord.objects.filter(bare_metal_rental=rented))
    assert total == Decimal(8 * 3.5 * 3600)


def test_a_rental_under_way_is_counted_up_to_now_and_not_final(clock, fleet_east, tenant):
    clock.set(at(9, 30))
    node = dedicated(fleet_east["nodes"]["a100-001"], tenant)
    rental = rent(node, tenant)
    clock.set(at(10, 15))

    rows = list(selectors.usage_rows(since=at(0), until=at(0, day=3), now=clock.now))

    assert [(row["started_at"], row["ended_at"], row["final"]) for row in rows] == [
        (at(9, 30), at(10), True),
        (at(10), at(10, 15), False),
    ]
    assert rows[1]["bare_metal_rental_id"] == rental.pk
    assert selectors.usage_summary(since=at(0), until=at(0, day=3), now=clock.now).by_kind[
        "bare_metal"
    ] == Decimal(8 * 0.75)


def test_the_exports_name_the_rental_and_its_machine(clock, rented, operator_client):
    clock.set(at(14, 5))

    as_csv = csv_rows(operator_client.get(export_url("csv"), NOVEMBER))
    as_json = json_rows(operator_client.get(export_url("json"), NOVEMBER))

    assert len(as_csv) == len(as_json) == 4
    row = as_json[0]
    assert {key: row[key] for key in EXPECTED} == EXPECTED | {
        "ResourceId": f"bare-metal-{rented.pk}"
    }
    assert as_csv[0]["ResourceType"] == "Bare-metal machine"


EXPECTED = {
    "ResourceId": None,  # the rental's, set in the test
    "ResourceName": "a100-001",
    "ResourceType": "Bare-metal machine",
    "RegionId": "east",
    "ServiceName": "Bare-metal machines",
    "PricingCategory": "Standard",
    "SkuId": "A100-SXM4-80GB/bare_metal",
    "x_PoolKind": "bare_metal",
    "x_PoolName": "",
    "x_CapacitySet": "",
    "x_GpuCount": 8,
    "x_Allocation": "dedicated",
    "x_DedicatedNode": "a100-001",
    "SubAccountId": "acme",
}


def test_the_webhook_carries_the_rental_s_records_as_the_exports_do(clock, rented):
    clock.set(at(14, 5))
    services.usage_record()
    records = list(UsageRecord.objects.select_related("tenant").order_by("id"))
    hook = type("Hook", (), {"batch_first": records[0].pk, "batch_last": records[-1].pk})

    delivered = services.billing_body(batch_id="1-4", hook=hook, records=records)

    exported = [
        export.focus_row(row)
        for row in selectors.usage_rows(since=at(0), until=at(0, day=3), now=clock.now)
    ]
    assert json.loads(delivered)["records"] == exported


def test_the_usage_api_keeps_a_tenant_to_its_own_rentals(clock, rented, member_api):
    clock.set(at(14, 5))

    response = member_api.get("/api/usage/", NOVEMBER)

    assert response.status_code == 200
    records = json.loads(b"".join(response.streaming_content))["records"]
    assert [r["ResourceId"] for r in records] == [f"bare-metal-{rented.pk}"] * 4
