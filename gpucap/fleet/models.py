"""The fleet: clusters of GPU nodes, their cards, capacity sets and ranked pools.

Integrity that the database can hold is declared here (unique and check constraints); rules
that span rows (a node joins only a set of its own cluster, GPU model and fabric; a floor fits
the set) live in ``gpucap.fleet.services``.
"""

from collections.abc import Iterable

from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.indexes import OpClass
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import CharField, F, Func, IntegerField, Q
from django.db.models.lookups import Exact

from gpucap.drivers.registry import driver_settings_problem
from gpucap.tenancy.models import Tenant

MAX_GPUS_PER_NODE = 8
# A Linux network interface name: at most 15 bytes (IFNAMSIZ - 1), no "/", ":" or whitespace.
INTERFACE_NAME = r"^[A-Za-z0-9_.-]{1,15}$"
# A node's hostname is a DNS hostname (RFC 1123): dot-separated labels of 1-63 letters, digits
# and hyphens, none starting or ending with a hyphen; at most 253 characters (max_length). It
# names the node in URLs, the driver's connection and fleet files: no "/", "..", "<" or NUL.
HOSTNAME_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME = rf"^{HOSTNAME_LABEL}(\.{HOSTNAME_LABEL})*$"
HOSTNAME_RULE = (
    "must be a DNS hostname: labels of letters, digits and hyphens (1 to 63 each, no hyphen "
    "at either end) joined by dots"
)
validate_hostname = RegexValidator(HOSTNAME, message=HOSTNAME_RULE)


class GuestSubnetCidr(Func):
    """A node's guest subnet as PostgreSQL's ``cidr`` (NULL when blank), so the database can
    compare subnets with ``&&`` (overlaps)."""

    template = "(NULLIF(%(expressions)s, '')::cidr)"
    output_field = CharField()


# A catalogue image's name (also a plain file name, as the libvirt driver needs) and a login
# user name as Linux accepts it.
IMAGE_NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$"
LOGIN_USER_PATTERN = r"^[a-z_][a-z0-9_-]{0,31}$"


class Fabric(models.TextChoices):
    PCIE = "pcie", "PCIe"
    NVSWITCH = "nvswitch", "NVSwitch"


class Cluster(models.Model):
    """Nodes under one VM driver (one libvirt/KubeVirt control domain)."""

    class Driver(models.TextChoices):
        SIMULATED = "simulated", "Simulated"
        LIBVIRT = "libvirt", "libvirt"

    name = models.SlugField(max_length=64, unique=True)
    driver = models.CharField(max_length=32, choices=Driver.choices, default=Driver.SIMULATED)
    driver_settings = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(driver__in=["simulated", "libvirt"]), name="cluster_driver_valid"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """The settings are the driver's: every write of a cluster checks them here."""
        if self.driver in self.Driver.values:
            problem = driver_settings_problem(self.driver, self.driver_settings)
            if problem:
                raise ValidationError({"driver_settings": problem})

    @property
    def passes_gpus(self) -> bool:
        """False for a rig whose VMs get no GPUs: the simulated driver, or a libvirt cluster
        set to ``gpu_passthrough: false`` (CI, a lab). Never true of production capacity."""
        if self.driver == self.Driver.SIMULATED:
            return False
        return (self.driver_settings or {}).get("gpu_passthrough", True) is not False


class CapacitySet(models.Model):
    """Nodes of one cluster with one GPU model and one fabric: the arbiter's unit."""

    class Mode(models.TextChoices):
        DRY_RUN = "dry_run", "Dry-run"
        ENFORCE = "enforce", "Enforce"

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="capacity_sets")
    name = models.SlugField(max_length=64, unique=True)
    gpu_model = models.CharField(max_length=64)
    fabric = models.CharField(max_length=16, choices=Fabric.choices)
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.DRY_RUN)
    notice_seconds = models.PositiveIntegerField(default=120)
    generation = models.BigIntegerField(
        default=0, help_text="Bumped by every change that could alter a plan for this set."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(fabric__in=["pcie", "nvswitch"]), name="capacityset_fabric_valid"
            ),
            models.CheckConstraint(
                condition=Q(mode__in=["dry_run", "enforce"]), name="capacityset_mode_valid"
            ),
            models.CheckConstraint(
                condition=Q(notice_seconds__gte=1) & Q(notice_seconds__lte=86400),
                name="capacityset_notice_seconds_range",
            ),
            models.CheckConstraint(
                condition=Q(generation__gte=0), name="capacityset_generation_nonnegative"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Node(models.Model):
    """One GPU server."""

    class State(models.TextChoices):
        READY = "ready", "Ready"
        CORDONED = "cordoned", "Cordoned"
        DRAINING = "draining", "Draining"
        DOWN = "down", "Down"

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="nodes")
    capacity_set = models.ForeignKey(
        CapacitySet, null=True, blank=True, on_delete=models.PROTECT, related_name="nodes"
    )
    hostname = models.CharField(max_length=253, validators=[validate_hostname])
    gpu_model = models.CharField(max_length=64)
    fabric = models.CharField(max_length=16, choices=Fabric.choices)
    gpu_count = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.READY)
    partitions = models.JSONField(
        null=True,
        blank=True,
        help_text="NVSwitch partition table as Fabric Manager lists it, in GPU indices. "
        "Empty means the default table for the node's GPU count.",
    )
    # The Fabric Manager partition id of each partition of ``partitions``, in the same order
    # (null where Fabric Manager's id is not known), as ``fabric_partitions_import`` stores it
    # from the node's ``nv-partitioner -o 0`` listing. A list beside the table rather than a
    # model of its own: ``partitions`` stays the one table the arbiter reads, the driver task
    # finds a VM's id on the node row it loads anyway, and the database checks both lists
    # line up.
    fabric_partition_ids = models.JSONField(
        null=True,
        blank=True,
        help_text="Fabric Manager's partition id for each partition of the table, in the same "
        "order (null: not imported). Activated before a VM on its GPUs starts.",
    )
    bmc_address = models.CharField(max_length=253, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    guest_bridge = models.CharField(
        max_length=15,
        blank=True,
        help_text="The node's Linux bridge its guests' interfaces join, e.g. gpubr0.",
    )
    guest_subnet = models.CharField(
        max_length=18,
        blank=True,
        help_text="IPv4 subnet gpucap gives the node's guests addresses from, e.g. "
        "10.200.0.0/24; its first address is the bridge's own (the gateway). Blank: the "
        "node's driver gives guests addresses itself. No two nodes' subnets overlap.",
    )
    # Only this tenant's VMs are placed here, whatever their pool, and the node is no free
    # capacity for anyone else (gpucap.notices.dedications). PROTECT: deleting a tenant that
    # holds whole machines must not silently hand them back to the shared pool; an operator
    # releases them first, with an audit event.
    dedicated_tenant = models.ForeignKey(
        Tenant,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="dedicated_nodes",
        help_text="The tenant the whole node is dedicated to; empty: shared.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster__name", "hostname"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "hostname"], name="node_hostname_unique"),
            models.CheckConstraint(condition=Q(hostname__regex=HOSTNAME), name="node_hostname_dns"),
            models.CheckConstraint(
                condition=Q(gpu_count__gte=1) & Q(gpu_count__lte=MAX_GPUS_PER_NODE),
                name="node_gpu_count_range",
            ),
            models.CheckConstraint(
                condition=Q(state__in=["ready", "cordoned", "draining", "down"]),
                name="node_state_valid",
            ),
            models.CheckConstraint(
                condition=Q(fabric__in=["pcie", "nvswitch"]), name="node_fabric_valid"
            ),
            models.CheckConstraint(
                condition=Q(partitions__isnull=True) | Q(fabric="nvswitch"),
                name="node_partitions_only_on_nvswitch",
            ),
            models.CheckConstraint(
                condition=Q(fabric_partition_ids__isnull=True)
                | Q(partitions__isnull=False)
                & Q(
                    Exact(
                        Func(
                            F("fabric_partition_ids"),
                            function="jsonb_array_length",
                            output_field=IntegerField(),
                        ),
                        Func(
                            F("partitions"),
                            function="jsonb_array_length",
                            output_field=IntegerField(),
                        ),
                    )
                ),
                name="node_fabric_partition_ids_match_partitions",
            ),
            models.CheckConstraint(
                condition=Q(guest_bridge="")
                | (Q(guest_bridge__regex=INTERFACE_NAME) & ~Q(guest_bridge__in=[".", ".."])),
                name="node_guest_bridge_interface_name",
            ),
            # Guests on a subnet reach the node (and the metadata proxy) through its bridge.
            models.CheckConstraint(
                condition=Q(guest_subnet="") | ~Q(guest_bridge=""),
                name="node_guest_subnet_needs_bridge",
            ),
            # The metadata endpoint tells guests apart by address across the whole fleet.
            ExclusionConstraint(
                name="node_guest_subnets_disjoint",
                index_type="gist",
                expressions=[(OpClass(GuestSubnetCidr("guest_subnet"), name="inet_ops"), "&&")],
                condition=~Q(guest_subnet=""),
            ),
        ]

    def __str__(self) -> str:
        return self.hostname

    def fabric_partition_id(self, gpus: Iterable[int]) -> int | None:
        """Fabric Manager's id for the partition made of exactly these GPU indices, or None (no
        ids imported, or no such partition in the node's own table)."""
        if not self.partitions or not self.fabric_partition_ids:
            return None
        wanted = sorted(gpus)
        for block, partition_id in zip(self.partitions, self.fabric_partition_ids, strict=True):
            if sorted(block) == wanted:
                return partition_id
        return None


class Gpu(models.Model):
    """One card of a node."""

    class Health(models.TextChoices):
        OK = "ok", "OK"
        FAILED = "failed", "Failed"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64, unique=True)
    pci_address = models.CharField(max_length=16)
    module_id = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        help_text="Fabric Manager's module (physical) id of the card, 1..8 on an HGX baseboard; "
        "how a partition listing names it.",
    )
    health = models.CharField(max_length=16, choices=Health.choices, default=Health.OK)

    class Meta:
        ordering = ["node_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_node_index_unique"),
            models.UniqueConstraint(fields=["node", "pci_address"], name="gpu_node_pci_unique"),
            # NULLs are distinct: only the module ids that are set must differ on a node.
            models.UniqueConstraint(fields=["node", "module_id"], name="gpu_node_module_unique"),
            models.CheckConstraint(
                condition=Q(module_id__isnull=True)
                | Q(module_id__gte=1) & Q(module_id__lte=MAX_GPUS_PER_NODE),
                name="gpu_module_id_range",
            ),
            models.CheckConstraint(
                condition=Q(index__lt=MAX_GPUS_PER_NODE), name="gpu_index_range"
            ),
            models.CheckConstraint(
                condition=Q(health__in=["ok", "failed"]), name="gpu_health_valid"
            ),
            models.CheckConstraint(
                condition=Q(pci_address__regex=r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$"),
                name="gpu_pci_address_format",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node.hostname}/gpu{self.index}"


class Pool(models.Model):
    """A ranked consumer of capacity, in a capacity set or standalone on its cluster."""

    class Kind(models.TextChoices):
        ON_DEMAND = "on_demand", "On-demand"
        SPOT = "spot", "Spot"
        INFERENCE = "inference", "Inference"

    name = models.SlugField(max_length=64, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="pools")
    capacity_set = models.ForeignKey(
        CapacitySet, null=True, blank=True, on_delete=models.PROTECT, related_name="pools"
    )
    gpu_model = models.CharField(
        max_length=64,
        help_text="The GPUs this pool rents: its set's model, or for a standalone "
        "pool the model of the cluster's standalone nodes it places on.",
    )
    fabric = models.CharField(max_length=16, choices=Fabric.choices)
    rank = models.PositiveIntegerField(help_text="1 is the highest priority.")
    floor_gpus = models.PositiveIntegerField(
        default=0, help_text="GPUs the arbiter never reclaims this pool below."
    )
    notice_seconds = models.PositiveIntegerField(
        default=120,
        help_text="Warning a standalone pool's VMs get before a drain or reclaim stops them. "
        "Inside a capacity set the set's notice_seconds applies.",
    )
    protect_seconds = models.PositiveIntegerField(
        default=0,
        help_text="For this long after a VM of the pool starts or resumes, the arbiter does not "
        "reclaim it while any other plan serves the demand (0: off; at most 7 days).",
    )
    tenants = models.ManyToManyField(
        Tenant, blank=True, related_name="pools", help_text="Tenants that may use this pool."
    )
    # What the set's schedule or an override puts in force instead of rank and floor_gpus,
    # written at each boundary by gpucap/schedules/services.py (None: the pool's own value).
    scheduled_rank = models.PositiveIntegerField(null=True, blank=True, editable=False)
    scheduled_floor_gpus = models.PositiveIntegerField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["cluster__name", "capacity_set__name", "rank"]
        constraints = [
            # NULL sets are distinct, so this binds only pools inside a set.
            models.UniqueConstraint(
                fields=["capacity_set", "rank"], name="pool_rank_unique_in_set"
            ),
            models.UniqueConstraint(
                fields=["cluster", "rank"],
                condition=Q(capacity_set__isnull=True),
                name="pool_rank_unique_standalone",
            ),
            models.CheckConstraint(condition=Q(rank__gte=1), name="pool_rank_positive"),
            models.CheckConstraint(condition=Q(floor_gpus__gte=0), name="pool_floor_nonnegative"),
            models.CheckConstraint(
                condition=Q(protect_seconds__lte=604800), name="pool_protect_seconds_range"
            ),
            models.CheckConstraint(
                condition=Q(kind__in=["on_demand", "spot", "inference"]), name="pool_kind_valid"
            ),
            models.CheckConstraint(
                condition=Q(fabric__in=["pcie", "nvswitch"]), name="pool_fabric_valid"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def rank_in_force(self) -> int:
        """The rank the arbiter uses now: the schedule's, else the pool's own."""
        return self.rank if self.scheduled_rank is None else self.scheduled_rank

    @property
    def floor_in_force(self) -> int:
        """The floor the arbiter keeps now: the schedule's, else the pool's own."""
        return self.floor_gpus if self.scheduled_floor_gpus is None else self.scheduled_floor_gpus


class Image(models.Model):
    """A guest image of the operator's catalogue, offered on one cluster: tenants pick one by
    name when they ask for a VM, and each VM disk is a qcow2 overlay on its base image."""

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="images")
    name = models.CharField(
        max_length=64,
        help_text="What tenants choose, e.g. ubuntu-24.04-cuda-12.6: lowercase letters, digits, "
        "'.', '_' and '-', starting and ending with a letter or digit.",
    )
    base_image = models.CharField(
        max_length=500,
        help_text="The base image on the cluster's nodes: an absolute path or a storage volume "
        "name.",
    )
    node_paths = models.JSONField(
        default=dict,
        blank=True,
        help_text="Per-node overrides of base_image: {hostname: path or volume name}.",
    )
    default_user = models.CharField(
        max_length=32, default="root", help_text="The user the tenant logs in as, e.g. ubuntu."
    )
    ports = models.JSONField(
        default=list,
        blank=True,
        help_text="TCP ports a replica image serves; the first is the OpenAI-compatible endpoint.",
    )
    health_path = models.CharField(
        max_length=200,
        default="/v1/models",
        help_text="What the router's readiness probe asks a replica for.",
    )
    description = models.TextField(blank=True)
    enabled = models.BooleanField(
        default=True, help_text="Offered to tenants; a disabled image keeps the VMs it has."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="image_name_unique"),
            models.CheckConstraint(
                condition=Q(name__regex=IMAGE_NAME_PATTERN), name="image_name_format"
            ),
            models.CheckConstraint(condition=~Q(base_image=""), name="image_base_image_given"),
            models.CheckConstraint(
                condition=Q(default_user__regex=LOGIN_USER_PATTERN),
                name="image_default_user_format",
            ),
            models.CheckConstraint(
                condition=Q(health_path__startswith="/"), name="image_health_path_absolute"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def base_for(self, hostname: str) -> str:
        """The base image on one node: its override, else the cluster-wide one."""
        return self.node_paths.get(hostname) or self.base_image
