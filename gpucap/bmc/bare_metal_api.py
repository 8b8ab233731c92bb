"""REST API for whole machines rented to tenants (docs/bmc.md, "Whole machines for tenants").

- ``/api/bare-metal/``: rentals. A tenant member lists and reads its own tenants' (another
  tenant's id is a 404, as if it did not exist); operators every one. ``POST`` (operators)
  rents a node dedicated to a tenant to it (``node``, ``tenant``, optional ``image``);
  ``POST .../<id>/reclaim/`` (operators) and ``POST .../<id>/end/`` (the tenant's members)
  end it; ``POST .../<id>/power/`` ``{"action": "on"|"off"|"reset"}`` and
  ``POST .../<id>/reimage/`` ``{"image": <id or name>}`` are the tenant's members' (202: a task
  acts on it next).
- ``/api/bare-metal-images/``: the catalogue. Operators see and change every image; a tenant
  member sees the enabled images of the clusters where it rents machines (without their URLs).

No answer names the BMC's address, user or password: a tenant reads what happened in its own
words, the BMC's error is the operators' (``bmc_error``).
"""

from django.core.exceptions import ValidationError
from drf_spectacular.utils import (
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from gpucap.api.base import InputSerializer, ServiceWrites, choice_field
from gpucap.api.filters import BooleanFilter, FilterSet, IdFilter
from gpucap.api.permissions import IsOperator, IsOperatorOrReadOnly
from gpucap.bmc import bare_metal, bare_metal_images, bare_metal_power
from gpucap.bmc.bare_metal_selectors import rentals_visible_to, with_power, with_reimage
from gpucap.bmc.models import BareMetalImage, BareMetalPowerAction, BareMetalRental
from gpucap.fleet.models import Cluster, Node
from gpucap.roles import is_operator, tenant_change_check, tenant_ids_for
from gpucap.tenancy.models import Tenant

# --- read ---------------------------------------------------------------------------------------


class PowerActionSerializer(serializers.ModelSerializer):
    class Meta:
        model = BareMetalPowerAction
        fields = ["id", "action", "state", "message", "requested_at", "sent_at", "finished_at"]
        read_only_fields = fields


class OperatorPowerActionSerializer(PowerActionSerializer):
    class Meta(PowerActionSerializer.Meta):
        fields = [*PowerActionSerializer.Meta.fields, "bmc_error"]
        read_only_fields = fields


class ReimageProgressSerializer(serializers.Serializer):
    state = serializers.CharField(
        help_text="inserting (the image into the machine's virtual drive), booting (the machine "
        "reset to boot from it), waiting (installing: the image stays in the drive until "
        "`deadline`), done or failed.",
    )
    words = serializers.CharField(help_text="Where it is, or how it ended, in words.")
    image = serializers.CharField(help_text="The catalogue image's name.")
    started_at = serializers.DateTimeField()
    inserted_at = serializers.DateTimeField(allow_null=True)
    reset_at = serializers.DateTimeField(allow_null=True)
    deadline = serializers.DateTimeField(help_text="Until when the image stays in the drive.")
    finished_at = serializers.DateTimeField(allow_null=True)


class ImageRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()


class BareMetalRentalSerializer(serializers.ModelSerializer):
    """A rental as its tenant sees it: the machine, its power, its last power action."""

    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    hostname = serializers.CharField(source="node.hostname", read_only=True)
    cluster_name = serializers.CharField(source="node.cluster.name", read_only=True)
    gpu_model = serializers.CharField(source="node.gpu_model", read_only=True)
    gpu_count = serializers.IntegerField(source="node.gpu_count", read_only=True)
    image = ImageRefSerializer(
        read_only=True,
        allow_null=True,
        help_text="The catalogue image last installed through gpucap; null: as handed over.",
    )
    active = serializers.BooleanField(read_only=True, help_text="Not ended yet.")
    power_state = serializers.CharField(
        read_only=True,
        help_text="on, off, poweringon or poweringoff, as the machine's BMC last said; empty: "
        "not read yet.",
    )
    power_action = serializers.SerializerMethodField(
        help_text="The newest power action (on, off or reset) and how far it got: queued, "
        "sending, sent (accepted; waiting for the power to follow), done or failed, with what "
        "happened in `message`. Null: none yet."
    )
    reimage = serializers.SerializerMethodField(
        help_text="The latest re-image from the catalogue and how far it got; null: none yet."
    )
    power_action_serializer = PowerActionSerializer

    class Meta:
        model = BareMetalRental
        fields = [
            "id",
            "tenant",
            "hostname",
            "cluster_name",
            "gpu_model",
            "gpu_count",
            "image",
            "active",
            "started_at",
            "ended_at",
            "power_state",
            "power_read_at",
            "power_action",
            "reimage",
        ]
        read_only_fields = fields

    @extend_schema_field(ReimageProgressSerializer(allow_null=True))
    def get_reimage(self, rental: BareMetalRental) -> dict | None:
        reimage = getattr(rental, "reimage", None)
        return None if reimage is None else ReimageProgressSerializer(reimage).data

    @extend_schema_field(PowerActionSerializer(allow_null=True))
    def get_power_action(self, rental: BareMetalRental) -> dict | None:
        power = getattr(rental, "last_power", None)
        return None if power is None else self.power_action_serializer(power).data


class OperatorRentalSerializer(BareMetalRentalSerializer):
    """A rental as operators see it: with the node's id, who started and ended it, and the
    BMC's own words when a power action failed."""

    started_by = serializers.SlugRelatedField(
        slug_field="username",
        read_only=True,
        allow_null=True,
        help_text="The operator who rented it out; null: the system or a deleted user.",
    )
    ended_by = serializers.SlugRelatedField(
        slug_field="username",
        read_only=True,
        allow_null=True,
        help_text="Who ended it (an operator or the tenant's member); null while it lasts.",
    )
    power_action_serializer = OperatorPowerActionSerializer

    class Meta(BareMetalRentalSerializer.Meta):
        fields = [*BareMetalRentalSerializer.Meta.fields, "node", "started_by", "ended_by"]
        read_only_fields = fields

    @extend_schema_field(OperatorPowerActionSerializer(allow_null=True))
    def get_power_action(self, rental: BareMetalRental) -> dict | None:
        return super().get_power_action(rental)


def _as_seen(name: str, shapes: list, *, many: bool = False) -> PolymorphicProxySerializer:
    """For the schema: what operators get, or what a tenant member gets."""
    return PolymorphicProxySerializer(
        component_name=name, serializers=shapes, resource_type_field_name=None, many=many
    )


RENTAL_SHAPES = [OperatorRentalSerializer, BareMetalRentalSerializer]


# --- input shapes -------------------------------------------------------------------------------


@extend_schema_field(
    {
        "oneOf": [{"type": "integer", "minimum": 1}, {"type": "string", "maxLength": 64}],
        "description": "A bare-metal image of the machine's cluster: its id, or its name.",
    }
)
class ImageChoiceField(serializers.Field):
    """An image by id (a whole number) or by name; which one it is, on which cluster, is the
    view's to resolve (``_image_of``)."""

    default_error_messages = {"invalid": "must be an image's id (a whole number) or its name"}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (int, str)):
            self.fail("invalid")
        if isinstance(data, str) and not 1 <= len(data) <= 64:
            self.fail("invalid")
        return data


class RentSerializer(InputSerializer):
    node = serializers.PrimaryKeyRelatedField(
        queryset=Node.objects.all(),
        help_text="Id of a node dedicated to the tenant, with no VM holding its GPUs.",
        error_messages={"does_not_exist": "no node has id {pk_value}"},
    )
    tenant = serializers.SlugRelatedField(
        slug_field="slug",
        queryset=Tenant.objects.all(),
        help_text="Slug of the tenant the node is dedicated to.",
        error_messages={"does_not_exist": "no tenant {value}"},
    )
    image = ImageChoiceField(
        required=False,
        allow_null=True,
        help_text="What the machine is handed over with, from its cluster's catalogue (id or "
        "name); leave it out when it is not one of them.",
    )


class PowerSerializer(InputSerializer):
    action = choice_field(
        BareMetalPowerAction.Action.choices,
        help_text="on, off (a hard power off) or reset (a hard restart).",
    )


class ReimageSerializer(InputSerializer):
    image = ImageChoiceField(
        help_text="An enabled image of the machine's cluster's catalogue (GET "
        "/api/bare-metal-images/): its id or its name."
    )


class RentalFilter(FilterSet):
    active = BooleanFilter(field_name="ended_at", lookup_expr="isnull", label="Not ended yet")
    tenant = IdFilter(field_name="tenant_id", label="Tenant id")
    node = IdFilter(field_name="node_id", label="Node id")

    class Meta:
        model = BareMetalRental
        fields: list[str] = []


# --- rentals ------------------------------------------------------------------------------------


@extend_schema_view(
    list=extend_schema(responses=_as_seen("BareMetalRentalAsSeen", RENTAL_SHAPES, many=True)),
    retrieve=extend_schema(responses=_as_seen("BareMetalRentalAsSeen", RENTAL_SHAPES)),
    create=extend_schema(
        request=RentSerializer,
        responses={201: OperatorRentalSerializer},
        description="Operators: rent a node whole to the tenant it is dedicated to. The node is "
        "cordoned (it takes no VMs) and stays dedicated until the rental ends; usage counts "
        "all its GPUs from now. A node not dedicated to the tenant, rented already, not ready "
        "or cordoned, or with VMs holding its GPUs is a 409 naming why.",
    ),
)
class BareMetalRentalViewSet(
    ServiceWrites, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Whole machines rented to tenants: a member's own tenants'; every one for operators.
    Operators rent (create) and reclaim; the tenant's members switch the power and end it."""

    permission_classes = [IsOperatorOrReadOnly]
    serializer_class = BareMetalRentalSerializer
    filterset_class = RentalFilter

    def get_queryset(self):
        return rentals_visible_to(self.request.user).order_by("-started_at", "-id")

    def get_serializer_class(self):
        if getattr(self, "swagger_fake_view", False):
            return BareMetalRentalSerializer
        if is_operator(self.request.user):
            return OperatorRentalSerializer
        return BareMetalRentalSerializer

    def get_serializer(self, *args, **kwargs):
        """Every rental shown carries its newest power action (one query for a page)."""
        if args and kwargs.get("many"):
            args = (with_reimage(with_power(args[0])), *args[1:])
        elif args and isinstance(args[0], BareMetalRental):
            with_reimage(with_power([args[0]]))
        return super().get_serializer(*args, **kwargs)

    def create(self, request, *args, **kwargs):
        data = self.validated(RentSerializer, request.data)
        node = data["node"]
        image = _image_of(data.get("image"), node=node) if data.get("image") is not None else None
        rental = bare_metal.bare_metal_rent(
            node=node, tenant=data["tenant"], image=image, actor=request.user
        )
        return Response(self.read(rental), status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=BareMetalRentalSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated])
    def end(self, request, pk=None):
        """The tenant's members: end the rental now and give the machine back; usage stops
        counting its GPUs. An ended rental is a 409."""
        rental = self._to_change()
        bare_metal.bare_metal_end(rental=rental, actor=request.user)
        return Response(self.read(rental))

    @extend_schema(request=None, responses=OperatorRentalSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsOperator])
    def reclaim(self, request, pk=None):
        """Operators: end the rental now and take the machine back; usage stops counting its
        GPUs. The node stays cordoned and dedicated until an operator puts it back into
        service (it runs what the tenant installed). An ended rental is a 409."""
        rental = self.get_object()
        bare_metal.bare_metal_end(rental=rental, actor=request.user)
        return Response(self.read(rental))

    @extend_schema(request=PowerSerializer, responses={202: BareMetalRentalSerializer})
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated])
    def power(self, request, pk=None):
        """The tenant's members: power the machine on, off (hard) or reset it (hard restart),
        through gpucap; `power_action` says how far it got. Another action still under way, or
        an ended rental, is a 409. Answers the rental as it is now; a task acts on the machine
        next."""
        rental = self._to_change()
        data = self.validated(PowerSerializer, request.data)
        bare_metal_power.bare_metal_power(rental=rental, action=data["action"], actor=request.user)
        return Response(self.read(rental), status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=ReimageSerializer, responses={202: BareMetalRentalSerializer})
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated])
    def reimage(self, request, pk=None):
        """The tenant's members: boot the machine from an image of its cluster's catalogue (its
        id or name), by virtual media: the image is inserted, the machine reset to boot from it
        once, and the image stays in the drive for its installer until `reimage.deadline`. What
        runs there is stopped. An image not in the catalogue, of another cluster or disabled is
        a 400 naming `image`; an ended rental, or a power action or re-image under way, a 409.
        Answers the rental as it is now; a task acts on the machine next."""
        rental = self._to_change()
        data = self.validated(ReimageSerializer, request.data)
        image = _image_of(data["image"], node=rental.node)
        bare_metal.bare_metal_reimage(rental=rental, image=image, actor=request.user)
        return Response(self.read(rental), status=status.HTTP_202_ACCEPTED)

    def _to_change(self) -> BareMetalRental:
        """The rental a tenant-side command acts on: its tenant's members' alone."""
        rental = self.get_object()
        tenant_change_check(self.request.user, rental.tenant_id)
        return rental

    def read(self, instance) -> dict:
        return self.get_serializer(self.get_queryset().get(pk=instance.pk)).data


def _image_of(value: int | str, *, node: Node) -> BareMetalImage:
    """The image ``value`` names (an id or a name) in the catalogue of ``node``'s cluster, or a
    400 naming ``image``."""
    images = BareMetalImage.objects.filter(cluster_id=node.cluster_id).select_related("cluster")
    found = images.filter(**{"pk" if isinstance(value, int) else "name": value}).first()
    if found is None:
        raise ValidationError(
            {"image": f"no bare-metal image {value!r} in the catalogue of cluster {node.cluster}"}
        )
    if problem := bare_metal.image_problem(found, node=node):
        raise ValidationError({"image": problem})
    return found


# --- the catalogue ------------------------------------------------------------------------------


class BareMetalImageSerializer(serializers.ModelSerializer):
    """A catalogue image as operators see it."""

    cluster_name = serializers.CharField(source="cluster.name", read_only=True)

    class Meta:
        model = BareMetalImage
        fields = [
            "id",
            "cluster",
            "cluster_name",
            "name",
            "image_url",
            "description",
            "enabled",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class TenantBareMetalImageSerializer(BareMetalImageSerializer):
    """An image as a tenant member sees it: what to choose, not where it is served from."""

    class Meta(BareMetalImageSerializer.Meta):
        fields = ["id", "cluster", "cluster_name", "name", "description", "enabled"]
        read_only_fields = fields


class _ImageFields(InputSerializer):
    image_url = serializers.CharField(
        max_length=500, help_text="The http(s) URL of the installer or OS image (an ISO)."
    )
    description = serializers.CharField(required=False, allow_blank=True, max_length=2000)
    enabled = serializers.BooleanField(required=False, help_text="Offered to tenants.")


class BareMetalImageCreateSerializer(_ImageFields):
    cluster = serializers.PrimaryKeyRelatedField(
        queryset=Cluster.objects.all(), error_messages={"does_not_exist": "no cluster {pk_value}"}
    )
    name = serializers.CharField(max_length=64, help_text="What tenants choose.")


class BareMetalImageUpdateSerializer(_ImageFields):
    hints = {
        "cluster": "an image belongs to its cluster; create it on the other cluster instead",
        "name": "rentals name the image; create one with the new name instead",
    }


class BareMetalImageFilter(FilterSet):
    cluster = IdFilter(field_name="cluster_id", label="Cluster id")
    enabled = BooleanFilter(label="Offered to tenants")

    class Meta:
        model = BareMetalImage
        fields = {"name": ["exact"]}


IMAGE_SHAPES = [BareMetalImageSerializer, TenantBareMetalImageSerializer]


@extend_schema_view(
    list=extend_schema(responses=_as_seen("BareMetalImageAsSeen", IMAGE_SHAPES, many=True)),
    retrieve=extend_schema(responses=_as_seen("BareMetalImageAsSeen", IMAGE_SHAPES)),
    create=extend_schema(
        request=BareMetalImageCreateSerializer, responses={201: BareMetalImageSerializer}
    ),
    partial_update=extend_schema(
        request=BareMetalImageUpdateSerializer, responses=BareMetalImageSerializer
    ),
    destroy=extend_schema(
        description="Refused (409) while a rental names the image: disable it instead."
    ),
)
class BareMetalImageViewSet(ServiceWrites, viewsets.ModelViewSet):
    """The bare-metal catalogue. Operators see and change every image; a tenant member sees the
    enabled images of the clusters where its tenants rent machines."""

    permission_classes = [IsOperatorOrReadOnly]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    filterset_class = BareMetalImageFilter

    def get_queryset(self):
        images = BareMetalImage.objects.select_related("cluster")
        if self._sees_everything():
            return images
        rented = BareMetalRental.objects.filter(
            tenant_id__in=tenant_ids_for(self.request.user), ended_at=None
        )
        return images.filter(enabled=True, cluster_id__in=rented.values("node__cluster_id"))

    def get_serializer_class(self):
        if self._sees_everything():
            return BareMetalImageSerializer
        return TenantBareMetalImageSerializer

    def _sees_everything(self) -> bool:
        return getattr(self, "swagger_fake_view", False) or is_operator(self.request.user)

    def create(self, request, *args, **kwargs):
        data = self.validated(BareMetalImageCreateSerializer, request.data)
        image = bare_metal_images.bare_metal_image_create(actor=request.user, **data)
        return Response(self.read(image), status=status.HTTP_201_CREATED)

    def partial_update(self, request, *args, **kwargs):
        image = self.get_object()
        data = self.validated(BareMetalImageUpdateSerializer, request.data, partial=True)
        bare_metal_images.bare_metal_image_update(image=image, actor=request.user, **data)
        return Response(self.read(image))

    def perform_destroy(self, instance) -> None:
        bare_metal_images.bare_metal_image_delete(image=instance, actor=self.request.user)
