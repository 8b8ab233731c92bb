"""REST API for usage (DESIGN.md section 9).

- ``GET /api/usage/?since=YYYY-MM-DD&until=YYYY-MM-DD[&tenant=<slug>][&allocation=<a>]`` streams
  the usage rows of the period (of one allocation: shared, reserved, borrowed or dedicated)
  in the FOCUS columns (gpucap/usage/export.py; the README lists them) as
  ``{"meta": {...}, "records": [...]}``; ``&format=csv`` streams the same rows as CSV.
  Operators read every tenant's rows or one tenant's; a tenant member reads only their own
  tenants' rows, and another tenant's slug answers 404 as a tenant that does not exist would.
"""

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, renderers, serializers
from rest_framework.views import APIView

from gpucap.api.errors import ApiErrorSerializer
from gpucap.roles import is_operator, tenant_ids_for
from gpucap.tenancy.models import Tenant
from gpucap.usage import export
from gpucap.usage.export import COLUMNS
from gpucap.usage.forms import MAX_DAYS, period_between
from gpucap.usage.models import Allocation

# --- the query -----------------------------------------------------------------------------------


class UsageQuerySerializer(serializers.Serializer):
    since = serializers.DateField(
        input_formats=["%Y-%m-%d"], help_text="First UTC day counted, YYYY-MM-DD."
    )
    until = serializers.DateField(
        input_formats=["%Y-%m-%d"],
        help_text=f"First UTC day not counted, YYYY-MM-DD; at most {MAX_DAYS} days after since.",
    )
    tenant = serializers.SlugField(
        required=False, help_text="A tenant's slug: only its rows. Default: every row you may see."
    )
    allocation = serializers.ChoiceField(
        choices=Allocation.choices,
        required=False,
        help_text="Only GPU time of this allocation (x_Allocation). Default: all of it.",
    )

    def validate(self, data):
        try:
            data["period"] = period_between(data["since"], data["until"])
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict) from None
        return data


# --- the answer, for the schema (the rows are streamed, not serialized) --------------------------

COLUMN_HELP = {
    "x_RecordId": "Stable id of the piece: iv<interval id>-<period start, UTC>.",
    "ChargePeriodStart": "Start of the GPU time counted, UTC.",
    "ChargePeriodEnd": "End of the GPU time counted (exclusive), UTC; now for a running VM.",
    "ChargeCategory": "Always Usage.",
    "PricingCategory": "Standard (on-demand, inference, bare metal) or Dynamic (spot).",
    "ConsumedQuantity": "GPU-seconds, a decimal string exact to the millisecond.",
    "ConsumedUnit": "Always GPU-Seconds.",
    "SubAccountId": "The tenant's slug.",
    "SubAccountName": "The tenant's name.",
    "ResourceId": "The VM, vm-<id>; or the bare-metal rental, bare-metal-<id>.",
    "ResourceName": "The VM's name; or the rented machine's hostname.",
    "ResourceType": "GPU VM, Inference replica or Bare-metal machine.",
    "RegionId": "The cluster's name.",
    "ServiceCategory": "Always Compute.",
    "ServiceName": "On-demand GPU VMs, Spot GPU VMs, Inference endpoints or Bare-metal machines.",
    "SkuId": "<GPU model>/<pool kind>.",
    "CommitmentDiscountId": "Reserved GPU time: the reservation, reservation-<id>; empty "
    "otherwise.",
    "CommitmentDiscountName": "Reserved GPU time: the reservation, <capacity set>/<name>; empty "
    "otherwise.",
    "CommitmentDiscountType": "Reservation for reserved GPU time; empty otherwise.",
    "CommitmentDiscountCategory": "Usage (a number of GPUs kept) for reserved GPU time; empty "
    "otherwise.",
    "CommitmentDiscountStatus": "Used for reserved GPU time; empty otherwise.",
    "x_PoolName": "The pool's name; empty for a bare-metal rental.",
    "x_PoolKind": "on_demand, spot or inference; bare_metal for a whole machine rented to the "
    "tenant (all its GPUs, from the rental's start to its end).",
    "x_CapacitySet": "The pool's capacity set; empty for a standalone pool.",
    "x_GpuModel": "The GPU model.",
    "x_GpuCount": "GPUs the VM held; every GPU of a bare-metal rental's machine.",
    "x_DeploymentSlug": "The inference deployment a replica serves; empty otherwise.",
    "x_Allocation": "Whose capacity: dedicated (a node dedicated to the tenant, bare-metal "
    "rentals included), reserved (inside "
    "the tenant's reservation), borrowed (capacity kept for another tenant's reservation) or "
    "shared.",
    "x_BorrowedFrom": "Borrowed GPU time: the reservation borrowed from, reservation-<id>; empty "
    "otherwise.",
    "x_DedicatedNode": "Dedicated GPU time: the node's hostname; empty otherwise.",
    "x_UsagePeriodStart": "Start of the usage period (USAGE_PERIOD_SECONDS) the piece is in.",
    "x_Final": "True once the piece can no longer grow (its period or its interval ended).",
}


def _column(name: str) -> serializers.Field:
    help_text = COLUMN_HELP[name]
    if name == "x_GpuCount":
        return serializers.IntegerField(help_text=help_text)
    if name == "x_Final":
        return serializers.BooleanField(help_text=help_text)
    return serializers.CharField(help_text=help_text)


UsageRecordSerializer = type(
    "UsageRecordSerializer",
    (serializers.Serializer,),
    {
        "__doc__": "One piece of GPU time: one interval of a VM within one usage period.",
        **{name: _column(name) for name in COLUMNS},
    },
)


class UsageMetaSerializer(serializers.Serializer):
    since = serializers.DateField()
    until = serializers.DateField()
    tenants = serializers.ListField(
        child=serializers.CharField(),
        allow_null=True,
        help_text="The tenants whose rows these are; null: every tenant.",
    )
    allocation = serializers.CharField(
        required=False, help_text="The allocation asked for; absent when every row is here."
    )
    generated_at = serializers.DateTimeField(help_text="Running VMs are counted up to here.")
    usage_period_seconds = serializers.IntegerField()
    columns = serializers.ListField(child=serializers.CharField())


class UsageExportSerializer(serializers.Serializer):
    meta = UsageMetaSerializer()
    records = UsageRecordSerializer(many=True)


class UsageCsvRenderer(renderers.BaseRenderer):
    """Chosen by ``?format=csv``; the view streams the CSV itself."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return data


# --- the endpoint --------------------------------------------------------------------------------


class UsageView(APIView):
    renderer_classes = [renderers.JSONRenderer, UsageCsvRenderer]

    @extend_schema(
        operation_id="usage_list",
        summary="Usage rows of a period (FOCUS columns), as JSON or CSV",
        parameters=[
            UsageQuerySerializer,
            OpenApiParameter(
                "format",
                OpenApiTypes.STR,
                enum=["json", "csv"],
                description="json (default) or csv: the same rows, streamed.",
            ),
        ],
        responses={
            (200, "application/json"): UsageExportSerializer,
            (200, "text/csv"): OpenApiTypes.STR,
            (400, "application/json"): OpenApiResponse(
                ApiErrorSerializer,
                description="Bad since or until, a period over 366 days, an unknown tenant or "
                "allocation; "
                "`fields` names each.",
            ),
            (404, "application/json"): OpenApiResponse(
                ApiErrorSerializer, description="A tenant you are not a member of."
            ),
        },
    )
    def get(self, request):
        """Every piece of GPU time in [since, until): one row per VM interval and usage period,
        running VMs counted up to now (`x_Final` false); `allocation` keeps only shared,
        reserved, borrowed or dedicated GPU time (`x_Allocation`). Bad dates, `until` not
        after `since`, more than 366 days, an unknown tenant or allocation: 400 naming the
        field. A tenant member sees only their tenants' rows; another tenant's slug answers
        404."""
        query = UsageQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        tenants = _tenants(request.user, query.validated_data.get("tenant"))
        return export.export_response(
            request.accepted_renderer.format,
            query.validated_data["period"],
            tenants=tenants,
            allocation=query.validated_data.get("allocation"),
            attachment=False,
        )

    def handle_exception(self, exc):
        # Errors keep the API's one JSON error shape even when CSV was asked for.
        response = super().handle_exception(exc)
        self.request.accepted_renderer = renderers.JSONRenderer()
        self.request.accepted_media_type = "application/json"
        return response


def _tenants(user, slug: str | None) -> list[Tenant] | None:
    """Whose rows: None for every tenant (operators only), else a list (maybe empty)."""
    if is_operator(user):
        if slug is None:
            return None
        tenant = Tenant.objects.filter(slug=slug).first()
        if tenant is None:
            raise serializers.ValidationError({"tenant": [f"no tenant {slug!r}"]})
        return [tenant]
    mine = Tenant.objects.filter(pk__in=tenant_ids_for(user)).order_by("name")
    if slug is None:
        return list(mine)
    tenant = mine.filter(slug=slug).first()
    if tenant is None:
        raise exceptions.NotFound(f"no tenant {slug!r} you are a member of")
    return [tenant]
