"""What billing reads of an attribution: the FOCUS commitment columns filled for reserved GPU
time only, x_Allocation, x_BorrowedFrom and x_DedicatedNode, the same in the CSV and JSON
exports, the API (which filters on allocation) and the webhook's body; and the docs listing
exactly those columns."""

import csv
import io
import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.urls import reverse

from gpucap.notices import dedications
from gpucap.rentals import services as rentals
from gpucap.usage import export, selectors, services
from gpucap.usage.api import COLUMN_HELP
from gpucap.usage.models import BillingWebhook, UsageRecord
from tests.usage.conftest import reserve

NOVEMBER = {"since": "2026-11-01", "until": "2026-12-01"}
README = Path(__file__).resolve().parents[2] / "README.md"
COMMITMENT = [
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountType",
    "CommitmentDiscountCategory",
    "CommitmentDiscountStatus",
]


def at(hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 11, 2, hour, minute, tzinfo=UTC)


def body(response) -> str:
    return b"".join(response.streaming_content).decode()


@pytest.fixture
def usage(clock, place, tenant, other_tenant, operator, fleet_east):
    """acme, 10:00-10:30 each: ``inside`` its reservation, ``borrower`` borrowing globex's,
    ``own-node`` on the node dedicated to it, ``plain`` on shared capacity."""
    h100 = fleet_east["sets"]["h100-east"]
    mine = reserve(tenant, h100, name="acme-block")
    theirs = reserve(other_tenant, h100, name="globex-block")
    dedications.node_dedicate(node=fleet_east["nodes"]["h100-002"], tenant=tenant, actor=operator)
    clock.set(at(10))
    vms = [
        place(tenant, "h100-spot", "h100-001", [0, 1], name="inside", reservation=mine),
        place(tenant, "h100-spot", "h100-001", [2, 3], name="borrower", borrowed_from=theirs),
        place(tenant, "h100-spot", "h100-002", [0], name="own-node"),
        place(tenant, "h100-spot", "h100-001", [4], name="plain"),
    ]
    clock.set(at(10, 30))
    for vm in vms:
        rentals.vm_mark_stopped(vm=rentals.vm_stop(vm=vm))
    clock.set(at(11, 5))
    return {"mine": mine, "theirs": theirs}


def by_name(rows: list[dict]) -> dict[str, dict]:
    return {row["ResourceName"]: row for row in rows}


def test_reserved_time_fills_the_commitment_columns_and_nothing_else_does(operator_client, usage):
    url = reverse("usage:export", kwargs={"fmt": "json"})
    rows = by_name(json.loads(body(operator_client.get(url, NOVEMBER)))["records"])

    mine = usage["mine"].pk
    assert {column: rows["inside"][column] for column in COMMITMENT} == {
        "CommitmentDiscountId": f"reservation-{mine}",
        "CommitmentDiscountName": "h100-east/acme-block",
        "CommitmentDiscountType": "Reservation",
        "CommitmentDiscountCategory": "Usage",
        "CommitmentDiscountStatus": "Used",
    }
    for name in ("borrower", "own-node", "plain"):
        assert {rows[name][column] for column in COMMITMENT} == {""}
    assert {name: row["x_Allocation"] for name, row in rows.items()} == {
        "inside": "reserved",
        "borrower": "borrowed",
        "own-node": "dedicated",
        "plain": "shared",
    }
    assert rows["borrower"]["x_BorrowedFrom"] == f"reservation-{usage['theirs'].pk}"
    assert rows["own-node"]["x_DedicatedNode"] == "h100-002"
    assert rows["plain"]["x_BorrowedFrom"] == rows["plain"]["x_DedicatedNode"] == ""


def test_csv_and_json_carry_the_same_attribution(operator_client, usage):
    as_csv = list(
        csv.DictReader(
            io.StringIO(
                body(operator_client.get(reverse("usage:export", kwargs={"fmt": "csv"}), NOVEMBER))
            )
        )
    )
    as_json = json.loads(
        body(operator_client.get(reverse("usage:export", kwargs={"fmt": "json"}), NOVEMBER))
    )["records"]

    assert len(as_csv) == len(as_json) == 4
    columns = [*COMMITMENT, "x_Allocation", "x_BorrowedFrom", "x_DedicatedNode"]
    for from_csv, from_json in zip(as_csv, as_json, strict=True):
        assert list(from_csv) == export.COLUMNS
        assert {c: from_csv[c] for c in columns} == {c: from_json[c] for c in columns}


def test_the_webhook_body_carries_the_attribution_of_each_record(usage):
    services.usage_record(now=at(11, 5))
    records = list(
        UsageRecord.objects.select_related("tenant", "vm", "pool__cluster", "deployment")
    )
    hook = BillingWebhook(batch_first=records[0].pk, batch_last=records[-1].pk)

    payload = json.loads(services.billing_body(batch_id="1-4", hook=hook, records=records))

    exported = [
        export.focus_row(row)
        for row in selectors.usage_rows(since=at(0), until=at(23), now=at(11, 5))
    ]
    assert sorted(payload["records"], key=lambda r: r["x_RecordId"]) == sorted(
        exported, key=lambda r: r["x_RecordId"]
    )
    assert {r["ResourceName"]: r["x_Allocation"] for r in payload["records"]} == {
        "inside": "reserved",
        "borrower": "borrowed",
        "own-node": "dedicated",
        "plain": "shared",
    }


def test_the_api_filters_on_allocation(operator_api, member_api, usage):
    rows = json.loads(body(operator_api.get("/api/usage/", NOVEMBER | {"allocation": "reserved"})))

    assert [row["ResourceName"] for row in rows["records"]] == ["inside"]
    assert rows["meta"]["allocation"] == "reserved"
    response = member_api.get(
        "/api/usage/", NOVEMBER | {"tenant": "acme", "allocation": "dedicated", "format": "csv"}
    )
    rows = list(csv.DictReader(io.StringIO(body(response))))
    assert [(row["ResourceName"], row["x_DedicatedNode"]) for row in rows] == [
        ("own-node", "h100-002")
    ]


def test_an_unknown_allocation_is_400_naming_it(operator_api, usage):
    response = operator_api.get("/api/usage/", NOVEMBER | {"allocation": "free"})

    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert list(fields) == ["allocation"]
    assert "free" in fields["allocation"][0]


def test_the_docs_list_every_column_and_only_those():
    readme = README.read_text()
    table = readme[readme.index("**Columns** follow") : readme.index("## Billing webhook")]
    documented = re.findall(r"^\| `([A-Za-z_]+)` \|", table, flags=re.MULTILINE)

    assert documented == export.COLUMNS
    assert list(COLUMN_HELP) == export.COLUMNS
    sample = readme[readme.index('{"batch": {"id"') : readme.index("| header | value |")]
    for column in export.COLUMNS:
        assert f'"{column}"' in sample, f"the webhook's sample body lacks {column}"


def test_the_tenants_usage_page_shows_its_gpu_hours_per_allocation(member_client, usage):
    response = member_client.get(
        reverse("usage:tenant-usage", kwargs={"slug": "acme"}),
        NOVEMBER,
        headers={"HX-Request": "true"},
    )

    html = response.content.decode()
    split = html[
        html.index('id="usage-by-allocation"') : html.index(
            "</dl>", html.index('id="usage-by-allocation"')
        )
    ]
    shown = dict(re.findall(r"<dt>(\w+) GPU-hours</dt><dd>([\d.,]+)</dd>", split))
    assert shown == {"Dedicated": "0.5", "Reserved": "1.0", "Borrowed": "1.0", "Shared": "0.5"}
