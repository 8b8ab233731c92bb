"""REST API for the arbiter's plans (DESIGN.md section 8). Operators only.

- ``GET /api/plans/`` lists stored plans, newest first; ``GET /api/plans/{id}/`` is one plan
  with its actions; ``GET /api/capacity-sets/{id}/plan/`` is a set's latest plan.
- ``POST /api/plans/{id}/approve/`` applies exactly that plan, once. A plan the set outran is
  refused with 409 ``stale_plan``, and the answer carries the fresh plan and what changed, so a
  client approves again knowingly (the fresh plan's id).
- ``POST /api/capacity-sets/{id}/mode/`` switches a set between dry_run and enforce (audited);
  it is the only way to change a set's mode.
- ``POST /api/capacity-sets/{id}/what-if/`` previews what a pool asking for more GPUs would
  reclaim; nothing is stored or changed.

Reads go through ``gpucap.plans.selectors`` (fixed query counts), changes through
``gpucap.plans.services``; the input serializers here check only a request's shape.
"""

from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import exceptions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from gpucap.api.base import InputSerializer, OperatorCommand
from gpucap.api.errors import ApiErrorBodySerializer, error_body
from gpucap.api.permissions import IsOperator
from gpucap.api.schema import AutoSchema
from gpucap.fleet.models import CapacitySet, Pool
from gpucap.plans import selectors, services
from gpucap.plans.filters import PlanFilter
from gpucap.plans.models import Plan, PlanAction

# --- read -------------------------------------------------------------------------------------


class PlanPoolSerializer(serializers.Serializer):
    """One pool of the set before and after a plan, against its floor."""

    pool = serializers.IntegerField(read_only=True, help_text="Pool id.")
    name = serializers.CharField(read_only=True)
    rank = serializers.IntegerField(read_only=True, help_text="1 is the highest priority.")
    kind = serializers.CharField(read_only=True, help_text="on_demand, spot or inference")
    floor_gpus = serializers.IntegerField(read_only=True)
    before_gpus = serializers.IntegerField(read_only=True, help_text="GPUs held before the plan.")
    after_gpus = serializers.IntegerField(read_only=True, help_text="GPUs held after the plan.")
    pending_gpus = serializers.IntegerField(
        read_only=True, help_text="GPUs the pool's pending demands ask for."
    )


class PlanActionSerializer(serializers.ModelSerializer):
    """One line of a plan: a placement, a preemption (a notice) or an unsatisfied demand."""

    instance_id = serializers.CharField(
        source="vm.instance_id",
        read_only=True,
        help_text="The VM as guests know it, e.g. vm-42: the placed or unsatisfied demand's VM, "
        "or the preempted VM.",
    )
    for_instance_id = serializers.CharField(
        source="for_vm.instance_id",
        read_only=True,
        allow_null=True,
        default=None,
        help_text="Preemptions: the VM whose placement takes the victim's GPUs.",
    )
    # A plain string: an enum named "kind" is already the pool's in the schema.
    kind = serializers.CharField(read_only=True, help_text="placement, preemption or unsatisfied")
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    pool_name = serializers.CharField(source="pool.name", read_only=True)
    node_hostname = serializers.CharField(
        source="node.hostname", read_only=True, allow_null=True, default=None
    )
    gpus = serializers.ListField(
        child=serializers.IntegerField(), read_only=True, help_text="GPU indices on the node."
    )
    progress = serializers.ChoiceField(
        choices=PlanAction.Progress.choices,
        allow_blank=True,
        read_only=True,
        help_text="Empty until the plan is applied.",
    )

    class Meta:
        model = PlanAction
        fields = [
            "kind",
            "position",
            "vm",
            "instance_id",
            "for_vm",
            "for_instance_id",
            "tenant",
            "pool",
            "pool_name",
            "node",
            "node_hostname",
            "gpus",
            "group",
            "running_since",
            "reason",
            "waits_until",
            "reservation",
            "borrowed_from",
            "progress",
            "progress_message",
        ]
        read_only_fields = fields


class PlanReservationSerializer(serializers.Serializer):
    """A reservation in force after the plan, as the arbiter reported it (docs/allocation.md)."""

    id = serializers.CharField(read_only=True, help_text="The reservation's id, as text.")
    tenant = serializers.CharField(read_only=True)
    gpus = serializers.IntegerField(read_only=True)
    block_gpus = serializers.IntegerField(read_only=True)
    held_before = serializers.IntegerField(read_only=True)
    held_after = serializers.IntegerField(read_only=True)
    kept_gpus = serializers.IntegerField(read_only=True, help_text="Kept blocks still free.")
    borrowed = serializers.ListField(
        child=serializers.CharField(), read_only=True, help_text="Borrowing VMs' instance ids."
    )
    claim_reclaims = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="Instance ids of the VMs a claim of all of it would give notices.",
    )
    claim_complete = serializers.BooleanField(read_only=True)


class PlanSerializer(serializers.ModelSerializer):
    capacity_set_name = serializers.CharField(source="capacity_set.name", read_only=True)
    approved_by = serializers.CharField(
        source="approved_by.username",
        read_only=True,
        allow_null=True,
        default=None,
        help_text="The operator who approved it; null for a plan applied under enforcement.",
    )
    pools = PlanPoolSerializer(
        many=True, read_only=True, help_text="Each pool of the set before/after, in rank order."
    )

    class Meta:
        model = Plan
        fields = [
            "id",
            "capacity_set",
            "capacity_set_name",
            "generation",
            "mode",
            "status",
            "trigger",
            "complete",
            "demands",
            "placements",
            "preemptions",
            "preempted_gpus",
            "unsatisfied",
            "pools",
            "digest",
            "planning_ms",
            "replans",
            "replanned_at",
            "created_at",
            "approved_by",
            "approved_at",
            "applied_at",
            "status_message",
        ]
        read_only_fields = fields


class PlanDetailSerializer(PlanSerializer):
    actions = PlanActionSerializer(
        many=True,
        read_only=True,
        help_text="Placements, then preemptions, then unsatisfied demands, each in plan order.",
    )

    reservations = PlanReservationSerializer(
        many=True, read_only=True, help_text="Each reservation in force: held, kept, borrowed."
    )

    class Meta(PlanSerializer.Meta):
        fields = [*PlanSerializer.Meta.fields, "reservations", "actions"]
        read_only_fields = fields


class StalePlanErrorSerializer(serializers.Serializer):
    """A refused approval: the one error shape, plus (for `stale_plan`) the fresh plan to
    review and what changed."""

    error = ApiErrorBodySerializer()
    fresh_plan = PlanDetailSerializer(
        required=False,
        help_text="stale_plan only: the set's plan as it is now; approve its id to apply it.",
    )
    changes = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="stale_plan only: how the fresh plan differs from the refused one, in words.",
    )


class CapacitySetModeResultSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(read_only=True)
    mode = serializers.ChoiceField(choices=CapacitySet.Mode.choices, read_only=True)
    plan = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        help_text="enforce: the set's current proposal, which enforcement applies first; null "
        "when there is none (or in dry_run).",
    )
    notifies = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        help_text="enforce: how many VMs that proposal notifies (0 when there is none); null "
        "in dry_run.",
    )


class WhatIfActionSerializer(PlanActionSerializer):
    """A line of a what-if plan. The asked-for blocks are no VM: `vm`, `instance_id` and
    `tenant` are null for them, and `subject` names them `what-if-N`."""

    vm = serializers.IntegerField(source="vm_id", read_only=True, allow_null=True)
    instance_id = serializers.CharField(
        source="vm.instance_id", read_only=True, allow_null=True, default=None
    )
    tenant = serializers.CharField(
        source="tenant.slug", read_only=True, allow_null=True, default=None
    )
    subject = serializers.CharField(
        read_only=True, help_text="The VM's instance id, or what-if-N for the asked-for blocks."
    )
    for_subject = serializers.CharField(
        read_only=True,
        allow_null=True,
        default=None,
        help_text="Preemptions: the demand the GPUs go to (an instance id or what-if-N).",
    )

    class Meta(PlanActionSerializer.Meta):
        fields = [
            "kind",
            "position",
            "subject",
            "vm",
            "instance_id",
            "for_subject",
            "for_vm",
            "for_instance_id",
            "tenant",
            "pool",
            "pool_name",
            "node",
            "node_hostname",
            "gpus",
            "group",
            "running_since",
            "reason",
        ]
        read_only_fields = fields


class WhatIfReclaimSerializer(serializers.Serializer):
    """A VM that would get a notice so the pool's ask is served."""

    vm = serializers.CharField(
        source="subject", read_only=True, help_text="Instance id, e.g. vm-4."
    )
    tenant = serializers.CharField(source="tenant.slug", read_only=True)
    pool = serializers.CharField(source="pool.name", read_only=True, help_text="Pool name.")
    node = serializers.CharField(source="node.hostname", read_only=True, help_text="Hostname.")
    gpus = serializers.ListField(child=serializers.IntegerField(), read_only=True)
    running_since = serializers.DateTimeField(read_only=True, allow_null=True)
    reason = serializers.CharField(read_only=True)

    def get_fields(self):
        fields = super().get_fields()
        # "for" is a Python keyword, so it cannot be declared as a class attribute.
        fields["for"] = serializers.CharField(
            source="for_subject",
            read_only=True,
            help_text="The asked-for block (what-if-N) the VM's GPUs would go to.",
        )
        return fields


class WhatIfPreviewSerializer(serializers.Serializer):
    capacity_set = serializers.IntegerField(source="pool.capacity_set_id", read_only=True)
    pool = serializers.IntegerField(source="pool.pk", read_only=True)
    pool_name = serializers.CharField(source="pool.name", read_only=True)
    gpus = serializers.IntegerField(read_only=True)
    block_gpus = serializers.IntegerField(read_only=True)
    at = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="The instant asked about; null: now."
    )
    served = serializers.BooleanField(
        read_only=True, help_text="Whether every asked-for block would be placed (all or none)."
    )
    reclaimed = WhatIfReclaimSerializer(
        many=True, read_only=True, help_text="VMs that would get notices for the ask."
    )
    reclaimed_gpus = serializers.IntegerField(read_only=True)
    pools = PlanPoolSerializer(many=True, read_only=True)
    actions = WhatIfActionSerializer(
        many=True,
        read_only=True,
        help_text="The whole plan with the ask: pending VMs' lines as well as the ask's.",
    )


# --- input shapes -----------------------------------------------------------------------------


class CapacitySetModeSerializer(InputSerializer):
    mode = serializers.ChoiceField(
        choices=CapacitySet.Mode.choices,
        error_messages={"invalid_choice": "{input!r} is not one of: dry_run, enforce"},
        help_text="dry_run: plans are only shown; enforce: every plan is applied when made.",
    )


class WhatIfSerializer(InputSerializer):
    pool = serializers.IntegerField(help_text="Id of a pool of this capacity set.")
    gpus = serializers.IntegerField(
        help_text="How many more GPUs the pool asks for: a whole number of blocks."
    )
    block_gpus = serializers.IntegerField(
        help_text="In blocks of: 1 on PCIe; 1, 2, 4 or 8 on NVSwitch (one partition each)."
    )
    at = serializers.DateTimeField(
        required=False,
        help_text=(
            "Ask about this instant (ISO 8601; without a zone, UTC): today's fleet with the "
            "policy the set's schedule and overrides put in force then. Default: now."
        ),
    )


def _validated(serializer_class, data) -> dict:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


# --- plans ------------------------------------------------------------------------------------


def _plan_detail(plan_id: int) -> dict:
    try:
        return PlanDetailSerializer(selectors.plan_with_actions(plan_id=plan_id)).data
    except Plan.DoesNotExist:
        raise exceptions.NotFound(f"no plan {plan_id}") from None


@extend_schema_view(
    list=extend_schema(summary="Plans, newest first"),
    retrieve=extend_schema(responses=PlanDetailSerializer, summary="One plan with its actions"),
)
class PlanViewSet(viewsets.ReadOnlyModelViewSet):
    """The arbiter's stored plans: what it proposed for a capacity set at one generation, and
    what became of it (proposed, applied, superseded, refused)."""

    schema = AutoSchema()
    permission_classes = [IsOperator]
    serializer_class = PlanSerializer
    filterset_class = PlanFilter
    lookup_value_regex = r"\d+"

    def get_queryset(self):
        return selectors.plans_list()

    def retrieve(self, request, *args, **kwargs):
        return Response(_plan_detail(int(kwargs["pk"])))

    @extend_schema(
        request=None,
        responses={
            200: PlanDetailSerializer,
            409: OpenApiResponse(
                StalePlanErrorSerializer,
                description="Refused, nothing done. `stale_plan`: the set changed since the "
                "plan was made; `fresh_plan` is the plan of the set as it is now and `changes` "
                "says what differs. `plan_already_applied`: it was applied before.",
            ),
        },
    )
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        """Apply exactly this plan, once: notices to its victims, placements on free GPUs at
        once and on freed GPUs when the victims are off."""
        plan = selectors.plans_list().filter(pk=int(pk)).first()
        if plan is None:
            raise exceptions.NotFound(f"no plan {pk}")
        try:
            services.plan_approve(plan=plan, actor=request.user)
        except services.StalePlan as stale:
            return self._stale(plan, stale)
        return Response(_plan_detail(plan.pk))

    def _stale(self, plan: Plan, stale: services.StalePlan) -> Response:
        fresh = stale.fresh
        if fresh is None:
            # The set moved on while the approval was being applied: plan it as it is now.
            fresh = services.plan_make(
                capacity_set=plan.capacity_set, trigger=Plan.Trigger.APPROVAL
            )
        body = error_body(stale.code, stale.message)
        body["fresh_plan"] = _plan_detail(fresh.pk)
        body["changes"] = services.plan_changes(plan, fresh)
        return Response(body, status=status.HTTP_409_CONFLICT)


# --- capacity set commands --------------------------------------------------------------------


def _capacity_set(capacity_set_id: int) -> CapacitySet:
    capacity_set = CapacitySet.objects.filter(pk=capacity_set_id).first()
    if capacity_set is None:
        raise exceptions.NotFound(f"no capacity set {capacity_set_id}")
    return capacity_set


class CapacitySetPlanView(OperatorCommand):
    @extend_schema(responses=PlanDetailSerializer, operation_id="capacity_sets_plan_retrieve")
    def get(self, request, id: int):
        """The set's latest plan with its actions. 404 (`no_plan`) before its first plan."""
        capacity_set = _capacity_set(id)
        latest = selectors.latest_plan(capacity_set=capacity_set)
        if latest is None:
            raise exceptions.NotFound(
                f"capacity set {capacity_set.name} has no plan yet", code="no_plan"
            )
        return Response(_plan_detail(latest.pk))


class CapacitySetModeView(OperatorCommand):
    @extend_schema(
        request=CapacitySetModeSerializer,
        responses=CapacitySetModeResultSerializer,
        operation_id="capacity_sets_mode_create",
    )
    def post(self, request, id: int):
        """Switch the set between dry_run and enforce (audited). Under enforce every new plan
        is applied as soon as it is made, the current proposal first; back in dry_run nothing
        new is done and notices already sent keep their deadlines."""
        capacity_set = _capacity_set(id)
        data = _validated(CapacitySetModeSerializer, request.data)
        capacity_set = services.capacity_set_set_mode(
            capacity_set=capacity_set, mode=data["mode"], actor=request.user
        )
        body = {"id": capacity_set.pk, "name": capacity_set.name, "mode": capacity_set.mode}
        body["plan"] = body["notifies"] = None
        if capacity_set.mode == CapacitySet.Mode.ENFORCE:
            latest = selectors.latest_plan(capacity_set=capacity_set)
            proposal = latest if latest and latest.status == Plan.Status.PROPOSED else None
            body["plan"] = proposal.pk if proposal else None
            body["notifies"] = proposal.preemptions if proposal else 0
        return Response(CapacitySetModeResultSerializer(body).data)


class CapacitySetWhatIfView(OperatorCommand):
    @extend_schema(
        request=WhatIfSerializer,
        responses=WhatIfPreviewSerializer,
        operation_id="capacity_sets_what_if_create",
    )
    def post(self, request, id: int):
        """Preview the set's plan if `pool` asked for `gpus` more GPUs in blocks of
        `block_gpus` (all or nothing): what would be served and which VMs would get notices.
        Nothing is stored or changed."""
        capacity_set = _capacity_set(id)
        data = _validated(WhatIfSerializer, request.data)
        what_if = services.plan_what_if(
            capacity_set=capacity_set,
            pool=Pool.objects.filter(pk=data["pool"]).first(),  # the service names a bad one
            gpus=data["gpus"],
            block_gpus=data["block_gpus"],
            at=data.get("at"),
        )
        return Response(WhatIfPreviewSerializer(what_if).data)
