"""Usage rows in the FinOps FOCUS vocabulary, as CSV and JSON.

FOCUS columns are used where one fits; gpucap's own columns carry the ``x_`` prefix FOCUS asks
for. Costs are not here: gpucap meters, the operator's billing prices. The README lists every
column.
"""

import csv
import io
import json
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime

from django.conf import settings
from django.http import StreamingHttpResponse
from django.utils import timezone

from gpucap.usage import selectors
from gpucap.usage.models import Allocation

COLUMNS = [
    "x_RecordId",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "ChargeCategory",
    "PricingCategory",
    "ConsumedQuantity",
    "ConsumedUnit",
    "SubAccountId",
    "SubAccountName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "RegionId",
    "ServiceCategory",
    "ServiceName",
    "SkuId",
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountType",
    "CommitmentDiscountCategory",
    "CommitmentDiscountStatus",
    "x_PoolName",
    "x_PoolKind",
    "x_CapacitySet",
    "x_GpuModel",
    "x_GpuCount",
    "x_DeploymentSlug",
    "x_Allocation",
    "x_BorrowedFrom",
    "x_DedicatedNode",
    "x_UsagePeriodStart",
    "x_Final",
]

# On-demand capacity is sold at list price; spot at a price that moves (FOCUS "Dynamic").
# Rows per chunk of a streamed export: big enough that the response's per-chunk cost vanishes.
CHUNK_ROWS = 1000

# A whole machine rented as bare metal is sold at its list price too.
PRICING_CATEGORY = {
    "on_demand": "Standard",
    "spot": "Dynamic",
    "inference": "Standard",
    "bare_metal": "Standard",
}
SERVICE_NAME = {
    "on_demand": "On-demand GPU VMs",
    "spot": "Spot GPU VMs",
    "inference": "Inference endpoints",
    "bare_metal": "Bare-metal machines",
}


def focus_row(row: dict) -> dict:
    """One usage row (``selectors.usage_rows``) as FOCUS columns, JSON-ready. A bare-metal
    rental's row (kind ``bare_metal``, no VM or pool) names the rental and its node."""
    replica = row["deployment_slug"] is not None
    bare_metal = row["vm_id"] is None
    return {
        "x_RecordId": row["record_id"],
        "ChargePeriodStart": _utc(row["started_at"]),
        "ChargePeriodEnd": _utc(row["ended_at"]),
        "ChargeCategory": "Usage",
        "PricingCategory": PRICING_CATEGORY[row["pool_kind"]],
        "ConsumedQuantity": str(row["gpu_seconds"]),  # a decimal, exact to the millisecond
        "ConsumedUnit": "GPU-Seconds",
        "SubAccountId": row["tenant_slug"],
        "SubAccountName": row["tenant_name"],
        "ResourceId": (
            f"bare-metal-{row['bare_metal_rental_id']}" if bare_metal else f"vm-{row['vm_id']}"
        ),
        "ResourceName": row["node_hostname"] if bare_metal else row["vm_name"],
        "ResourceType": _resource_type(bare_metal=bare_metal, replica=replica),
        "RegionId": row["cluster_name"],
        "ServiceCategory": "Compute",
        "ServiceName": SERVICE_NAME[row["pool_kind"]],
        "SkuId": f"{row['gpu_model']}/{row['pool_kind']}",
        **_commitment(row),
        "x_PoolName": row["pool_name"] or "",
        "x_PoolKind": row["pool_kind"],
        "x_CapacitySet": row["capacity_set_name"] or "",
        "x_GpuModel": row["gpu_model"],
        "x_GpuCount": row["gpu_count"],
        "x_DeploymentSlug": row["deployment_slug"] or "",
        "x_Allocation": row["allocation"],
        "x_BorrowedFrom": row["borrowed_from"],
        "x_DedicatedNode": row["dedicated_node"],
        "x_UsagePeriodStart": _utc(row["period_start"]),
        "x_Final": bool(row["final"]),
    }


def _resource_type(*, bare_metal: bool, replica: bool) -> str:
    if bare_metal:
        return "Bare-metal machine"
    return "Inference replica" if replica else "GPU VM"


def _commitment(row: dict) -> dict:
    """FOCUS's commitment columns: GPU time inside a reservation used the tenant's commitment
    (a reservation, paid for whether used or not); every other row leaves them empty."""
    reserved = row["allocation"] == Allocation.RESERVED
    return {
        "CommitmentDiscountId": row["commitment_id"],
        "CommitmentDiscountName": row["commitment_name"],
        "CommitmentDiscountType": "Reservation" if reserved else "",
        "CommitmentDiscountCategory": "Usage" if reserved else "",
        "CommitmentDiscountStatus": "Used" if reserved else "",
    }


def csv_lines(rows: Iterable[dict]) -> Iterator[str]:
    """The header, then the rows as CSV, CHUNK_ROWS lines at a time (for a streaming response)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for n, row in enumerate(rows, 1):
        focus = focus_row(row)
        focus["x_Final"] = "true" if focus["x_Final"] else "false"
        writer.writerow([focus[column] for column in COLUMNS])
        if n % CHUNK_ROWS == 0:
            yield _drain(buffer)
    yield _drain(buffer)


def json_chunks(rows: Iterable[dict], *, meta: dict) -> Iterator[str]:
    """``{"meta": {...}, "records": [...]}``, one record a line, CHUNK_ROWS records at a time
    (for a streaming response)."""
    parts = ['{"meta": ' + json.dumps(meta, default=str) + ', "records": [']
    separator = "\n"
    for n, row in enumerate(rows, 1):
        parts.append(separator + json.dumps(focus_row(row)))
        separator = ",\n"
        if n % CHUNK_ROWS == 0:
            yield "".join(parts)
            parts = []
    parts.append("\n]}\n")
    yield "".join(parts)


def _drain(buffer: io.StringIO) -> str:
    text = buffer.getvalue()
    buffer.seek(0)
    buffer.truncate()
    return text


def _utc(moment: datetime) -> str:
    """ISO 8601 in UTC with a Z, microseconds only when there are some."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def export_response(
    fmt: str,
    period,
    *,
    tenants: list | None,
    allocation: str | None = None,
    attachment: bool = True,
) -> StreamingHttpResponse:
    """The rows of ``tenants`` (None: every tenant) in ``period`` (only GPU time of one
    ``allocation`` if given) as a streamed CSV or JSON download named like
    ``gpucap-usage-acme-2026-11.csv``."""
    now = timezone.now()
    bounds = {"since": period.start, "until": period.end, "allocation": allocation, "now": now}
    if tenants is None:
        rows = selectors.usage_rows(**bounds)
    elif len(tenants) == 1:
        rows = selectors.usage_rows(**bounds, tenant_id=tenants[0].pk)
    else:
        rows = selectors.usage_rows_of_tenants(**bounds, tenant_ids=[t.pk for t in tenants])
    if fmt == "csv":
        response = StreamingHttpResponse(csv_lines(rows), content_type="text/csv; charset=utf-8")
    else:
        meta = {
            **period.query(),
            "tenants": None if tenants is None else [tenant.slug for tenant in tenants],
            **({"allocation": allocation} if allocation else {}),
            "generated_at": now.astimezone(UTC).isoformat().replace("+00:00", "Z"),
            "usage_period_seconds": settings.USAGE_PERIOD_SECONDS,
            "columns": COLUMNS,
        }
        response = StreamingHttpResponse(
            json_chunks(rows, meta=meta), content_type="application/json"
        )
    if attachment:
        scope = "all" if tenants is None else "-".join(tenant.slug for tenant in tenants)
        filename = f"gpucap-usage-{scope}-{period.name}.{fmt}"
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response
