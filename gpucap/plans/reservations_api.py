"""REST API for reservations (issue #19): GPUs of a capacity set kept for a tenant.

- ``GET /api/reservations/`` lists them with what they are now: ``in_force``, ``next_change``,
  ``held_gpus`` (the tenant's GPUs placed inside), what other tenants' spot VMs ``borrowed``,
  and what the tenant's claim would reclaim (``claim_reclaims``, from the set's latest plan).
  Operators see every one; a tenant member only its own tenants' (read-only), with borrowers
  and claims counted, never named (they are other tenants' VMs). Another tenant's reservation
  is a 404. Filters: ``tenant``, ``capacity_set`` (ids).
- ``POST /api/reservations/`` (operators) with ``dry_run`` (default true) answers the preview
  (200: who would borrow and get notices when the tenant claims, nothing changed) or creates
  it (201). ``PATCH``/``DELETE /api/reservations/{id}/`` change or remove one.
- ``GET /api/capacity-sets/{id}/reservations/`` (operators): one set's, for its page.

It lives with the plans because the preview needs the set's snapshot and the arbiter.
Bad input is a 400 naming the field (the services' words) and changes nothing.
"""

from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_view
from rest_framework import serializers, status, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from gpucap.allocation import services as allocation
from gpucap.allocation.models import Reservation
from gpucap.api.base import InputSerializer, ServiceWrites
from gpucap.api.filters import MAX_ID, FilterSet, IdFilter
from gpucap.api.permissions import IsOperator, IsOperatorOrReadOnly
from gpucap.api.schema import AutoSchema
from gpucap.fleet.models import CapacitySet
from gpucap.plans import reservations
from gpucap.roles import is_operator, tenant_ids_for
from gpucap.schedules.serializers import ClockField, DaysField
from gpucap.tenancy.models import Tenant


class ReservationFilter(FilterSet):
    tenant = IdFilter(field_name="tenant_id", label="Tenant id")
    capacity_set = IdFilter(field_name="capacity_set_id", label="Capacity set id")

    class Meta:
        model = Reservation
        fields: list[str] = []


class BorrowerSerializer(serializers.Serializer):
    vm_name = serializers.CharField()
    tenant = serializers.CharField(help_text="The borrowing VM's tenant's slug.")
    node = serializers.CharField(allow_null=True, help_text="The node it runs on.")
    gpus = serializers.IntegerField()


class ClaimReclaimSerializer(serializers.Serializer):
    vm = serializers.IntegerField(help_text="VM id.")
    vm_name = serializers.CharField()
    tenant = serializers.CharField()
    pool = serializers.CharField()
    node = serializers.CharField(allow_null=True)
    gpus = serializers.IntegerField()


@extend_schema_field(
    {
        "type": "string",
        "nullable": True,
        "description": "HH:MM on the wall clock of time_zone; null when always in force.",
    }
)
class _ClockOut(ClockField):
    """A time of day as HH:MM (HH:MM:SS when it has seconds), as it is written in."""

    def to_representation(self, value) -> str:
        return value.strftime("%H:%M:%S" if value.second else "%H:%M")


class ReservationSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    tenant_id = serializers.IntegerField(read_only=True)
    capacity_set_name = serializers.CharField(source="capacity_set.name", read_only=True)
    start = _ClockOut(source="start_time", read_only=True, allow_null=True)
    end = _ClockOut(source="end_time", read_only=True, allow_null=True)
    when = serializers.SerializerMethodField(help_text='"always" or "Mon-Fri 08:00-20:00 UTC".')
    in_force = serializers.SerializerMethodField()
    next_change = serializers.SerializerMethodField(
        help_text="When it next comes into or goes out of force; null: always in force."
    )
    held_gpus = serializers.SerializerMethodField(
        help_text="GPUs of the tenant's VMs placed inside the reservation now."
    )
    kept_gpus = serializers.SerializerMethodField(
        help_text="GPUs the set's latest plan kept free for it (neither its tenant's nor lent); "
        "null: not planned since it was made."
    )
    borrowed_vms = serializers.SerializerMethodField(help_text="How many VMs borrow from it.")
    borrowed_gpus = serializers.SerializerMethodField()
    borrowed = serializers.SerializerMethodField(
        help_text="Operators: the VMs borrowing its kept capacity (empty for a tenant member: "
        "they are other tenants' VMs)."
    )
    claim_reclaim_count = serializers.SerializerMethodField(
        help_text="How many VMs would get notices if the tenant claimed all of it now."
    )
    claim_reclaims = serializers.SerializerMethodField(
        help_text="Operators: those VMs, from the set's latest plan (empty for a tenant member)."
    )

    class Meta:
        model = Reservation
        fields = [
            "id",
            "tenant",
            "tenant_id",
            "capacity_set",
            "capacity_set_name",
            "name",
            "gpus",
            "block_gpus",
            "always",
            "days",
            "start",
            "end",
            "time_zone",
            "when",
            "in_force",
            "next_change",
            "held_gpus",
            "kept_gpus",
            "borrowed_vms",
            "borrowed_gpus",
            "borrowed",
            "claim_reclaim_count",
            "claim_reclaims",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def _facts(self, row) -> reservations.ReservationFacts:
        facts = self.context.setdefault("facts", {})
        if row.pk not in facts:
            facts.update(reservations.reservation_facts([row]))
        return facts[row.pk]

    def _named(self) -> bool:
        return is_operator(self.context["request"].user)

    def get_when(self, row) -> str:
        return self._facts(row).when

    def get_in_force(self, row) -> bool:
        return self._facts(row).in_force

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_next_change(self, row):
        return self._facts(row).next_change

    def get_held_gpus(self, row) -> int:
        return self._facts(row).held_gpus

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_kept_gpus(self, row):
        return self._facts(row).kept_gpus

    def get_borrowed_vms(self, row) -> int:
        return len(self._facts(row).borrowed)

    def get_borrowed_gpus(self, row) -> int:
        return sum(b["gpus"] for b in self._facts(row).borrowed)

    @extend_schema_field(BorrowerSerializer(many=True))
    def get_borrowed(self, row) -> list:
        return self._facts(row).borrowed if self._named() else []

    def get_claim_reclaim_count(self, row) -> int:
        return len(self._facts(row).claim_reclaims)

    @extend_schema_field(ClaimReclaimSerializer(many=True))
    def get_claim_reclaims(self, row) -> list:
        return self._facts(row).claim_reclaims if self._named() else []


class _WindowFields(InputSerializer):
    name = serializers.CharField(required=False, max_length=64)
    gpus = serializers.IntegerField(required=False, help_text="GPUs kept: whole blocks.")
    block_gpus = serializers.IntegerField(
        required=False, help_text="GPUs per block: 1, 2, 4 or 8 (one partition each)."
    )
    always = serializers.BooleanField(required=False, help_text="In force at all times.")
    days = DaysField(required=False)
    start = ClockField(required=False)
    end = ClockField(required=False, help_text="At or before start: ends the next day.")
    time_zone = serializers.CharField(required=False, max_length=64)


class ReservationCreateSerializer(_WindowFields):
    tenant = serializers.CharField(max_length=64, help_text="The tenant's slug.")
    capacity_set = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    dry_run = serializers.BooleanField(
        required=False,
        default=True,
        help_text="true (the default): only say what keeping it would do; false: create it.",
    )


class PreviewSerializer(serializers.Serializer):
    dry_run = serializers.BooleanField(default=True)
    tenant = serializers.CharField()
    capacity_set = serializers.IntegerField()
    name = serializers.CharField()
    gpus = serializers.IntegerField()
    block_gpus = serializers.IntegerField()
    when = serializers.CharField()
    in_force_now = serializers.BooleanField()
    next_in_force = serializers.DateTimeField(
        allow_null=True, help_text="When it would next come into force (now if it would be)."
    )
    kept_gpus = serializers.IntegerField(
        help_text="GPUs the arbiter would keep for it now (free or borrowed)."
    )
    borrowed = BorrowerSerializer(many=True, help_text="VMs that would borrow its capacity.")
    claim_reclaims = ClaimReclaimSerializer(
        many=True, help_text="VMs that would get notices when the tenant claims all of it."
    )
    claim_complete = serializers.BooleanField(
        help_text="Its tenant could claim all of it (with those notices)."
    )


@extend_schema_view(
    create=extend_schema(
        request=ReservationCreateSerializer,
        responses={200: PreviewSerializer, 201: ReservationSerializer},
    ),
    partial_update=extend_schema(request=_WindowFields, responses=ReservationSerializer),
    destroy=extend_schema(description="Remove it: its VMs keep running; nothing is kept."),
)
class ReservationViewSet(ServiceWrites, viewsets.ModelViewSet):
    """Reservations with what they are now. Operators set them; a tenant member reads its own."""

    permission_classes = [IsOperatorOrReadOnly]
    serializer_class = ReservationSerializer
    filterset_class = ReservationFilter
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        rows = Reservation.objects.select_related("tenant", "capacity_set").order_by("pk")
        if getattr(self, "swagger_fake_view", False) or is_operator(self.request.user):
            return rows
        return rows.filter(tenant_id__in=tenant_ids_for(self.request.user))

    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        context = {**self.get_serializer_context(), "facts": reservations.reservation_facts(page)}
        data = ReservationSerializer(page, many=True, context=context).data
        return self.get_paginated_response(data)

    def create(self, request, *args, **kwargs):
        data = dict(self.validated(ReservationCreateSerializer, request.data))
        dry_run = data.pop("dry_run")
        tenant_slug, set_id = data.pop("tenant"), data.pop("capacity_set")
        errors = {}
        tenant = Tenant.objects.filter(slug=tenant_slug).first()
        if tenant is None:
            errors["tenant"] = f"no tenant is called {tenant_slug!r}"
        capacity_set = CapacitySet.objects.filter(pk=set_id).first()
        if capacity_set is None:
            errors["capacity_set"] = f"no capacity set has id {set_id}"
        if errors:
            raise ValidationError(errors)
        if dry_run:
            preview = reservations.reservation_preview(
                tenant=tenant, capacity_set=capacity_set, data=data
            )
            return Response(PreviewSerializer(preview).data)
        row = allocation.reservation_create(
            tenant=tenant, capacity_set=capacity_set, data=data, actor=request.user
        )
        return Response(self.read(row), status=status.HTTP_201_CREATED)

    def partial_update(self, request, *args, **kwargs):
        row = self.get_object()
        data = self.validated(_WindowFields, request.data)
        row = allocation.reservation_update(reservation=row, data=data, actor=request.user)
        return Response(self.read(row))

    def perform_destroy(self, instance) -> None:
        allocation.reservation_delete(reservation=instance, actor=self.request.user)


class CapacitySetReservationsView(APIView):
    """``GET /api/capacity-sets/{id}/reservations/``: the set's reservations, for the set's
    page (operators, as the set's other routes; a tenant member reads /api/reservations/)."""

    schema = AutoSchema()
    permission_classes = [IsOperator]

    @extend_schema(responses=ReservationSerializer(many=True))
    def get(self, request, id: int):
        capacity_set = get_object_or_404(CapacitySet, pk=id)
        rows = Reservation.objects.filter(capacity_set=capacity_set).select_related(
            "tenant", "capacity_set"
        )
        rows = list(rows.order_by("name"))
        context = {"request": request, "facts": reservations.reservation_facts(rows)}
        return Response(ReservationSerializer(rows, many=True, context=context).data)
