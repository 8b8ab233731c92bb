"""REST API for inference: ``/api/deployments/`` and ``/api/api-keys/``, and a capacity set's
load profile recorded from the router's counters (``/api/capacity-sets/<id>/load-profile/``,
operators only).

Tenant-scoped like the VM API: a member lists and acts on their own tenants' deployments and
keys, and another tenant's id answers 404 as if it did not exist; operators see everything.
Every change goes through ``gpucap.inference.services``; the serializers here check only a
request's shape. A deployment shows its current replicas and the router's live queue (read
from Redis, one round trip per page). An API key's secret is in the answer to its creation and
nowhere else, ever: lists and reads show only its prefix.
"""

import redis
from django.conf import settings
from django.db.models import Prefetch
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from gpucap.api.base import InputSerializer, OperatorCommand, ServiceWrites
from gpucap.fleet.models import CapacitySet, Pool
from gpucap.inference import cache, load_profile, selectors, services
from gpucap.inference.filters import ApiKeyFilter, InferenceDeploymentFilter
from gpucap.inference.models import ApiKey, InferenceDeployment, Readiness, replica_routable
from gpucap.rentals.models import VirtualMachine
from gpucap.roles import is_operator, tenant_change_check, tenant_ids_for
from gpucap.tenancy.models import Tenant

# (queued, in flight, in flight per replica id) as ``cache.load`` gives it; None when the
# router's Redis cannot be read (the API still answers, without live figures).
Load = tuple[int, int, dict[str, int]] | None

# --- read -------------------------------------------------------------------------------------


class ReplicaReadinessSerializer(serializers.Serializer):
    status = serializers.ChoiceField(
        choices=Readiness.choices,
        allow_null=True,
        help_text="waiting (no probe answered or failed since it started), ready (the router "
        "sends it requests) or not_ready (its probes failed); null while the replica is not "
        "running.",
    )
    label = serializers.CharField(
        help_text="In words: 'waiting for first probe', 'ready', 'not ready: <last error>'; "
        "empty while the replica is not running."
    )
    last_probe_at = serializers.DateTimeField(allow_null=True)
    consecutive_failures = serializers.IntegerField(
        help_text="Failed probes since the last one that answered."
    )
    last_error = serializers.CharField(help_text="Why the last probe failed; empty if it answered.")


class DeploymentReplicaSerializer(serializers.ModelSerializer):
    instance_id = serializers.CharField(read_only=True, help_text="The VM's id, e.g. vm-42.")
    # A plain string: the VM state enum is documented once, on the VM.
    state = serializers.CharField(
        read_only=True,
        help_text="The replica VM's state: pending, provisioning, running (serving), notified, "
        "stopping, stopped or failed. Only running replicas whose readiness probe answered "
        "get requests (see readiness).",
    )
    node = serializers.CharField(
        source="node.hostname",
        read_only=True,
        allow_null=True,
        default=None,
        help_text="Hostname of the node the replica runs (or last ran) on; null while pending.",
    )
    endpoint_url = serializers.SerializerMethodField(
        help_text="Where its model server listens; null until the driver reports it."
    )
    in_flight = serializers.SerializerMethodField(
        help_text="Requests the router has sent it that are not answered yet; null when the "
        "router's counters cannot be read."
    )
    readiness = serializers.SerializerMethodField(
        help_text="What its readiness probe found: the router sends requests only to running "
        "replicas whose probe answered, and stops after failed probes."
    )

    class Meta:
        model = VirtualMachine
        fields = [
            "id",
            "instance_id",
            "state",
            "node",
            "gpu_count",
            "endpoint_url",
            "started_at",
            "readiness",
            "in_flight",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.URLField(allow_null=True))
    def get_endpoint_url(self, vm: VirtualMachine) -> str | None:
        return vm.endpoint_url or None

    @extend_schema_field(ReplicaReadinessSerializer)
    def get_readiness(self, vm: VirtualMachine) -> dict:
        readiness = selectors.replica_readiness(vm)
        return ReplicaReadinessSerializer(
            {
                "status": readiness.status,
                "label": readiness.label,
                "last_probe_at": readiness.last_probe_at,
                "consecutive_failures": readiness.consecutive_failures,
                "last_error": readiness.last_error,
            }
        ).data

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_in_flight(self, vm: VirtualMachine) -> int | None:
        per_replica = self.context.get("per_replica")
        return None if per_replica is None else per_replica.get(vm.instance_id, 0)


class DeploymentSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    pool_name = serializers.CharField(source="pool.name", read_only=True)
    base_url = serializers.SerializerMethodField(
        help_text="The router's OpenAI-compatible base URL for this deployment (the `base_url` "
        "of an OpenAI client; authenticate with an API key of the deployment's tenant)."
    )
    replicas = serializers.SerializerMethodField(
        help_text="Replica VMs that are not terminated, oldest first."
    )
    min_replicas_in_force = serializers.IntegerField(
        read_only=True,
        help_text="The range's lower bound now: min_replicas, unless the capacity set's schedule "
        "or an override holds another (range_from_schedule).",
    )
    max_replicas_in_force = serializers.IntegerField(
        read_only=True,
        help_text="The range's upper bound now: max_replicas, unless the capacity set's schedule "
        "or an override holds another (range_from_schedule).",
    )
    range_from_schedule = serializers.BooleanField(
        read_only=True,
        help_text="True while the capacity set's schedule or an override holds the range in "
        "force instead of the deployment's own min_replicas..max_replicas.",
    )
    ready_replicas = serializers.SerializerMethodField(
        help_text="Replicas the router sends requests to: running, and their readiness probe "
        "answered."
    )
    queued = serializers.SerializerMethodField(
        help_text="Requests waiting at the router for a free replica now; null when the "
        "router's counters cannot be read."
    )
    in_flight = serializers.SerializerMethodField(
        help_text="Requests being answered by replicas now; null when the router's counters "
        "cannot be read."
    )

    class Meta:
        model = InferenceDeployment
        fields = [
            "id",
            "tenant",
            "pool",
            "pool_name",
            "name",
            "slug",
            "model_name",
            "image",
            "base_url",
            "gpus_per_replica",
            "min_replicas",
            "max_replicas",
            "min_replicas_in_force",
            "max_replicas_in_force",
            "range_from_schedule",
            "target_in_flight",
            "replica_concurrency",
            "queue_limit",
            "scale_down_cooldown_seconds",
            "cold_start_timeout_seconds",
            "replicas",
            "ready_replicas",
            "queued",
            "in_flight",
            "last_scaled_at",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_base_url(self, deployment: InferenceDeployment) -> str:
        path = f"/inference/{deployment.slug}/v1"
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request is not None else path

    @extend_schema_field(DeploymentReplicaSerializer(many=True))
    def get_replicas(self, deployment: InferenceDeployment) -> list[dict]:
        load = self._load(deployment)
        context = {**self.context, "per_replica": None if load is None else load[2]}
        return DeploymentReplicaSerializer(
            deployment.current_replicas, many=True, context=context
        ).data

    def get_ready_replicas(self, deployment: InferenceDeployment) -> int:
        return sum(replica_routable(vm) for vm in deployment.current_replicas)

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_queued(self, deployment: InferenceDeployment) -> int | None:
        load = self._load(deployment)
        return None if load is None else load[0]

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_in_flight(self, deployment: InferenceDeployment) -> int | None:
        load = self._load(deployment)
        return None if load is None else load[1]

    def _load(self, deployment: InferenceDeployment) -> Load:
        """The router's counters for the deployment: from the list's one batched read, or
        (one deployment) read now."""
        loads = self.context.setdefault("loads", {})
        if deployment.slug not in loads:
            try:
                loads[deployment.slug] = cache.load(deployment.slug)
            except redis.RedisError:
                loads[deployment.slug] = None
        return loads[deployment.slug]


class ApiKeySerializer(serializers.ModelSerializer):
    """An API key as every read shows it: its prefix, never its secret, salt or digest."""

    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    deployment = serializers.PrimaryKeyRelatedField(
        read_only=True,
        allow_null=True,
        help_text="The one deployment the key opens; null: every deployment of its tenant.",
    )
    deployment_slug = serializers.CharField(
        source="deployment.slug", read_only=True, allow_null=True, default=None
    )
    prefix = serializers.CharField(
        read_only=True,
        help_text="The visible part of the key: a key reads gpk_<prefix>_<secret>.",
    )
    status = serializers.SerializerMethodField(help_text="active, expired or revoked.")
    created_by = serializers.CharField(
        source="created_by.username", read_only=True, allow_null=True, default=None
    )

    class Meta:
        model = ApiKey
        fields = [
            "id",
            "tenant",
            "deployment",
            "deployment_slug",
            "name",
            "prefix",
            "status",
            "created_by",
            "created_at",
            "expires_at",
            "revoked_at",
            "last_used_at",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.CharField())
    def get_status(self, api_key: ApiKey) -> str:
        if api_key.revoked_at is not None:
            return "revoked"
        if api_key.expires_at is not None and api_key.expires_at <= timezone.now():
            return "expired"
        return "active"


class ApiKeyCreatedSerializer(ApiKeySerializer):
    """The answer to creating a key: the only place its secret ever appears."""

    key = serializers.CharField(
        read_only=True,
        help_text="The whole key (gpk_<prefix>_<secret>). Shown this once and stored nowhere: "
        "copy it now. Send it as `Authorization: Bearer <key>` to the router.",
    )

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "key"]
        read_only_fields = fields


# --- input shapes -----------------------------------------------------------------------------

_FIXED = "cannot be changed once a deployment exists; create a new deployment instead"
_SETTINGS_HELP = {
    "min_replicas": "Replicas kept at all times (0 lets a quiet deployment scale to none); "
    "at most max_replicas.",
    "max_replicas": "The most replicas the autoscaler (or the arbiter) may run.",
    "target_in_flight": "Requests in flight per replica the autoscaler aims at.",
    "replica_concurrency": "Requests one replica is sent at once (at least target_in_flight); "
    "more wait in the router's queue.",
    "queue_limit": "Requests that may wait for a replica; beyond it the router answers 429.",
    "scale_down_cooldown_seconds": "How long fewer replicas must do before one is removed.",
    "cold_start_timeout_seconds": "How long a request waits for a replica to start when none is "
    "ready (1-3600 s); past it the router answers 503 with Retry-After.",
}


def _setting(name: str) -> serializers.IntegerField:
    """An optional whole-number setting; its range is the service's rule (and its reason)."""
    return serializers.IntegerField(required=False, help_text=_SETTINGS_HELP[name])


def _tenant_field(what: str) -> serializers.SlugRelatedField:
    return serializers.SlugRelatedField(
        slug_field="slug",
        queryset=Tenant.objects.none(),
        required=False,
        help_text="Slug of the tenant it is for. Needed only when you are a member of several "
        "tenants.",
        error_messages={"does_not_exist": f"no tenant {{value}} that you may {what} for"},
    )


class TenantScopedInput(InputSerializer):
    """Input whose ``tenant`` (and other related ids) may only name what the user may act on."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None:
            self.scope(request.user)

    def scope(self, user) -> None:
        tenants = Tenant.objects.all()
        if not is_operator(user):
            tenants = tenants.filter(pk__in=tenant_ids_for(user))
        self.fields["tenant"].queryset = tenants


class DeploymentCreateSerializer(TenantScopedInput):
    """A new deployment. Which pools a tenant may use, which GPU counts a pool's fabric allows
    and the settings' ranges are the service's rules; its reasons come back naming the field."""

    hints = {
        "slug": "is chosen by gpucap: <tenant>-<name>",
        "replicas": "replicas follow min_replicas..max_replicas and the router's queue",
    }

    tenant = _tenant_field("deploy")
    pool = serializers.PrimaryKeyRelatedField(
        queryset=Pool.objects.none(),
        help_text="Id of an inference pool your tenant may use (GET /api/pools/?kind=inference).",
        error_messages={"does_not_exist": "no pool {pk_value} that your tenant may use"},
    )
    name = serializers.CharField(
        max_length=63,
        help_text="1-63 lowercase letters, digits or hyphens; unique per tenant. The router "
        "path is /inference/<tenant>-<name>/v1/.",
    )
    model_name = serializers.CharField(
        max_length=200, help_text="The model id clients ask for, e.g. meta-llama/Llama-3.1-8B."
    )
    gpus_per_replica = serializers.IntegerField(
        help_text="PCIe pools: 1. NVSwitch pools: 1, 2, 4 or 8 (one whole NVLink partition)."
    )
    image = serializers.CharField(
        max_length=64,
        required=False,
        help_text="A replica image of the pool's cluster (GET /api/images/?pool=<id>, one with "
        "ports), e.g. vllm-0.6-openai. Default: gpucap-model-server.",
    )
    min_replicas = _setting("min_replicas")
    max_replicas = _setting("max_replicas")
    target_in_flight = _setting("target_in_flight")
    replica_concurrency = _setting("replica_concurrency")
    queue_limit = _setting("queue_limit")
    scale_down_cooldown_seconds = _setting("scale_down_cooldown_seconds")
    cold_start_timeout_seconds = _setting("cold_start_timeout_seconds")

    def scope(self, user) -> None:
        super().scope(user)
        pools = Pool.objects.all()
        if not is_operator(user):
            pools = pools.filter(tenants__in=tenant_ids_for(user)).distinct()
        self.fields["pool"].queryset = pools


class DeploymentUpdateSerializer(InputSerializer):
    """The settings a deployment may change. Its pool, model, name and replica size are fixed."""

    hints = dict.fromkeys(
        ["tenant", "pool", "name", "slug", "model_name", "image", "gpus_per_replica"], _FIXED
    )

    min_replicas = _setting("min_replicas")
    max_replicas = _setting("max_replicas")
    target_in_flight = _setting("target_in_flight")
    replica_concurrency = _setting("replica_concurrency")
    queue_limit = _setting("queue_limit")
    scale_down_cooldown_seconds = _setting("scale_down_cooldown_seconds")
    cold_start_timeout_seconds = _setting("cold_start_timeout_seconds")


class ApiKeyCreateSerializer(TenantScopedInput):
    hints = {
        "key": "is generated by gpucap and shown once, in the answer",
        "prefix": "is generated by gpucap and shown once, in the answer",
        "revoked_at": "revoke a key with POST /api/api-keys/<id>/revoke/",
    }

    tenant = _tenant_field("create API keys")
    name = serializers.CharField(
        max_length=100, help_text="What the key is for, e.g. 'production chatbot'."
    )
    deployment = serializers.PrimaryKeyRelatedField(
        queryset=InferenceDeployment.objects.none(),
        required=False,
        allow_null=True,
        help_text="Id of the one deployment the key opens; null or left out: every deployment "
        "of the tenant, present and future. Names the tenant when `tenant` is left out.",
        error_messages={"does_not_exist": "no deployment {pk_value} of your tenants"},
    )
    expires_at = serializers.DateTimeField(
        required=False,
        allow_null=True,
        help_text="When the key stops working (ISO 8601, in the future); null: never.",
    )

    def scope(self, user) -> None:
        super().scope(user)
        deployments = InferenceDeployment.objects.select_related("tenant")
        if not is_operator(user):
            deployments = deployments.filter(tenant_id__in=tenant_ids_for(user))
        self.fields["deployment"].queryset = deployments


# --- the viewsets -----------------------------------------------------------------------------


def _only_tenant(user, what: str) -> Tenant:
    """The tenant a request that names none is for: the member's only tenant."""
    if is_operator(user):
        raise ValidationError({"tenant": [f"operators must name the tenant {what}"]})
    tenants = list(Tenant.objects.filter(pk__in=tenant_ids_for(user)))
    if len(tenants) == 1:
        return tenants[0]
    if not tenants:
        raise ValidationError({"tenant": ["you are not a member of any tenant"]})
    slugs = ", ".join(sorted(t.slug for t in tenants))
    raise ValidationError({"tenant": [f"you are a member of several tenants ({slugs}); name one"]})


def _router_loads(slugs: list[str]) -> dict[str, Load]:
    """``cache.loads``, or no figures (None) when the router's Redis does not answer: the API
    still shows the deployments."""
    if not slugs:
        return {}
    try:
        return cache.loads(slugs)
    except redis.RedisError:
        return dict.fromkeys(slugs, None)


def deployments_visible_to(user):
    """Deployments with tenant, pool and their current replicas (and each replica's node and
    readiness probe): three queries (rows, replicas, nothing per row)."""
    current = (
        VirtualMachine.objects.exclude(state=VirtualMachine.State.TERMINATED)
        .select_related("node", "probe")
        .order_by("pk")
    )
    deployments = InferenceDeployment.objects.select_related("tenant", "pool").prefetch_related(
        Prefetch("replicas", queryset=current, to_attr="current_replicas")
    )
    if is_operator(user):
        return deployments
    return deployments.filter(tenant_id__in=tenant_ids_for(user))


@extend_schema_view(
    create=extend_schema(
        request=DeploymentCreateSerializer,
        responses={201: DeploymentSerializer},
        description="Deploy a model in an inference pool. Its min_replicas replicas are asked "
        "for at once, as one group (placed all or none).",
    ),
    partial_update=extend_schema(
        request=DeploymentUpdateSerializer,
        responses=DeploymentSerializer,
        description="Change the replica range or the router and autoscaler settings. Replicas "
        "outside the new range are asked for or stopped at once; within it they follow the "
        "queue.",
    ),
)
class InferenceDeploymentViewSet(
    ServiceWrites,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Inference deployments: a member's own tenants'; every deployment for operators.
    Deleting a deployment is not supported yet (405)."""

    serializer_class = DeploymentSerializer
    filterset_class = InferenceDeploymentFilter

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return InferenceDeployment.objects.none()
        return deployments_visible_to(self.request.user).order_by("tenant__slug", "name", "id")

    def list(self, request, *args, **kwargs):
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        rows = list(page if page is not None else queryset)
        context = {
            **self.get_serializer_context(),
            "loads": _router_loads([deployment.slug for deployment in rows]),
        }
        data = DeploymentSerializer(rows, many=True, context=context).data
        return self.get_paginated_response(data) if page is not None else Response(data)

    def create(self, request, *args, **kwargs):
        data = self.validated(DeploymentCreateSerializer, request.data)
        tenant = data.pop("tenant", None) or _only_tenant(request.user, "to deploy for")
        tenant_change_check(request.user, tenant.pk)
        deployment = services.deployment_create(tenant=tenant, actor=request.user, **data)
        return Response(self.read(deployment), status=status.HTTP_201_CREATED)

    def partial_update(self, request, *args, **kwargs):
        deployment = self.get_object()
        tenant_change_check(request.user, deployment.tenant_id)
        data = self.validated(DeploymentUpdateSerializer, request.data)
        services.deployment_update(deployment=deployment, actor=request.user, **data)
        return Response(self.read(deployment))


@extend_schema_view(
    create=extend_schema(
        request=ApiKeyCreateSerializer,
        responses={201: ApiKeyCreatedSerializer},
        description="Create an API key for one deployment or every deployment of a tenant. "
        "The answer carries the whole key in `key`, this once: it is stored only as a prefix "
        "and a salted hash and can never be shown again.",
    ),
)
class ApiKeyViewSet(
    ServiceWrites,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """API keys of inference deployments: a member's own tenants'; every key for operators.
    Reads show a key's prefix, never its secret."""

    serializer_class = ApiKeySerializer
    filterset_class = ApiKeyFilter

    def get_queryset(self):
        keys = ApiKey.objects.select_related("tenant", "deployment", "created_by")
        if getattr(self, "swagger_fake_view", False) or is_operator(self.request.user):
            return keys
        return keys.filter(tenant_id__in=tenant_ids_for(self.request.user))

    def create(self, request, *args, **kwargs):
        data = self.validated(ApiKeyCreateSerializer, request.data)
        deployment = data.get("deployment")
        tenant = (
            data.pop("tenant", None)
            or (deployment.tenant if deployment is not None else None)
            or _only_tenant(request.user, "the key is for")
        )
        tenant_change_check(request.user, tenant.pk)
        api_key, secret = services.api_key_create(tenant=tenant, actor=request.user, **data)
        shown = self.get_queryset().get(pk=api_key.pk)
        shown.key = secret
        response = Response(
            ApiKeyCreatedSerializer(shown, context=self.get_serializer_context()).data,
            status=status.HTTP_201_CREATED,
        )
        # The one answer that carries a secret: no cache along the way may keep it.
        response["Cache-Control"] = "no-store"
        return response

    @extend_schema(request=None, responses={200: ApiKeySerializer})
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        """Revoke the key: the router refuses it from now on. Revoking a revoked key changes
        nothing."""
        api_key = self.get_object()
        tenant_change_check(request.user, api_key.tenant_id)
        api_key = services.api_key_revoke(api_key=api_key, actor=request.user)
        return Response(self.read(api_key))


# --- recorded load profile --------------------------------------------------------------------


class LoadProfileQuerySerializer(InputSerializer):
    days = serializers.IntegerField(
        min_value=1,
        help_text="How many days before now to record from: 1 to LOAD_HISTORY_DAYS (30 unless "
        "set otherwise), the days the history keeps.",
    )
    fold = serializers.ChoiceField(
        choices=load_profile.FOLDS,
        default="day",
        help_text="day: folded into one day by time of day (10-minute buckets, the mean over "
        "the days), starting at now's time of day; replay: the days as they were, time 0 being "
        "now minus `days`.",
    )

    def validate_days(self, days: int) -> int:
        if days > settings.LOAD_HISTORY_DAYS:
            raise ValidationError(
                f"must be {settings.LOAD_HISTORY_DAYS} or less: the history keeps "
                f"{settings.LOAD_HISTORY_DAYS} days (LOAD_HISTORY_DAYS)"
            )
        return days


class LoadProfileSerializer(serializers.Serializer):
    deployments = serializers.DictField(
        child=serializers.DictField(),
        help_text="Per deployment slug: {shape, points: [[seconds_from_start, requests/s]], "
        "service_seconds}.",
    )
    pools = serializers.DictField(
        child=serializers.DictField(),
        help_text="Per spot or on-demand pool name: {shape, points: [[seconds_from_start, "
        "VMs/hour]], gpus_per_vm, duration_seconds, tenant}.",
    )
    notes = serializers.ListField(
        child=serializers.CharField(),
        help_text="What was missing or assumed, one sentence each (the simulator ignores them).",
    )


class CapacitySetLoadProfileView(OperatorCommand):
    @extend_schema(
        parameters=[LoadProfileQuerySerializer],
        responses=LoadProfileSerializer,
        operation_id="capacity_sets_load_profile_retrieve",
    )
    def get(self, request, id: int):
        """A load profile of the set recorded from what really happened: its deployments'
        requests per second from the router's own counters (kept by the minute), its spot and
        on-demand pools' VM requests from their rentals, over the last `days` days. The JSON
        form `POST .../simulate/` and `manage.py simulate` read. Nothing is changed."""
        capacity_set = CapacitySet.objects.filter(pk=id).first()
        if capacity_set is None:
            raise NotFound(f"no capacity set {id}")
        query = LoadProfileQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        profile = load_profile.recorded_profile(
            capacity_set,
            days=query.validated_data["days"],
            now=timezone.now(),
            fold=query.validated_data["fold"],
        )
        return Response(profile)
