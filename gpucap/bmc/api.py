"""REST API of the BMCs (docs/bmc.md). Operators only.

- ``POST /api/bmc/discoveries/`` with ``{"entries": [...]}`` (the YAML entries of
  ``bmc_discover``, ``password`` instead of ``password_env``): 202 with the run, ``reading``; a
  worker reads the BMCs. ``GET /api/bmc/discoveries/`` lists runs, newest first.
- ``GET /api/bmc/discoveries/{id}/``: poll it until ``previewed`` (the change lines and their
  digest) or ``failed`` (the problems, each naming the node or the address).
- ``POST /api/bmc/discoveries/{id}/apply/``: 202, ``applying``; the worker reads the BMCs again
  and applies only the previewed changes. The run ends ``applied``, or ``refused`` with
  ``fresh_run``, the preview of what the BMCs say now (apply that one), or ``failed``.
  Applying a run that is not a preview is a 409; a refused one's 409 carries ``fresh_run``; a
  preview older than ``BMC_DISCOVERY_PREVIEW_TTL_SECONDS`` has expired (409 ``expired``).
- ``GET``/``PUT``/``DELETE /api/nodes/{id}/bmc/``: the node's BMC credentials. The password is
  write-only: an answer says ``password_set`` and when it was set, never the password.

The input serializers check shapes; what values mean (a cluster that exists, an address a BMC
can have) is for the services (`gpucap.bmc.discovery_runs`, `gpucap.bmc.services`) to say.
"""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, generics, serializers, status
from rest_framework.response import Response

from gpucap.api.base import InputSerializer, OperatorCommand, choice_field
from gpucap.api.errors import ApiErrorBodySerializer, error_body
from gpucap.api.permissions import IsOperator
from gpucap.api.schema import AutoSchema
from gpucap.bmc import discovery_runs, services
from gpucap.bmc.models import BmcCredential, DiscoveryRun
from gpucap.errors import Conflict
from gpucap.fleet.models import Fabric, Node

State = DiscoveryRun.State
SYSTEM_ID_RULE = "must be a Redfish id: letters, digits, '.', '_' and '-' (at most 64)"

# --- discoveries ---------------------------------------------------------------------------------


def _system_id_field() -> serializers.RegexField:
    """The Redfish ComputerSystem id a discovery entry and a node's credentials take."""
    return serializers.RegexField(
        r"^[A-Za-z0-9._-]*$",
        max_length=64,
        required=False,
        allow_blank=True,
        default="",
        error_messages={"invalid": SYSTEM_ID_RULE},
        help_text="The Redfish ComputerSystem id; empty: the BMC's only one.",
    )


class DiscoveryEntrySerializer(InputSerializer):
    cluster = serializers.CharField(
        max_length=253, help_text="The cluster the node is in, or is to be created in."
    )
    address = serializers.CharField(
        max_length=253,
        help_text="The BMC: a host or address (HTTPS), or an https:// or http:// URL.",
    )
    username = serializers.CharField(max_length=128)
    password = serializers.CharField(
        max_length=256,
        write_only=True,
        trim_whitespace=False,
        help_text="Sealed while the run waits to be applied, dropped when it ends; never shown.",
    )
    verify_tls = serializers.BooleanField(default=True)
    hostname = serializers.CharField(
        max_length=253,
        required=False,
        allow_blank=True,
        default="",
        help_text="Empty: the system's HostName (its first label).",
    )
    gpu_model = serializers.CharField(
        max_length=64,
        required=False,
        allow_blank=True,
        default="",
        help_text="A new node's; empty: the BMC's GPU model string.",
    )
    fabric = choice_field(
        Fabric.choices,
        required=False,
        allow_blank=True,
        default="",
        help_text="Required for a new node: the BMC does not tell.",
    )
    system_id = _system_id_field()


class DiscoveryRequestSerializer(InputSerializer):
    # How many (at least one, at most MAX_ENTRIES) is the service's to say.
    entries = DiscoveryEntrySerializer(
        many=True, help_text=f"One per BMC, 1 to {discovery_runs.MAX_ENTRIES}."
    )


class DiscoveryStoredEntrySerializer(serializers.Serializer):
    """An entry as the run keeps it: no password."""

    cluster = serializers.CharField()
    address = serializers.CharField()
    username = serializers.CharField()
    verify_tls = serializers.BooleanField()
    hostname = serializers.CharField(allow_blank=True)
    gpu_model = serializers.CharField(allow_blank=True)
    fabric = serializers.CharField(allow_blank=True)
    system_id = serializers.CharField(allow_blank=True)
    node = serializers.IntegerField(
        required=False, help_text="A node's Rediscover: read with the node's stored credentials."
    )


class DiscoveryChangeSerializer(serializers.Serializer):
    verb = serializers.CharField(help_text="create or update")
    noun = serializers.CharField()
    label = serializers.CharField(help_text="cluster/hostname")
    detail = serializers.CharField()


class DiscoveryPreviewSerializer(serializers.ModelSerializer):
    requested_by = serializers.SerializerMethodField()
    applied_by = serializers.SerializerMethodField()
    entries = DiscoveryStoredEntrySerializer(many=True)
    changes = DiscoveryChangeSerializer(many=True)
    lines = serializers.SerializerMethodField(
        help_text="One per change, in fleet_apply's words (\"would create node east/h100-001: "
        '...", "update node ..." once applied).'
    )
    summary = serializers.SerializerMethodField()
    problems = serializers.ListField(
        child=serializers.CharField(), help_text="failed: each names the node or the address."
    )
    digest = serializers.CharField(help_text="SHA-256 of the previewed changes; empty until read.")
    message = serializers.SerializerMethodField(help_text="What the state means, and what next.")

    class Meta:
        model = DiscoveryRun
        fields = [
            "id",
            "state",
            "node",
            "requested_by",
            "applied_by",
            "entries",
            "changes",
            "lines",
            "summary",
            "unchanged",
            "problems",
            "digest",
            "message",
            "created_at",
            "read_at",
            "apply_requested_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_requested_by(self, run: DiscoveryRun) -> str | None:
        return run.requested_by.get_username() if run.requested_by else None

    def get_applied_by(self, run: DiscoveryRun) -> str | None:
        return run.applied_by.get_username() if run.applied_by else None

    def get_lines(self, run: DiscoveryRun) -> list[str]:
        return discovery_runs.run_result(run).lines()

    def get_summary(self, run: DiscoveryRun) -> str:
        if run.state in (State.PREVIEWED, State.APPLYING, State.APPLIED):
            return discovery_runs.run_result(run).summary()
        return ""

    def get_message(self, run: DiscoveryRun) -> str:
        return run_message(run)


class DiscoveryRunSerializer(DiscoveryPreviewSerializer):
    fresh_run = DiscoveryPreviewSerializer(
        allow_null=True,
        help_text="refused: the preview of what the BMCs said at the apply; apply its id.",
    )

    class Meta(DiscoveryPreviewSerializer.Meta):
        fields = [*DiscoveryPreviewSerializer.Meta.fields, "fresh_run"]
        read_only_fields = fields


class StaleDiscoveryErrorSerializer(serializers.Serializer):
    """A refused apply: the one error shape, plus (for `stale_preview`) the fresh preview."""

    error = ApiErrorBodySerializer()
    fresh_run = DiscoveryPreviewSerializer(
        required=False, help_text="stale_preview only: the fresh preview; apply its id."
    )


def run_message(run: DiscoveryRun) -> str:
    count = len(run.entries)
    bmcs = f"{count} BMC{'' if count == 1 else 's'}"
    if run.state == State.READING:
        return f"reading {bmcs}; poll this run until it is previewed"
    if run.state == State.PREVIEWED:
        if not run.changes:
            return "nothing to change"
        return f"preview ready: POST /api/bmc/discoveries/{run.pk}/apply/ to apply it"
    if run.state == State.APPLYING:
        return f"reading {bmcs} again: the changes are applied if they are still the previewed ones"
    if run.state == State.APPLIED:
        return discovery_runs.run_result(run).summary()
    if run.state == State.FAILED:
        count = len(run.problems)
        return f"{count} problem{'' if count == 1 else 's'}, nothing applied"
    return discovery_runs.not_appliable(run).message


def _runs():
    return DiscoveryRun.objects.select_related(
        "requested_by",
        "applied_by",
        "fresh_run",
        "fresh_run__requested_by",
        "fresh_run__applied_by",
    ).order_by("-created_at", "-id")


def _run(run_id: int) -> DiscoveryRun:
    run = _runs().filter(pk=run_id).first()
    if run is None:
        raise exceptions.NotFound(f"no discovery {run_id}")
    return run


class DiscoveriesView(generics.ListAPIView):
    schema = AutoSchema()
    permission_classes = [IsOperator]
    serializer_class = DiscoveryRunSerializer
    queryset = DiscoveryRun.objects.none()  # the schema's model

    def get_queryset(self):
        return _runs()

    @extend_schema(operation_id="bmc_discoveries_list")
    def get(self, request, *args, **kwargs):
        """Discoveries, newest first."""
        return super().get(request, *args, **kwargs)

    @extend_schema(
        request=DiscoveryRequestSerializer,
        responses={202: DiscoveryRunSerializer},
        operation_id="bmc_discoveries_create",
    )
    def post(self, request):
        """Discover the BMCs listed: 202 with the run, reading; a worker reads them and stores
        the preview. Bad input is a 400 naming ``entries[i].field``, and nothing is stored."""
        if isinstance(request.data, list):
            raise serializers.ValidationError(
                {"non_field_errors": ['send the list as an object: {"entries": [...]}']}
            )
        serializer = DiscoveryRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        entries = [dict(entry) for entry in serializer.validated_data["entries"]]
        run = discovery_runs.discovery_request(entries=entries, actor=request.user)
        return Response(DiscoveryRunSerializer(_run(run.pk)).data, status.HTTP_202_ACCEPTED)


class DiscoveryView(OperatorCommand):
    @extend_schema(responses=DiscoveryRunSerializer, operation_id="bmc_discoveries_retrieve")
    def get(self, request, id: int):
        """One discovery: its state, the change lines or the problems, and, refused, the
        fresh preview."""
        return Response(DiscoveryRunSerializer(_run(id)).data)


class DiscoveryApplyView(OperatorCommand):
    @extend_schema(
        request=None,
        responses={
            202: DiscoveryRunSerializer,
            409: OpenApiResponse(
                StaleDiscoveryErrorSerializer,
                description="Not a preview (any more); nothing done. `stale_preview`: the "
                "BMCs changed since the preview, which was refused; `fresh_run` is the "
                "preview of what they say now. `expired`: the preview was not applied within "
                "BMC_DISCOVERY_PREVIEW_TTL_SECONDS; discover again. Also `not_ready`, "
                "`applying`, `applied_already`, `failed`.",
            ),
        },
        operation_id="bmc_discoveries_apply",
    )
    def post(self, request, id: int):
        """Apply the preview: 202, applying. A worker reads every BMC again and applies the
        changes only if they are still the previewed ones; poll the run: ``applied``, or
        ``refused`` with ``fresh_run`` (the fleet changed since your preview: here is the
        fresh one), or ``failed`` with the problems."""
        run = _run(id)
        try:
            discovery_runs.discovery_apply_request(run=run, actor=request.user)
        except Conflict as conflict:
            body = error_body(conflict.code, conflict.message)
            run = _run(id)
            if run.fresh_run is not None:
                body["fresh_run"] = DiscoveryPreviewSerializer(run.fresh_run).data
            return Response(body, status.HTTP_409_CONFLICT)
        return Response(DiscoveryRunSerializer(_run(id)).data, status.HTTP_202_ACCEPTED)


# --- a node's credentials ------------------------------------------------------------------------


class BmcCredentialInputSerializer(InputSerializer):
    username = serializers.CharField(max_length=128)
    password = serializers.CharField(
        max_length=256,
        write_only=True,
        required=False,
        trim_whitespace=False,
        help_text="Write-only. Absent: keep the stored one (required the first time).",
    )
    verify_tls = serializers.BooleanField(
        default=True, help_text="Verify the BMC's certificate (absent: true)."
    )
    system_id = _system_id_field()


class BmcCredentialSerializer(serializers.Serializer):
    node = serializers.IntegerField()
    hostname = serializers.CharField()
    address = serializers.CharField(
        allow_blank=True, help_text="The node's bmc_address (PATCH /api/nodes/{id}/ sets it)."
    )
    username = serializers.CharField(allow_blank=True, help_text="Empty: no credentials.")
    password_set = serializers.BooleanField(help_text="The password itself is never shown.")
    verify_tls = serializers.BooleanField()
    system_id = serializers.CharField(allow_blank=True)
    updated_at = serializers.DateTimeField(allow_null=True)


def _credential(node: Node) -> dict:
    credential = BmcCredential.objects.filter(node=node).first()
    return BmcCredentialSerializer(
        {
            "node": node.pk,
            "hostname": node.hostname,
            "address": node.bmc_address,
            "username": credential.username if credential else "",
            "password_set": credential is not None,
            "verify_tls": credential.verify_tls if credential else True,
            "system_id": credential.system_id if credential else "",
            "updated_at": credential.updated_at if credential else None,
        }
    ).data


class NodeBmcView(OperatorCommand):
    @extend_schema(responses=BmcCredentialSerializer, operation_id="nodes_bmc_retrieve")
    def get(self, request, id: int):
        """How gpucap logs in to the node's BMC: the user, whether a password is set and
        when, whether TLS is verified. Never the password."""
        return Response(_credential(get_object_or_404(Node, pk=id)))

    @extend_schema(
        request=BmcCredentialInputSerializer,
        responses=BmcCredentialSerializer,
        operation_id="nodes_bmc_update",
    )
    def put(self, request, id: int):
        """Set the node's BMC credentials (audited, the password as "changed"). The node
        needs a BMC address first."""
        node = get_object_or_404(Node, pk=id)
        serializer = BmcCredentialInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        services.bmc_credential_set(
            node=node,
            username=data["username"],
            password=data.get("password"),
            verify_tls=data["verify_tls"],
            system_id=data["system_id"],
            actor=request.user,
        )
        return Response(_credential(node))

    @extend_schema(responses={204: None}, operation_id="nodes_bmc_destroy")
    def delete(self, request, id: int):
        """Forget the node's BMC credentials (audited); its address stays."""
        services.bmc_credential_delete(node=get_object_or_404(Node, pk=id), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
