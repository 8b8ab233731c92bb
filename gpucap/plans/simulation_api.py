"""REST API for stored simulation runs (issue 21). Operators only.

- ``POST /api/capacity-sets/{id}/simulate/`` asks for a run: a load profile replayed on the set
  as it is now (or from a stored run's start, ``from_run``), with today's policy and, given
  ``changes``, an edited one beside it. 202 with the run, queued; a worker carries it out.
- ``GET /api/capacity-sets/{id}/simulations/``: the set's runs, newest first, with progress
  and the figures of today's policy, without the results' bodies.
- ``GET /api/simulations/{id}/``: one run in full: results, differences, progress.

The input serializer checks only the request's shape; what the values mean is the service's
(`gpucap.plans.simulation_runs.simulation_request`) to say, by field.
"""

from django.db.models.fields.json import KeyTransform
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import exceptions, generics, serializers, status
from rest_framework.response import Response

from gpucap.api.base import InputSerializer, OperatorCommand
from gpucap.api.permissions import IsOperator
from gpucap.api.schema import AutoSchema
from gpucap.fleet.models import CapacitySet
from gpucap.plans import simulation_runs
from gpucap.plans.models import SimulationRun

# The large parts of a run a list leaves out.
BODIES = ("start", "result", "variant_result", "profile")


class SimulateSerializer(InputSerializer):
    profile = serializers.JSONField(
        help_text='The load: {"deployments": {slug: {"points": [[seconds, rps], ...], "shape": '
        '"linear"|"step", "service_seconds": s}}, "pools": {name: {"points": [[seconds, '
        'vms_per_hour]], "gpus_per_vm": n, "duration_seconds": s}}} (docs/simulation.md).'
    )
    changes = serializers.JSONField(
        required=False,
        allow_null=True,
        help_text='The edited configuration to compare: {"pools": {name: {"rank", '
        '"floor_gpus"}}, "deployments": {slug: {"min_replicas", "max_replicas"}}, "schedule": '
        "null (the set's) | [] (none) | [entries as the schedule API takes them]}. Absent or "
        "{}: no comparison.",
    )
    name = serializers.CharField(required=False, allow_blank=True, max_length=120)
    hours = serializers.IntegerField(required=False, min_value=1, max_value=168, default=24)
    step_seconds = serializers.IntegerField(
        required=False,
        min_value=10,
        max_value=3600,
        default=60,
        help_text="Seconds a step; it divides the duration evenly.",
    )
    wait_threshold_seconds = serializers.FloatField(
        required=False,
        min_value=0.001,
        max_value=3600,
        default=1.0,
        help_text="A request waiting longer than this counts as late.",
    )
    from_run = serializers.IntegerField(
        required=False,
        allow_null=True,
        help_text="Id of a run of this set: start from the set as it was read for that run.",
    )


class FigureSerializer(serializers.Serializer):
    key = serializers.CharField()
    label = serializers.CharField()
    value = serializers.FloatField(allow_null=True, help_text="Null: unbounded.")
    unit = serializers.CharField(allow_blank=True)
    shown = serializers.CharField()


class DifferenceSerializer(serializers.Serializer):
    key = serializers.CharField()
    label = serializers.CharField()
    before = serializers.CharField(help_text="Today's policy, as shown.")
    after = serializers.CharField(help_text="The edited policy, as shown.")
    before_value = serializers.FloatField(allow_null=True)
    after_value = serializers.FloatField(allow_null=True)
    unit = serializers.CharField(allow_blank=True)
    text = serializers.CharField(help_text='e.g. "h100-spot notices/day 24 → 0".')


class SimulationRunSerializer(serializers.ModelSerializer):
    """A run with its progress and the figures of today's policy (null until done)."""

    capacity_set_name = serializers.CharField(source="capacity_set.name")
    requested_by = serializers.SerializerMethodField()
    progress = serializers.SerializerMethodField(help_text="0 to 1: steps_done / steps_total.")
    compares = serializers.BooleanField(help_text="An edited configuration runs beside today's.")
    figures = serializers.SerializerMethodField()
    differences = DifferenceSerializer(many=True)

    class Meta:
        model = SimulationRun
        fields = [
            "id",
            "capacity_set",
            "capacity_set_name",
            "name",
            "state",
            "requested_by",
            "created_at",
            "started_at",
            "finished_at",
            "steps_done",
            "steps_total",
            "progress",
            "error",
            "compares",
            "step_seconds",
            "duration_seconds",
            "wait_threshold_seconds",
            "figures",
            "differences",
        ]

    def get_requested_by(self, run: SimulationRun) -> str | None:
        return run.requested_by.get_username() if run.requested_by else None

    def get_progress(self, run: SimulationRun) -> float:
        return round(run.steps_done / run.steps_total, 3) if run.steps_total else 0.0

    @extend_schema_field(FigureSerializer(many=True, allow_null=True))
    def get_figures(self, run: SimulationRun):
        figures = getattr(run, "figures", None)
        if figures is None and "result" not in run.get_deferred_fields() and run.result:
            figures = run.result.get("figures")
        return figures


class SimulationRunDetailSerializer(SimulationRunSerializer):
    """A run in full: the profile and changes it was given and both results (result_to_dict's
    form: the steps as columns, events, worst moments with the arbiter's plan, figures)."""

    class Meta(SimulationRunSerializer.Meta):
        fields = [
            *SimulationRunSerializer.Meta.fields,
            "profile",
            "changes",
            "result",
            "variant_result",
        ]


def _capacity_set(capacity_set_id: int) -> CapacitySet:
    capacity_set = CapacitySet.objects.filter(pk=capacity_set_id).first()
    if capacity_set is None:
        raise exceptions.NotFound(f"no capacity set {capacity_set_id}")
    return capacity_set


def _detail(run_id: int) -> dict:
    run = SimulationRun.objects.select_related("capacity_set", "requested_by").filter(pk=run_id)
    found = run.first()
    if found is None:
        raise exceptions.NotFound(f"no simulation run {run_id}")
    return SimulationRunDetailSerializer(found).data


class CapacitySetSimulateView(OperatorCommand):
    @extend_schema(
        request=SimulateSerializer,
        responses={202: SimulationRunDetailSerializer},
        operation_id="capacity_sets_simulate_create",
    )
    def post(self, request, id: int):
        """Ask for a simulation run of the set (audited): 202 with the run, queued. Every
        problem of the profile, the times or the changes is a 400 naming its field, and
        nothing is stored."""
        capacity_set = _capacity_set(id)
        serializer = SimulateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        from_run = None
        if data.get("from_run") is not None:
            from_run = SimulationRun.objects.filter(pk=data["from_run"]).first()
            if from_run is None:
                raise serializers.ValidationError(
                    {"from_run": [f"no simulation run {data['from_run']}"]}
                )
        run = simulation_runs.simulation_request(
            capacity_set,
            profile=data["profile"],
            changes=data.get("changes"),
            name=data.get("name", ""),
            hours=data["hours"],
            step_seconds=data["step_seconds"],
            wait_threshold_seconds=data["wait_threshold_seconds"],
            from_run=from_run,
            by=request.user,
        )
        return Response(_detail(run.pk), status=status.HTTP_202_ACCEPTED)


class CapacitySetSimulationsView(generics.ListAPIView):
    """The set's simulation runs, newest first, with progress and today's figures."""

    schema = AutoSchema()
    permission_classes = [IsOperator]
    serializer_class = SimulationRunSerializer

    queryset = SimulationRun.objects.none()  # the schema's model

    def get_queryset(self):
        capacity_set = _capacity_set(self.kwargs["id"])
        return (
            SimulationRun.objects.filter(capacity_set=capacity_set)
            .select_related("capacity_set", "requested_by")
            .defer(*BODIES)
            .annotate(figures=KeyTransform("figures", "result"))
            .order_by("-created_at", "-id")
        )

    @extend_schema(operation_id="capacity_sets_simulations_list")
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)


class SimulationRunView(OperatorCommand):
    @extend_schema(responses=SimulationRunDetailSerializer, operation_id="simulations_retrieve")
    def get(self, request, id: int):
        """One simulation run in full: both results, the differences, progress."""
        return Response(_detail(id))
