"""REST API for GPU VMs: ``/api/vms/``.

Tenant-scoped: a member lists and acts on the VMs of their own tenants, and another tenant's VM
id answers 404 as if it did not exist; operators see every VM but change only through their
own commands (place, reclaim): request, stop, start and terminate are the tenant's members'
alone (403, ``gpucap.roles.tenant_change_check``). Creating a VM requests it
(``vm_request``), DELETE terminates it, and the commands stop, start and (operators only) place
it. Every change goes through ``gpucap.rentals.services``; the serializers here check only a
request's shape. Driver work happens later in Celery, so changes answer 202 with the VM as it
is now.
"""

from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from gpucap.api.base import InputSerializer, ServiceWrites
from gpucap.api.permissions import IsOperator
from gpucap.fleet.models import Node, Pool
from gpucap.rentals import jobs, selectors, services, waiting
from gpucap.rentals.filters import VirtualMachineFilter
from gpucap.rentals.models import VirtualMachine
from gpucap.roles import is_operator, tenant_change_check, tenant_ids_for
from gpucap.tenancy.models import Tenant

# --- read -------------------------------------------------------------------------------------


class WaitingSerializer(serializers.Serializer):
    reason = serializers.CharField()
    message = serializers.CharField()
    starts_by = serializers.DateTimeField(allow_null=True)


class VirtualMachineSerializer(serializers.ModelSerializer):
    instance_id = serializers.CharField(read_only=True, help_text="The id guests see, e.g. vm-42.")
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    pool_name = serializers.CharField(source="pool.name", read_only=True)
    # A plain string: the pool's kind enum is documented once, on the pool.
    pool_kind = serializers.CharField(
        source="pool.kind", read_only=True, help_text="on_demand, spot or inference"
    )
    gpu_model = serializers.CharField(source="pool.gpu_model", read_only=True)
    node_hostname = serializers.CharField(
        source="node.hostname", read_only=True, allow_null=True, default=None
    )
    gpus = serializers.SerializerMethodField(
        help_text="Indices of the GPUs of `node` the VM holds now; empty when it holds none."
    )
    ip_address = serializers.IPAddressField(
        read_only=True,
        allow_null=True,
        help_text="The guest's address: from its node's guest subnet as soon as it is placed, "
        "or as the node's driver reports it once it runs.",
    )
    ssh_command = serializers.SerializerMethodField(
        help_text="How to log in while the VM runs (e.g. `ssh root@10.200.0.18`); null otherwise."
    )

    # Declared so that "" (not stopping) is documented: a read-only model field loses blank.
    stop_reason = serializers.ChoiceField(
        choices=VirtualMachine.StopReason.choices,
        allow_blank=True,
        read_only=True,
        help_text="Why the VM is stopping; decides where it goes once stopped. Empty while it "
        "is not stopping.",
    )
    waiting = serializers.SerializerMethodField(
        help_text="Why a pending VM waits, null otherwise: `reason` (awaiting_approval, "
        "gpus_being_freed, starting, protected, no_capacity or standalone), `message` in words, "
        "and `starts_by`: when it should start at the latest while GPUs are being freed, or "
        "when the protection window it waits for ends."
    )
    at_risk = serializers.SerializerMethodField(
        help_text="Whether the capacity set's proposed plan (dry-run, or awaiting approval) "
        "would reclaim this VM: an early signal, before any interruption notice. Guests read "
        "the same from the metadata endpoint (EC2's rebalance recommendation)."
    )
    at_risk_since = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="When a proposed plan first named this VM as a victim (kept while later "
        "plans name it again); null when none does.",
    )
    job = serializers.CharField(
        read_only=True,
        help_text="The multi-VM job the VM belongs to (its VMs are named <job>-0, <job>-1, ... "
        "and are placed, and reclaimed, together); empty for a VM asked for on its own. List a "
        "job's VMs with ?job=<job>.",
    )

    class Meta:
        model = VirtualMachine
        fields = [
            "id",
            "instance_id",
            "name",
            "tenant",
            "pool",
            "pool_name",
            "pool_kind",
            "gpu_model",
            "role",
            "gpu_count",
            "image",
            "ssh_public_key",
            "job",
            "state",
            "stop_reason",
            "failure_reason",
            "node",
            "node_hostname",
            "gpus",
            "ip_address",
            "ssh_command",
            "waiting",
            "at_risk",
            "at_risk_since",
            "requested_at",
            "started_at",
            "stopped_at",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.ListField(child=serializers.IntegerField()))
    def get_gpus(self, vm: VirtualMachine) -> list[int]:
        return selectors.gpu_indices(vm)

    @extend_schema_field(WaitingSerializer(allow_null=True))
    def get_waiting(self, vm: VirtualMachine) -> dict | None:
        found = self.context.get("waiting")
        if found is None:
            found = waiting.waiting_for([vm])
        return found.get(vm.pk)

    @extend_schema_field(serializers.BooleanField())
    def get_at_risk(self, vm: VirtualMachine) -> bool:
        return vm.at_risk_since is not None

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_ssh_command(self, vm: VirtualMachine) -> str | None:
        return selectors.vm_ssh_command(vm) or None


# --- input shapes -----------------------------------------------------------------------------


class VmRequestSerializer(InputSerializer):
    """A VM request. Which pools a tenant may use and which GPU counts a pool's fabric allows
    are the service's rules; its reasons come back naming the field."""

    hints = {
        "state": "a new VM starts pending; change it with the stop/start commands",
        "node": "placement is decided by gpucap (operators may use the place command)",
    }

    tenant = serializers.SlugRelatedField(
        slug_field="slug",
        queryset=Tenant.objects.none(),
        required=False,
        help_text="Slug of the tenant the VM is for. Needed only when you are a member of "
        "several tenants.",
        error_messages={"does_not_exist": "no tenant {value} that you may request VMs for"},
    )
    pool = serializers.PrimaryKeyRelatedField(
        queryset=Pool.objects.none(),
        help_text="Id of a pool your tenant may use (GET /api/pools/).",
        error_messages={"does_not_exist": "no pool {pk_value} that your tenant may use"},
    )
    name = serializers.CharField(
        max_length=63,
        required=False,
        help_text="1-63 lowercase letters, digits or hyphens; unique per tenant. Required, "
        "unless you ask for a job (then leave it out: the job's VMs are named after it).",
    )
    job = serializers.CharField(
        max_length=60,
        required=False,
        help_text="Ask for a multi-VM job: 1-60 lowercase letters, digits or hyphens, not the "
        "name of a job of your tenant that still has VMs that are not stopped, failed or "
        "terminated. Its `count` VMs, each of this shape, are named <job>-0, <job>-1, ..., and "
        "are placed all or none; a capacity set reclaims them together.",
    )
    count = serializers.IntegerField(
        min_value=1,
        max_value=64,
        required=False,
        help_text="How many VMs the job has (1-64; 1 when left out). Only with `job`.",
    )
    gpu_count = serializers.IntegerField(
        help_text="PCIe pools: 1. NVSwitch pools: 1, 2, 4 or 8 (one whole NVLink partition)."
    )
    image = serializers.CharField(
        max_length=200,
        help_text="Name of an enabled image of the pool's cluster (GET /api/images/?pool=<id>), "
        "e.g. ubuntu-24.04-cuda-12.6.",
    )
    ssh_public_key = serializers.CharField(help_text="One OpenSSH public key line.")
    user_data = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text="Your own cloud-init user-data (#cloud-config, a script, ...), at most 16 KiB "
        "of UTF-8; the guest runs it after gpucap installs your SSH key. Served to the guest "
        "at /latest/user-data.",
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is None:
            return
        if is_operator(request.user):
            self.fields["tenant"].queryset = Tenant.objects.all()
            self.fields["pool"].queryset = Pool.objects.all()
        else:
            tenant_ids = tenant_ids_for(request.user)
            self.fields["tenant"].queryset = Tenant.objects.filter(pk__in=tenant_ids)
            self.fields["pool"].queryset = Pool.objects.filter(tenants__in=tenant_ids).distinct()


class VmPlaceSerializer(InputSerializer):
    node = serializers.PrimaryKeyRelatedField(queryset=Node.objects.all(), help_text="Node id.")
    gpus = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=7),
        allow_empty=False,
        help_text="Indices of the node's GPUs to give the VM: as many as its gpu_count, and on "
        "NVSwitch nodes one whole partition of the node's table.",
    )


# --- the viewset ------------------------------------------------------------------------------

_VM_NOW = "The VM as it is now; the driver acts on it shortly after."


@extend_schema_view(
    create=extend_schema(
        request=VmRequestSerializer,
        responses={201: VirtualMachineSerializer},
        description="Request a GPU VM. It starts pending and is placed when capacity is free. "
        "With `job` and `count`, request that many VMs as one job: all are created or none, "
        "and the answer is the job's first VM (<job>-0); GET /api/vms/?job=<job> lists them "
        "all.",
    ),
    destroy=extend_schema(
        request=None,
        responses={202: VirtualMachineSerializer},
        description="Terminate the VM: a VM holding GPUs is stopped first, then destroyed with "
        "its disk. Terminating a terminated VM changes nothing. " + _VM_NOW,
    ),
)
class VirtualMachineViewSet(
    ServiceWrites,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """GPU VMs: a member's own tenants' VMs; every VM for operators."""

    serializer_class = VirtualMachineSerializer
    filterset_class = VirtualMachineFilter

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return selectors.vms_with_gpus()
        return selectors.vms_visible_to(self.request.user).order_by("-created_at", "-id")

    def get_serializer(self, *args, **kwargs):
        """A page of VMs learns why its pending ones wait in one go (no query per VM)."""
        if kwargs.get("many") and args:
            args = (list(args[0]), *args[1:])
            kwargs["context"] = {
                **self.get_serializer_context(),
                "waiting": waiting.waiting_for(args[0]),
            }
        return super().get_serializer(*args, **kwargs)

    def create(self, request, *args, **kwargs):
        data = self.validated(VmRequestSerializer, request.data)
        tenant = data.pop("tenant", None) or self._only_tenant()
        tenant_change_check(request.user, tenant.pk)
        vms = jobs.rental_request(tenant=tenant, actor=request.user, **data)
        return Response(self.read(vms[0]), status=status.HTTP_201_CREATED)

    def destroy(self, request, *args, **kwargs):
        vm = services.vm_terminate(vm=self._to_change(), actor=request.user)
        return Response(self.read(vm), status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: VirtualMachineSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request, pk=None):
        """Stop a VM that holds GPUs: they are released, its disk is kept, and start asks for
        capacity again. Stopping a VM that is not running is refused (409)."""
        vm = services.vm_stop(vm=self._to_change(), actor=request.user)
        return Response(self.read(vm), status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: VirtualMachineSerializer})
    @action(detail=True, methods=["post"])
    def start(self, request, pk=None):
        """Start a stopped (or failed) VM: it goes back to pending and waits for capacity."""
        vm = services.vm_start(vm=self._to_change(), actor=request.user)
        return Response(self.read(vm), status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: VirtualMachineSerializer(many=True)})
    @action(detail=True, methods=["post"], url_path="terminate-job")
    def terminate_job(self, request, pk=None):
        """Terminate every VM of this VM's multi-VM job that is not terminated yet, each as
        DELETE does (a VM holding GPUs is stopped first). A VM in no job is refused (409).
        Answers the job's VMs as they are now."""
        vms = jobs.job_terminate(vm=self._to_change(), actor=request.user)
        fresh = self.get_queryset().filter(pk__in=[vm.pk for vm in vms]).order_by("pk")
        return Response(self.get_serializer(fresh, many=True).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=VmPlaceSerializer, responses={202: VirtualMachineSerializer})
    @action(detail=True, methods=["post"], permission_classes=[IsOperator])
    def place(self, request, pk=None):
        """Operators: give a pending VM these GPUs of a node and start provisioning it. GPUs
        another VM took first are refused (409)."""
        vm = self.get_object()
        data = self.validated(VmPlaceSerializer, request.data)
        placed = services.vm_place(
            vm=vm,
            node=data["node"],
            gpu_indices=data["gpus"],
            actor=request.user,
            message="placed by an operator through the API",
        )
        return Response(self.read(placed), status=status.HTTP_202_ACCEPTED)

    def _to_change(self) -> VirtualMachine:
        """The VM a tenant-side command acts on: its tenant's members' alone."""
        vm = self.get_object()
        tenant_change_check(self.request.user, vm.tenant_id)
        return vm

    def _only_tenant(self) -> Tenant:
        """The tenant a request that names none is for: the member's only tenant."""
        if is_operator(self.request.user):
            raise ValidationError({"tenant": ["operators must name the tenant the VM is for"]})
        tenants = list(Tenant.objects.filter(pk__in=tenant_ids_for(self.request.user)))
        if len(tenants) == 1:
            return tenants[0]
        if not tenants:
            raise ValidationError({"tenant": ["you are not a member of any tenant"]})
        slugs = ", ".join(sorted(t.slug for t in tenants))
        raise ValidationError(
            {"tenant": [f"you are a member of several tenants ({slugs}); name one"]}
        )
