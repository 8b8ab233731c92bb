"""Tenants' GPU VMs, the GPUs they hold and the addresses their guests use.

A GPU is held by at most one live allocation: a partial unique index in PostgreSQL, so two
workers placing at once can never both win a card, whatever the code does.

A VM placed on a node with a guest subnet also holds a ``GuestAddress``: an address of that
subnet and a MAC, from placement until it lets go of its GPUs. It is a row of its own, like
``Allocation``, rather than fields of the VM, because "live" must be a fact the database can
index (``released_at`` is NULL) for the two partial unique indexes that keep an address and a
MAC to one live holder across the fleet (the metadata endpoint tells guests apart by address),
and because the rows left behind say which VM had which address when — what an operator needs
to answer an abuse report about an address. The VM's ``ip_address`` is set from it at
placement, so the metadata endpoint knows the guest while it boots.
"""

from django.conf import settings
from django.db import models
from django.db.models import Q

from gpucap.fleet.models import Gpu, Node, Pool
from gpucap.tenancy.models import Tenant


class VirtualMachine(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        PROVISIONING = "provisioning", "Provisioning"
        RUNNING = "running", "Running"
        NOTIFIED = "notified", "Notified"
        STOPPING = "stopping", "Stopping"
        STOPPED = "stopped", "Stopped"
        FAILED = "failed", "Failed"
        TERMINATED = "terminated", "Terminated"

    class Role(models.TextChoices):
        RENTAL = "rental", "Rental"
        INFERENCE_REPLICA = "inference_replica", "Inference replica"

    class StopReason(models.TextChoices):
        OWNER = "owner", "Stopped by its owner"  # -> stopped; the owner may start it again
        TERMINATE = "terminate", "Terminated by its owner"  # -> destroyed, terminated
        PREEMPTED = "preempted", "Preempted"  # spot -> pending (resumes when capacity returns)
        RECLAIMED = "reclaimed", "Reclaimed after a notice"  # spot -> pending; else stopped

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="vms")
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="vms")
    name = models.CharField(max_length=63)
    role = models.CharField(max_length=32, choices=Role.choices, default=Role.RENTAL)
    gpu_count = models.PositiveSmallIntegerField()
    image = models.CharField(max_length=200)
    ssh_public_key = models.TextField()
    user_data = models.TextField(
        blank=True,
        help_text="The tenant's own cloud-init user-data, given to the guest after gpucap's "
        "(at most 16 KiB).",
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    node = models.ForeignKey(
        Node,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="vms",
        help_text="Where the VM holds (or last held) its GPUs.",
    )
    ip_address = models.GenericIPAddressField(null=True, blank=True)
    deployment = models.ForeignKey(
        "inference.InferenceDeployment",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="replicas",
        help_text="Inference replicas: the deployment the VM serves.",
    )
    endpoint_url = models.URLField(
        blank=True, help_text="Inference replicas: where the model server listens (the driver)."
    )
    demand_group = models.CharField(
        max_length=128,
        blank=True,
        help_text="VMs asked for together (an inference scale-up step, or a tenant's multi-VM "
        "job as '<tenant slug>/<job>'): placed all or none.",
    )
    job = models.CharField(
        max_length=60,
        blank=True,
        help_text="The multi-VM job the VM belongs to (its VMs are named <job>-0, <job>-1, ...); "
        "empty for a VM asked for on its own.",
    )
    stop_reason = models.CharField(
        max_length=16,
        choices=StopReason.choices,
        blank=True,
        help_text="Why the VM is stopping; decides where it goes once stopped.",
    )
    preempted_for = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="victims",
        help_text="The VM whose placement this VM is being stopped for: its GPUs are reserved "
        "for that VM, and that VM gets no further victims while this one stops.",
    )
    reservation = models.ForeignKey(
        "allocation.Reservation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="vms",
        help_text="Placed inside its tenant's reservation (set from the plan's placement).",
    )
    borrowed_from = models.ForeignKey(
        "allocation.Reservation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="borrowers",
        help_text="Borrows capacity kept for this reservation: reclaimed first when its tenant "
        "claims it (set and cleared after each plan).",
    )
    failure_reason = models.TextField(blank=True)
    at_risk_since = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the capacity set's proposed plan (dry-run, or awaiting approval) first "
        "named this VM as a victim, kept while later plans name it again; null when no "
        "proposed plan names it. Kept by gpucap.plans.at_risk.",
    )
    requested_at = models.DateTimeField(
        help_text="When the VM (last) asked for capacity: its place in the queue."
    )
    started_at = models.DateTimeField(null=True, blank=True, help_text="Running since.")
    stopped_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["state", "pool", "requested_at"]),
            models.Index(fields=["tenant", "state"]),
            models.Index(fields=["tenant", "job"], condition=~Q(job=""), name="vm_job"),
            models.Index(
                fields=["at_risk_since"],
                condition=Q(at_risk_since__isnull=False),
                name="vm_at_risk",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(
                    state__in=[
                        "pending",
                        "provisioning",
                        "running",
                        "notified",
                        "stopping",
                        "stopped",
                        "failed",
                        "terminated",
                    ]
                ),
                name="vm_state_valid",
            ),
            models.CheckConstraint(
                condition=Q(role__in=["rental", "inference_replica"]), name="vm_role_valid"
            ),
            models.CheckConstraint(
                condition=Q(gpu_count__gte=1) & Q(gpu_count__lte=8), name="vm_gpu_count_range"
            ),
            models.CheckConstraint(
                condition=Q(role="rental", deployment__isnull=True)
                | Q(role="inference_replica", deployment__isnull=False),
                name="vm_replica_has_deployment",
            ),
            # A VM that holds GPUs is on a node.
            models.CheckConstraint(
                condition=~Q(state__in=["provisioning", "running", "notified", "stopping"])
                | Q(node__isnull=False),
                name="vm_holding_gpus_has_node",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.instance_id} ({self.name})"

    @property
    def instance_id(self) -> str:
        """The id guests and APIs show, e.g. ``vm-42``."""
        return f"vm-{self.pk}"

    @property
    def disk_node_id(self) -> int | None:
        """The node that keeps this VM's disk while it waits to run again (a reclaimed spot VM
        back in ``pending``, a VM its owner stopped): the node it last ran on, unless it failed
        or lost its host there (``failure_reason`` says which, until it is placed again)."""
        if self.state not in (self.State.PENDING, self.State.STOPPED) or self.failure_reason:
            return None
        return self.node_id


class Allocation(models.Model):
    """A VM holding one GPU, from ``created_at`` until ``released_at``."""

    vm = models.ForeignKey(VirtualMachine, on_delete=models.CASCADE, related_name="allocations")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="allocations")
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["gpu__node_id", "gpu__index"]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu"],
                condition=Q(released_at__isnull=True),
                name="allocation_one_live_holder_per_gpu",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.vm} holds {self.gpu}"


class GuestAddress(models.Model):
    """A VM's address and MAC from its node's guest subnet, from placement until
    ``released_at`` (when the VM lets go of its GPUs)."""

    vm = models.ForeignKey(VirtualMachine, on_delete=models.CASCADE, related_name="guest_addresses")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="guest_addresses")
    address = models.GenericIPAddressField(protocol="IPv4")
    mac = models.CharField(max_length=17)
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["node_id", "address"]
        constraints = [
            models.UniqueConstraint(
                fields=["address"],
                condition=Q(released_at__isnull=True),
                name="guestaddress_one_live_holder_per_address",
            ),
            models.UniqueConstraint(
                fields=["mac"],
                condition=Q(released_at__isnull=True),
                name="guestaddress_one_live_holder_per_mac",
            ),
            models.UniqueConstraint(
                fields=["vm"],
                condition=Q(released_at__isnull=True),
                name="guestaddress_one_live_address_per_vm",
            ),
            # Lower-case, and locally administered unicast (second hex digit 2, 6, a or e):
            # never a vendor's address.
            models.CheckConstraint(
                condition=Q(mac__regex=r"^[0-9a-f][26ae](:[0-9a-f]{2}){5}$"),
                name="guestaddress_mac_local_unicast",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.vm} at {self.address}"
